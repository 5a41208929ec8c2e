"""DeepSeek-V4 through the command line: `stepper synth` writes the published layout, `stepper run`
runs a preset or that checkpoint (layer selection, decode steps, the header), and bad input is one
line naming the file, the tensor or field and what was expected, exit code 2: a missing compressor
or indexer tensor, a tid2eid entry past the experts, a compress_ratios list of the wrong length."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from helpers.cli import stepper

import stepper as stepper_api
from stepper import catalog
from stepper.weights.checkpoint import INDEX
from stepper.weights.published_store import safetensors_dtype
from stepper.weights.safetensors_reader import SafetensorsFile
from stepper.weights.safetensors_writer import Entry, write_safetensors


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("v4") / "tiny-v4"
    done = stepper("synth", "--model", "tiny-v4", "--out", folder, "--seed", 3)
    assert done.returncode == 0, done.stderr
    return folder


def copy_of(folder: Path, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    out.mkdir()
    for f in folder.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    return out


def rewrite(folder: Path, name: str, array: np.ndarray | None) -> str:
    """The checkpoint with tensor `name` replaced (None: removed, from its shard and the index);
    returns its shard's name."""
    index = json.loads((folder / INDEX).read_text())
    shard = index["weight_map"][name]
    reader = SafetensorsFile(folder / shard)
    arrays = {n: np.array(reader.get(n)) for n in reader.names()}
    del reader
    if array is None:
        del arrays[name], index["weight_map"][name]
    else:
        arrays[name] = array
    (folder / shard).unlink()
    entries = [Entry(n, safetensors_dtype(a), a.shape, lambda a=a: a) for n, a in arrays.items()]
    write_safetensors(folder / shard, entries)
    (folder / INDEX).write_text(json.dumps(index))
    return shard


def one_line_error(done) -> str:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def test_synth_writes_the_published_layout(written):
    names = sorted(p.name for p in written.iterdir())
    assert names == ["config.json", *[f"model-{i:05d}-of-00007.safetensors" for i in range(1, 8)], INDEX]
    config = json.loads((written / "config.json").read_text())
    assert config["compress_ratios"] == [0, 4, 16, 4, 0] and config["expert_dtype"] == "fp4"
    stored = SafetensorsFile(written / "model-00003-of-00007.safetensors")  # layer 1: CSA, hash-routed
    assert stored.info("layers.1.ffn.experts.0.w1.weight").dtype == "I8"
    assert stored.info("layers.1.ffn.experts.0.w1.scale").dtype == "F8_E8M0"
    assert stored.info("layers.1.attn.wq_a.weight").dtype == "F8_E4M3"
    assert stored.info("layers.1.ffn.gate.tid2eid").dtype == "I64"
    assert any(n.startswith("mtp.0.") for n in json.loads((written / INDEX).read_text())["weight_map"])


def test_run_a_checkpoint_with_decode_steps_and_a_layer_range(written):
    done = stepper("run", "--model", written, "--layers", "1:3", "--decode", "2", "--plain")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("model tiny-v4 (deepseek_v4): 4 layers (1 sliding, 2 CSA, 1 HCA; the first 2 hash-routed)")
    assert f"weights from {written}" in out.splitlines()[0] and "layers 1..2, then 2 decode steps" in out
    shown_layers = {line.split(".")[2] for line in out.splitlines() if line.startswith(("prefill.layers.", "decode"))
                    and ".layers." in line}
    assert shown_layers == {"1", "2"}
    for name in ("prefill.layers.1.attn.indexer.chosen", "decode1.layers.2.hc_attn.comb",
                 "decode0.layers.1.ffn.gate.hash_idx", "decode1.layers.2.ffn.gate.topk_idx",
                 "decode1.layers.2.ffn.experts.clamp_counts"):
        assert f"\n{name}  " in out, name
    assert "\nprefill.logits  " not in out and "\nprefill.embed_streams  " not in out  # only when every layer is
    assert "generated" in out.splitlines()[-1]


