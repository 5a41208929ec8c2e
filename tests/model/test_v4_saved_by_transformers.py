"""A DeepSeek-V4 model transformers makes and saves itself, run by stepper as transformers runs it.

A porting engineer's tiny reference: transformers' DeepseekV4ForCausalLM of tests.helpers.hf_v4's
config (a sliding, a CSA and an HCA layer, two hash-routed), every parameter drawn, written by
save_pretrained: its config.json in transformers' form (`layer_types`, `compress_rates`,
`mlp_layer_types`, `rope_parameters`) and its tensors by the names its renames give back
(`model.layers.1.attn.wq_a.weight`, `model.embed_tokens.weight`, `model.hc_head.hc_fn`, an
attention's kv_norm as `attn.norm`), float32. stepper reads that folder; the model
transformers' from_pretrained builds from the same folder is the reference: every tensor both
name, over a prompt and two decode steps, and every expert and indexer choice."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stepper.families.deepseek_v4_checkpoint import V4Checkpoint
from stepper.seams.trace import Recorder
from stepper.session import RunSpec, run
from stepper.weights import remote
from tests.helpers import hf_v4
from tests.helpers.cli import stepper
from tests.helpers.range_server import RangeServer
from tests.helpers.remote_cache import cache_settings

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPT = 38
STEPS = 2


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("v4") / "saved"
    hf_v4.random_model(hf_v4.TINY_V4, seed=1).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def both(saved):
    model = transformers.DeepseekV4ForCausalLM.from_pretrained(saved, dtype=torch.float32,
                                                               attn_implementation="eager").eval()
    prompt = [int(i) for i in np.random.default_rng(2).integers(0, hf_v4.TINY_V4["vocab_size"], PROMPT)]
    recorder = Recorder()
    result = run(RunSpec(model=str(saved), ids=tuple(prompt), decode=STEPS), [recorder], V4Checkpoint(saved))
    ref, _ = hf_v4.trace_steps(model, prompt, result.generated)
    return recorder.tensors(), ref, result


def test_the_folder_is_in_transformers_form(saved):
    raw = json.loads((saved / "config.json").read_text())
    assert "compress_ratios" not in raw and "num_hash_layers" not in raw
    assert raw["layer_types"][2] == "heavily_compressed_attention" and raw["mlp_layer_types"][:3] == [
        "hash_moe", "hash_moe", "moe"]
    names = set(V4Checkpoint(saved).published.shards["model.safetensors"].names())
    assert {"embed.weight", "hc_head_fn", "head.weight", "layers.0.attn.kv_norm.weight"} <= names  # as stepper reads
    from safetensors import safe_open

    with safe_open(saved / "model.safetensors", "np") as f:
        on_disk = set(f.keys())
    assert {"model.embed_tokens.weight", "model.hc_head.hc_fn", "head.weight", "model.layers.0.attn.norm.weight",
            "model.layers.1.attn.indexer.compressor.norm.weight", "model.layers.3.ffn.gate.bias"} <= on_disk
    assert not any(n.startswith(("layers.", "mtp.")) or ".kv_norm." in n for n in on_disk)


def test_every_tensor_both_name_matches_in_prefill_and_decode(both):
    mine, ref, _ = both
    mine = {k: (v.reshape(ref[k].shape) if k.endswith("routed_output") and k in ref else v) for k, v in mine.items()}
    checked = sorted(set(mine) & set(ref) - {k for k in ref if k.endswith(("attn.indexer.chosen", "_idx"))})
    assert len(checked) == 3 * (4 * (12 + 7 + 5) + 3 + 6)  # as tests/model/test_v4_crosscheck.py counts them
    wrong = {k: why for k in checked if (why := hf_v4.v4_compare(k, mine, ref))}
    assert wrong == {}


def test_every_expert_and_indexer_choice_is_the_same(both):
    mine, ref, result = both
    choices = sorted(k for k in ref if k.endswith(("attn.indexer.chosen", "hash_idx", "topk_idx")))
    assert len(choices) == 3 * (4 + 2)
    for k in choices:
        assert np.array_equal(np.sort(mine[k], axis=-1), np.sort(ref[k], axis=-1)), k
    for step, token in enumerate(result.generated):
        assert int(np.argmax(ref[f"{'prefill' if step == 0 else f'decode{step - 1}'}.logits"][0, -1])) == token


def test_inspect_lists_it_by_the_published_names_and_finds_nothing_wrong(saved):
    out = stepper("inspect", saved, "--plain")
    assert out.returncode == 0 and not out.stderr, out.stderr
    first = out.stdout.splitlines()[0]
    assert "deepseek_v4 (as transformers saves it, listed by the published names), 4 layers" in first
    assert "problem" not in out.stdout and "  attn.kv_norm.weight " in out.stdout


def resaved(saved, folder, change) -> object:
    """The saved checkpoint written again to `folder` after change(tensors by name)."""
    from safetensors.numpy import load_file, save_file

    folder.mkdir()
    (folder / "config.json").write_text((saved / "config.json").read_text())
    tensors = load_file(str(saved / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def test_a_missing_tensor_is_named_as_transformers_saves_it(saved, tmp_path):
    broken = resaved(saved, tmp_path / "broken", lambda t: t.pop("model.layers.1.attn.norm.weight"))
    out = stepper("run", "--model", broken, "--layer", "1", "--plain")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        (f"stepper: error: {broken}: 'model.layers.1.attn.norm.weight' is missing (expected BF16, F16 or F32, "
        "shape [32])")], out.stderr
    listed = stepper("inspect", broken, "--plain")
    assert listed.returncode == 1 and not listed.stderr  # inspect's code when it lists a problem
    assert "  ! 'model.layers.1.attn.norm.weight' is missing (expected BF16, F16 or F32, shape [32])" in listed.stdout


def test_a_folder_naming_its_tensors_both_ways_is_refused(saved, tmp_path):
    def one_published_name(tensors):
        tensors["layers.3.attn.wq_a.weight"] = tensors.pop("model.layers.3.attn.wq_a.weight")

    mixed = resaved(saved, tmp_path / "mixed", one_published_name)
    for command in (("run", "--model", mixed, "--plain"), ("inspect", mixed)):
        out = stepper(*command)
        assert out.returncode == 2 and out.stdout == ""
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1, out.stderr
        assert lines[0].startswith(f"stepper: error: {mixed}: tensors named as transformers saves DeepSeek-V4 ('model.")
        assert lines[0].endswith("publishes it ('layers.3.attn.wq_a.weight'): expected one naming"), lines[0]


def test_a_remote_one_runs_as_the_local_one_and_fetches_only_what_the_run_reads(saved, monkeypatch, tmp_path):
    pytest.importorskip("huggingface_hub")
    monkeypatch.setattr(remote, "_chosen", cache_settings(tmp_path))
    spec = RunSpec(model="", ids=(5, 17, 3, 90, 17), decode=1)
    want, ours = Recorder(), Recorder()
    run(spec, [want], V4Checkpoint(saved))
    with RangeServer(saved.parent) as server:
        run(spec, [ours], V4Checkpoint(f"{server.url}/{saved.name}/"))
    assert list(ours.tensors()) == list(want.tensors())
    for name, value in want.tensors().items():
        np.testing.assert_array_equal(ours.tensors()[name], value, err_msg=name)
    whole = (saved / "model.safetensors").stat().st_size
    embedding = hf_v4.TINY_V4["vocab_size"] * hf_v4.TINY_V4["hidden_size"] * 4
    assert whole - embedding < server.sent < whole  # all but the embedding's rows no token of the run has


def test_inspect_of_a_config_a_run_refuses_still_lists_the_tensors_and_names_the_field(saved, tmp_path):
    bad = resaved(saved, tmp_path / "bad", lambda tensors: None)
    raw = json.loads((bad / "config.json").read_text())
    raw["rope_parameters"]["compress"]["attention_factor"] = 1.3
    (bad / "config.json").write_text(json.dumps(raw))
    out = stepper("inspect", bad, "--plain")
    assert out.returncode == 1 and not out.stderr, out.stderr
    assert "  attn.kv_norm.weight " in out.stdout and "layer 2 (HCA: 8 tokens an entry; score-routed)" in out.stdout
    assert out.stdout.rstrip().endswith(
        f"! {bad}/config.json: field 'rope_parameters.compress.attention_factor' must be 1.0 (V4 scales no cos and "
        "sin; transformers multiplies them by it), got 1.3 (a run refuses it)")
