"""DeepSeek-V4 as a registered family: every entry point runs tiny-v4 through the one session
(stepper.session, the family's V4Model and caches), a lone layer equals the same layer inside a
whole-model run, a decode step after --cache-len seeding equals the attention over the seeded cache,
and stepper diff, stepper step and the Python API take V4 runs."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.cli import stepper

import stepper as api
from stepper.families import FAMILIES, derive, family_for
from stepper.families.deepseek_v4 import V4Caches, V4Model
from stepper.model.compressed_attention import attention
from stepper.model.layer_weights import LayerWeights
from stepper.seams.trace import Emitter, Recorder
from stepper.session import RunSpec, load_model, preset_config, run
from stepper.weights.safetensors_writer import Entry, write_safetensors

IDS = (5, 17, 33, 2, 250, 9, 41, 77, 120, 3, 64, 200, 18)  # 13 positions: CSA windows close, one HCA (m = 16) not


def recorded(spec: RunSpec) -> dict[str, np.ndarray]:
    recorder = Recorder()
    run(spec, [recorder])
    return recorder.tensors()


def one_line_error(done) -> str:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def test_v4_is_registered_with_its_own_model_and_catalogue():
    cfg = preset_config("tiny-v4")
    family = family_for(cfg)
    assert family in FAMILIES and family.model is V4Model and family.cache is V4Caches
    assert family.stream(cfg) == (1, None, 4, 64)
    around = derive.model_names(cfg)
    assert around.start == ("embed_streams",) and around.lone == ()
    assert around.end == ("hc_head.mixes", "hc_head.pre", "hc_head.collapsed", "final_norm", "logits")


@pytest.mark.parametrize("layer", [0, 1, 3])  # sliding + hash, CSA + hash, CSA + scores
def test_a_lone_layer_equals_that_layer_inside_the_whole_model(tmp_path, layer):
    whole = recorded(RunSpec(model="tiny-v4", ids=IDS))
    streams = whole[f"layers.{layer}.streams"]  # [1, T, n, d]: the layer's input in the whole run
    given = tmp_path / "streams.safetensors"
    write_safetensors(given, [Entry(f"layers.{layer}.streams", "F32", streams.shape, lambda: streams)])
    inputs = [None, given] if layer == 0 else [given]  # layer 0 alone on the prompt: the embedding in every stream
    for source in inputs:
        alone = recorded(RunSpec(model="tiny-v4", layer=layer, ids=IDS, input=source))
        inside = {k: v for k, v in whole.items() if k.startswith(f"layers.{layer}.")}
        assert list(alone) == list(inside)
        assert len(inside) > 40 and all(np.array_equal(alone[k], inside[k]) for k in inside), source


def test_an_input_of_the_wrong_shape_names_the_file_and_the_streams_it_expects(tmp_path):
    flat = np.zeros((1, 3, 64), np.float32)  # an MLA residual, not V4's streams
    given = tmp_path / "flat.safetensors"
    write_safetensors(given, [Entry("x", "F32", flat.shape, lambda: flat)])
    line = one_line_error(stepper("run", "--model", "tiny-v4", "--layer", "1", "--input", given))
    assert line == f"stepper: error: {given}: tensor 'x' has shape [1, 3, 64], expected [1, T, 4, 64]"


@pytest.mark.parametrize("layer", [1, 2])  # CSA (m = 4, the indexer) and HCA (m = 16)
def test_a_decode_step_after_cache_len_seeding_is_the_attention_over_the_seeded_cache(layer):
    n, seed = 203, 4
    shown = recorded(RunSpec(model="tiny-v4", layer=layer, cache_len=n, prompt_len=2, decode=1, seed=seed))
    cfg, dims = preset_config("tiny-v4"), preset_config("tiny-v4").dims(layer)
    weights = load_model("tiny-v4", seed)
    model, caches = V4Model(weights), V4Caches(cfg)
    sample_ids = np.array([[int(i) for i in np.random.default_rng([seed, 4]).integers(0, cfg.vocab_size, 64)]])
    model.seed_cache(caches, layer, model.lone_input(sample_ids, seed, 2), np.arange(n), seed, False, Emitter())
    cache = caches.layers[layer]
    assert cache.seen == n and cache.compressor.entries.shape[1] == n // dims.compress_ratio
    w = LayerWeights(weights, layer)
    for phase, positions in (("prefill", 2), ("decode0", 1)):
        recorder = Recorder()
        out = attention(shown[f"{phase}.layers.{layer}.attn_norm"], w, dims, cache, Emitter([recorder]))
        np.testing.assert_array_equal(out, shown[f"{phase}.layers.{layer}.attn_output"])
        for key, value in recorder.tensors().items():
            np.testing.assert_array_equal(value, shown[f"{phase}.layers.{layer}.{key}"])
    made = n + 3  # the cache's positions, the prompt's two and the decode step's
    assert shown[f"decode0.layers.{layer}.attn.entries"].shape[1] == made // dims.compress_ratio
    chosen = shown[f"decode0.layers.{layer}.attn.chosen"]
    assert chosen.max() < made // dims.compress_ratio and chosen.min() >= 0


def test_the_header_gives_the_cache_per_position_beside_v3s_mla():
    done = stepper("run", "--model", "tiny-v4", "--layer", "1", "--cache-len", "40", "--decode", "1",
                   "--only", "*attn.chosen", "--plain")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "after a synthetic cache of 40 positions" in lines[0]
    # CSA, width 32 and the indexer's 16 pooled 4 to one: (32 + 16) / 4 values a position, 4 B each
    # beside an MLA as small (a latent of 32 and 8 rotary dims), not full-size V3's 2,304 B
    assert lines[1].startswith("cache per position per layer: 48 B (CSA, ") and "vs 160 B for V3's MLA at these " \
        "widths (a latent of 32 + 8 rotary" in lines[1]
    assert "decode0.layers.1.attn.chosen  [B=1 batch, T=1 position" in done.stdout


def test_diff_of_two_v4_runs_finds_the_first_patched_tensor():
    same = stepper("diff", "--plain", "run --model tiny-v4 --ids 1,2,3", "run --model tiny-v4 --ids 1,2,3")
    assert same.returncode == 0, same.stderr
    assert "the same bit for bit" in same.stdout and " 0 differ" in same.stdout
    patched = stepper("diff", "--plain", "run --model tiny-v4 --ids 1,2,3",
                      "run --model tiny-v4 --ids 1,2,3 --patch layers.2.attn.kv=x*1.001")
    assert patched.returncode == 1, patched.stderr
    assert "first difference: layers.2.attn.kv" in patched.stdout
    growth = {line.split("  ")[0]: line for line in patched.stdout.splitlines() if line.startswith("layer ")}
    assert growth["layer 1"].endswith("the same") and "differs from attn.kv" in growth["layer 2"]


def test_step_stops_at_a_v4_tensor_and_names_the_layer_by_its_kind(tmp_path):
    commands = tmp_path / "commands.txt"
    commands.write_text("p layers.1.attn.q[0, 0, 0, :3]\nc\n")
    done = stepper("step", "--model", "tiny-v4", "--layer", "1", "--until", "attn.q", "--commands", commands,
                   "--plain")
    assert done.returncode == 0, done.stderr
    assert "layer 1 (CSA: compressed, indexer, hash-routed) › compressed attention" in done.stdout
    assert "tensors · prompt" in done.stdout.splitlines()[-1]


def test_the_api_runs_patches_and_diffs_v4():
    a = api.run("tiny-v4", ids=IDS[:6], decode=1)
    assert a.names[0] == "prefill.embed_streams" and a.names[-1] == "decode0.logits"
    assert a["prefill.logits"].shape == (1, 6, 256) and len(a.generated) == 1
    assert a.explain("prefill.layers.1.hc_ffn.comb")["dims"] == ["B", "T", "n", "n"]
    b = api.run("tiny-v4", ids=IDS[:6], decode=1, patch={"prefill.layers.1.attn_output": lambda x, name: x * 0})
    assert not np.any(b["prefill.layers.1.attn_output"])
    found = api.diff(a, b)
    assert found.first.name == "prefill.layers.1.attn_output" and found.first.cosine == 0
    assert np.array_equal(a["prefill.layers.0.ffn_streams"], b["prefill.layers.0.ffn_streams"])
    with pytest.raises(api.StepperError, match=r"attn=naive: model tiny-v4 \(deepseek_v4\) takes no such option"):
        api.run("tiny-v4", attn="naive")


def test_synth_then_inspect_and_a_lone_layer_of_the_checkpoint(tmp_path):
    folder = tmp_path / "tiny-v4"
    assert stepper("synth", "--model", "tiny-v4", "--out", folder, "--seed", 3).returncode == 0
    listed = stepper("inspect", folder, "--plain")
    assert listed.returncode == 0, listed.stderr
    preset = recorded(RunSpec(model="tiny-v4", layer=3, ids=IDS, seed=3))
    written = recorded(RunSpec(model=str(folder), layer=3, ids=IDS))
    assert list(preset) == list(written) and all(np.array_equal(preset[k], written[k]) for k in preset)
    refused = one_line_error(stepper("synth", "--model", "tiny-v4", "--out", tmp_path / "x", "--quant", "bf16"))
    assert refused == ("stepper: error: --quant bf16: model tiny-v4 (deepseek_v4) is written whole and as published "
                       "(FP8 with E8M0 block scales, FP4 routed experts); leave --quant out")


def test_run_show_hist_draws_a_v4_tensors_histogram():
    out = stepper("run", "--model", "tiny-v4", "--plain", "--show", "hist", "--only", "layers.1.attn.q")
    assert out.returncode == 0, out.stderr
    assert "896 finite values of 896" in out.stdout