def test_a_preset_runs_the_same_weights_as_its_synth(written):
    runs = [stepper("run", "--model", m, "--seed", 3, "--ids", "5,6,7,8,9", "--only", "logits", "--plain")
            for m in ("tiny-v4", written)]
    assert [r.returncode for r in runs] == [0, 0]
    assert runs[0].stdout.splitlines()[2:] == runs[1].stdout.splitlines()[2:]


@pytest.mark.parametrize("missing", ["layers.1.attn.compressor.wkv.weight",
                                     "layers.3.attn.indexer.weights_proj.weight"])
def test_a_missing_compressor_or_indexer_tensor(written, tmp_path, missing):
    folder = copy_of(written, tmp_path)
    rewrite(folder, missing, None)
    line = one_line_error(stepper("run", "--model", folder))
    assert str(folder) in line and f"'{missing}' is missing" in line and "expected" in line


def test_a_tid2eid_entry_past_the_experts(written, tmp_path):
    folder = copy_of(written, tmp_path)
    name = "layers.0.ffn.gate.tid2eid"
    table = np.array(SafetensorsFile(folder / "model-00002-of-00007.safetensors").get(name))
    table[5, 1] = 16  # tiny-v4 has 16 experts: 0..15
    shard = rewrite(folder, name, table)
    line = one_line_error(stepper("run", "--model", folder))
    assert line == (f"stepper: error: {folder / shard}: tensor '{name}': entry [5, 1] is 16, expected an expert id "
                    "in 0..15 (1 entry out of range)")


def test_a_tid2eid_row_naming_an_expert_twice(written, tmp_path):
    """A hand-made table's row naming expert e twice gives its token 3 experts, e weighted by two
    slots (transformers adds e's output once per slot); stepper's model ran e once with one slot's
    weight, and its routing picture drew one cell while counting e twice: refused as the table is read."""
    folder = copy_of(written, tmp_path)
    name = "layers.0.ffn.gate.tid2eid"
    table = np.array(SafetensorsFile(folder / "model-00002-of-00007.safetensors").get(name))
    table[7, 2] = table[7, 0]
    table[9, 3] = table[9, 1]
    shard = rewrite(folder, name, table)
    for command in (("run", "--model", folder), ("run", "--model", folder, "--layer", "0", "--ids", "1,2")):
        line = one_line_error(stepper(*command))
        assert line == (f"stepper: error: {folder / shard}: tensor '{name}': row 7 names expert {table[7, 0]} more "
                        "than once, expected 4 distinct experts a token (2 rows repeat one)")
    inspected = stepper("inspect", folder)
    assert inspected.returncode == 1 and f"tensor '{name}': row 7 names expert {table[7, 0]} more than once" \
        in inspected.stdout


def test_a_tid2eid_of_zeros_says_where_such_a_table_comes_from(written, tmp_path):
    """transformers initialises tid2eid to zeros (a model it made and saved before loading a
    checkpoint's values): the refusal says so, the likeliest cause of every row repeating expert 0."""
    folder = copy_of(written, tmp_path)
    name = "layers.0.ffn.gate.tid2eid"
    table = np.zeros_like(SafetensorsFile(folder / "model-00002-of-00007.safetensors").get(name))
    shard = rewrite(folder, name, table)
    line = one_line_error(stepper("run", "--model", folder))
    assert line == (f"stepper: error: {folder / shard}: tensor '{name}': row 0 names expert 0 more than once, "
                    f"expected 4 distinct experts a token ({len(table)} rows repeat one; all zeros, as transformers "
                    "initialises it before a checkpoint's values are loaded)")


