"""`--index-scoring fp8` from the command line: run, step and fixtures export take it, the run's
footer adds up how many of the exactly chosen positions it kept, and a model without an indexer
is refused in one line."""

import json
import re

from helpers.cli import stepper
from safetensors.numpy import load_file

FOOTER = re.compile(r"fp8 index scoring kept ([\d,]+) of the ([\d,]+) positions the exact scores keep "
                    r"\([\d.]+%\); ([\d,]+) of ([\d,]+) queries \(all layers and steps\) chose differently")


def test_run_says_how_many_exactly_chosen_positions_fp8_kept(tmp_path):
    dump = tmp_path / "run.safetensors"
    done = stepper("run", "--model", "tiny-v32", "--prompt-len", "30", "--decode", "2", "--index-scoring", "fp8",
                   "--plain", "--only", "*indexer.kept_of_exact", "--only", "*indexer.exact_topk_idx", "--dump",
                   str(dump))
    assert done.returncode == 0, done.stderr
    assert "chosen by FP8 index scores" in done.stdout
    kept, chosen, differing, queries = (int(g.replace(",", "")) for g in FOOTER.search(done.stdout).groups())
    tensors = load_file(dump)
    counts = [a for n, a in tensors.items() if n.endswith("kept_of_exact")]
    exact = [a for n, a in tensors.items() if n.endswith("exact_topk_idx")]
    assert kept == sum(int(a.sum()) for a in counts) and chosen == sum(int((a >= 0).sum()) for a in exact)
    assert queries == 3 * (30 + 2)  # every layer's every query
    assert differing == sum(int((c < (e >= 0).sum(-1)).sum()) for c, e in zip(counts, exact))


def test_exact_scoring_says_nothing_of_fp8():
    done = stepper("run", "--model", "tiny-v32", "--prompt-len", "6", "--plain", "--only", "*indexer*")
    assert done.returncode == 0, done.stderr
    assert "fp8" not in done.stdout.lower() and "q_rotated" not in done.stdout


def test_a_model_without_an_indexer_is_refused_in_one_line():
    done = stepper("run", "--model", "tiny", "--index-scoring", "fp8")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        ("stepper: error: --index-scoring fp8 scores the Lightning Indexer, and model tiny (kimi_k2) has none: "
         "use a model with one (tiny-v32, tiny-glm5, tiny-axk2, deepseek-v3.2, glm-5, a.x-k2)")]
    assert stepper("step", "--model", "tiny-v32", "--index-scoring", "int8").returncode == 2


def test_step_stops_at_an_fp8_tensor_and_fixtures_record_the_choice(tmp_path):
    done = stepper("step", "--model", "tiny-v32", "--prompt-len", "5", "--index-scoring", "fp8", "--plain",
                   "--until", "layers.0.self_attn.indexer.q_scale", "--commands", str(write(tmp_path / "c", "q\n")))
    assert done.returncode == 0, done.stderr
    assert "self_attn.indexer.q_scale" in done.stdout
    out = tmp_path / "fixture"
    done = stepper("fixtures", "export", str(out), "--model", "tiny-v32", "--prompt-len", "5", "--index-scoring", "fp8")
    assert done.returncode == 0, done.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["export"]["index_scoring"] == "fp8"
    assert any(n.endswith("indexer.kept_of_exact") for n in load_file(out / "tensors.safetensors"))


def write(path, text):
    path.write_text(text)
    return path


def test_the_header_counts_the_fp8_index_keys_in_the_cache_per_position():
    from stepper.presets import preset

    cfg = preset("tiny-v32")
    latent = (cfg.kv_lora_rank + cfg.qk_rope_head_dim + cfg.index_head_dim) * 4
    line = re.compile(r"latent \+ rope key \+ index key( and its FP8 codes)? ([\d,]+) B")
    for scoring, codes, size in (("exact", None, latent),
                                 ("fp8", " and its FP8 codes", latent + cfg.index_head_dim + 4)):
        done = stepper("run", "--model", "tiny-v32", "--prompt-len", "2", "--index-scoring", scoring, "--plain",
                       "--only", "embed")
        assert done.returncode == 0, done.stderr
        found = line.search(done.stdout)
        assert found is not None and found.group(1) == codes and int(found.group(2).replace(",", "")) == size