def test_compress_ratios_of_the_wrong_length(written, tmp_path):
    folder = copy_of(written, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["compress_ratios"] = config["compress_ratios"][:-1]  # the MTP block's entry left out
    (folder / "config.json").write_text(json.dumps(config))
    line = one_line_error(stepper("run", "--model", folder))
    assert line == (f"stepper: error: {folder / 'config.json'}: field 'compress_ratios' must have 5 entries "
                    "(num_hidden_layers 4 + num_nextn_predict_layers 1), got 4")


@pytest.mark.parametrize("option, value, why", [
    ("--chunk", "4", "DeepSeek-V4's prefill runs the whole prompt at once (chunk 0)"),
    ("--attn", "naive", "DeepSeek-V4 has one attention path"),
    ("--start-pos", "3", "DeepSeek-V4's caches count positions from 0"),
    ("--index-scoring", "fp8", "DeepSeek-V4's indexer scores in float32 only"),
])
def test_an_option_v4_has_no_path_for_is_one_line(option, value, why):
    line = one_line_error(stepper("run", "--model", "tiny-v4", option, value))
    assert line.startswith(f"stepper: error: {option} {value}: ") and why in line


def test_a_v4_run_says_what_it_needs_as_every_run_does():
    """An MLA run's --attn auto line says what the run needs; DeepSeek-V4, with one attention path,
    said nothing of its memory. Its line says the need, and that there is nothing to choose."""
    out = stepper("run", "--model", "tiny-v4", "--only", "*.output", "--plain")
    said = [line for line in out.stdout.splitlines() if line.startswith("memory: ")]
    assert out.returncode == 0 and len(said) == 1, out.stdout[:2000]
    assert re.fullmatch(r"memory: the run needs about \d+ (KiB|MiB) \(one attention path: nothing for --attn auto to "
                        r"choose\)", said[0]), said
    noted = [n for n in stepper_api.run("tiny-v4", keep="*.output").notes if n.startswith("memory: ")]
    assert len(noted) == 1 and noted[0].endswith("(one attention path: nothing for attn=auto to choose)"), noted


def test_the_start_pos_refusal_names_the_options_that_give_a_long_context_as_the_caller_writes_them():
    """The refusal of --start-pos points at one layer over a seeded cache: those options, spelled for
    the command line or for stepper.run, and followed as spelled they run past position 4000."""
    line = one_line_error(stepper("run", "--model", "tiny-v4", "--start-pos", "4000"))
    assert line.endswith("a cache seeded with N positions (--layer L --cache-len N)"), line
    with pytest.raises(stepper_api.StepperError, match=r"\(layer=L cache_len=N\)$"):
        stepper_api.run("tiny-v4", start_pos=4000)
    out = stepper("run", "--model", "tiny-v4", "--layer", "1", "--cache-len", "4000", "--only", "*.output", "--plain")
    assert out.returncode == 0, out.stderr
    attended = np.asarray(stepper_api.run("tiny-v4", layer=1, cache_len=4000, keep="*.output")["layers.1.attn.output"])
    assert attended.shape == (1, 4, 7, 32) and np.isfinite(attended).all() and attended.std() > 0


@pytest.mark.parametrize("value", ["naive", "absorb"])
def test_tree_refuses_attn_for_v4_in_the_line_run_gives(value):
    """tree's --attn is refused for a family with one attention path by run's own check: the same line,
    exit 2, for --model and when both compared models are of it; without --attn the tree is drawn. A
    comparison with a model that has the choice takes it for that model, named on its side."""
    line = one_line_error(stepper("run", "--model", "tiny-v4", "--attn", value))
    assert one_line_error(stepper("tree", "--model", "tiny-v4", "--attn", value)) == line
    assert one_line_error(stepper("tree", "--model", "tiny-v4", "--compare", "tiny-v4", "--attn", value)) == line
    assert stepper("tree", "--model", "tiny-v4", "--layer", "1").returncode == 0
    for args, title in ((["--model", "tiny", "--compare", "tiny-v4"],
                         "tiny layer 1 (naive attention) vs tiny-v4 layer 0"),
                        (["--model", "tiny-v4", "--compare", "tiny", "--attn", value],
                         f"tiny-v4 layer 0 vs tiny layer 1 ({value} attention)")):
        out = stepper("tree", *args, "--plain")
        assert out.returncode == 0 and out.stdout.splitlines()[0] == title, out.stderr
    absorbed = stepper("tree", "--model", "tiny", "--compare", "tiny-v4", "--attn", value, "--plain").stdout
    assert ("self_attn.q_nope_absorbed" in absorbed) == (value == "absorb")  # tiny's tensors on that path


def test_show_draws_the_comb_matrix_and_what_a_query_sees():
    done = stepper("run", "--model", "tiny-v4", "--prompt-len", "30", "--only", "layers.3.hc_ffn.comb",
                   "--only", "layers.2.attn.chosen", "--show", "hc,reach", "--plain")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    rows = [line for line in out.splitlines() if line.startswith("from ")]
    assert len(rows) == 4 and all(line.endswith(("1.0000", "0.9999")) for line in rows)  # Sinkhorn: rows sum to 1
    assert "position 29 of 0..29" in out and out.count("post stream ") == 4
    assert "query at position 29 · HCA (m = 16)" in out  # layer 2 (HCA): (29+1)//16
    assert "1 of the 1 visible entry ((p+1)//m" in out
    assert out.count("hc_attn.comb") == 0  # only the tensors --only keeps are drawn


def test_tree_lists_each_layer_kind_in_the_order_a_run_emits():
    from stepper.families import derive
    from stepper.seams.trace import Recorder
    from stepper.session import RunSpec, preset_config, run

    recorder = Recorder()
    run(RunSpec(model="tiny-v4", prompt_len=40), [recorder])  # 40 positions: windows of both ratios close
    cfg = preset_config("tiny-v4")
    for layer in range(4):
        ran = [e.key for e in recorder.events if e.layer == layer]
        assert derive.layer_keys(cfg, layer) == ran, layer
    done = stepper("tree", "--model", "tiny-v4", "--plain")
    assert done.returncode == 0, done.stderr
    headings = [line for line in done.stdout.splitlines() if line.startswith("tiny-v4: ")]
    assert headings == ["tiny-v4: layer 0 (sliding window, hash-routed)",
                        "tiny-v4: layer 1 (CSA: compressed, indexer, hash-routed)",
                        "tiny-v4: layer 2 (HCA: heavily compressed, score-routed)",
                        "tiny-v4: layer 3 (CSA: compressed, indexer, score-routed)"]
    assert "(not in the catalogue)" not in done.stdout
    assert "hc_attn.comb  [B, T, 4 residual streams, 4 residual streams]" in done.stdout
    # the sizes a layer's ratio sets, CSA's doubled by its overlap, are those its tensors had in the run
    assert "attn.compressor.kv  [B, T, 64 compressor channels" in done.stdout  # layer 1, CSA
    assert "attn.compressor.kv  [B, T, 32 compressor channels" in done.stdout  # layer 2, HCA
    cat = catalog.load()
    for event in (e for e in recorder.events if e.layer is not None):
        for dim, size in zip(cat.entry(event.key)["dims"], event.array.shape, strict=True):
            assert cat.expected_size(dim, cfg, event.layer) in (None, size), (event.name, dim)
    assert {cat.expected_size(d, cfg, 1) for d in ("m", "slots", "c")} == {4, 8, 64}
    assert [cat.expected_size(d, cfg, 2) for d in ("m", "slots", "c")] == [16, 16, 32]


def test_explain_a_v4_tensor_and_an_unknown_name():
    done = stepper("explain", "hc_attn.comb", "--model", "deepseek-v4-flash", "--plain")
    assert done.returncode == 0, done.stderr
    assert "n (residual streams = 4)" in done.stdout and "after the 20 rounds" in done.stdout
    assert "modeling_deepseek_v4.py  lines 988-991" in done.stdout
    line = one_line_error(stepper("explain", "no_such_tensor", "--model", "tiny-v4"))
    assert line.startswith("stepper: error: no tensor named 'no_such_tensor' in the catalogue")


def test_a_run_that_would_not_fit_is_refused_before_it_starts():
    line = one_line_error(stepper("run", "--model", "deepseek-v4-flash", "--prompt-len", "1000000"))
    assert line.startswith("stepper: error: this run would need about ") and line.endswith("lower it with --prompt-len")


def test_a_runs_rows_name_v4s_dims():
    done = stepper("run", "--model", "tiny-v4", "--prompt-len", "20", "--only", "layers.3.hc_ffn.comb",
                   "--only", "layers.2.ffn.gate.topk_idx", "--plain")
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("layers.")]
    assert rows == ["layers.2.ffn.gate.topk_idx  [N=20 tokens, 4 chosen experts]  int64",
                    ("layers.3.hc_ffn.comb  [B=1 batch, T=20 positions, 4 residual streams, 4 residual streams]  "
                     "float32")]

