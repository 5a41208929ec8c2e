"""MiniCPM3 read from its published config.json: the translation into stepper's MLA config, each
field stepper does not honour refused by name, the tied lm_head, `synth` writing the published
layout, and the full-size preset's sizes (MiniCPM3-4B's)."""

import copy
import json
import re

import numpy as np
import pytest
from helpers.cli import stepper
from helpers.configs import family_preset

from stepper.errors import StepperError
from stepper.families import read_config
from stepper.presets import PRESETS
from stepper.seams.trace import Recorder
from stepper.session import RunSpec, run
from stepper.weights.names import weight_shapes
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.synth_checkpoint import synth_checkpoint


def with_fields(**fields) -> dict:
    raw = copy.deepcopy(PRESETS["minicpm3-4b"])
    raw.update(fields)
    return raw


def test_the_published_config_reads_as_minicpm3_4b():
    cfg = family_preset("minicpm3-4b")
    assert (cfg.model_type, cfg.v_head_dim, cfg.qk_head_dim, cfg.n_routed_experts) == ("minicpm3", 64, 96, 0)
    assert cfg.tie_word_embeddings and not cfg.rope_interleave and cfg.rms_norm_eps == 1e-5
    assert cfg.scale_emb == 12 and cfg.residual_scale == pytest.approx(1.4 / 62**0.5) and cfg.logits_scaling == 10
    assert cfg.longrope.short_factor == cfg.longrope.long_factor and len(cfg.longrope.short_factor) == 16
    assert cfg.longrope.attention_factor == 1.0  # max_position_embeddings = original: no stretch
    assert not any(cfg.is_moe_layer(i) for i in range(62))
    shapes = weight_shapes(cfg)
    assert "lm_head.weight" not in shapes and shapes["model.layers.0.self_attn.kv_b_proj.weight"] == (40 * 128, 256)
    params = sum(int(np.prod(s)) for s in shapes.values())
    assert 4.0e9 < params < 4.1e9  # MiniCPM3-4B: about 4.07 B parameters


@pytest.mark.parametrize("field, value, message", [
    ("attention_bias", True, "field 'attention_bias' must be False"),
    ("mlp_bias", True, "field 'mlp_bias' must be False"),
    ("pretraining_tp", 2, "field 'pretraining_tp' must be 1"),
    ("hidden_act", "gelu", "field 'hidden_act' must be 'silu'"),
    ("num_key_value_heads", 8, "field 'num_key_value_heads' must equal num_attention_heads"),
    ("rope_scaling", {"type": "dynamic", "factor": 2.0}, "field 'rope_scaling.type' must be 'longrope'"),
    ("rope_scaling", {"type": "longrope", "short_factor": [1.0] * 15, "long_factor": [1.0] * 16,
                      "original_max_position_embeddings": 32768}, "field 'rope_scaling.short_factor' must be 16"),
    ("scale_depth", "deep", "field 'scale_depth' must be a finite number"),
])
def test_a_field_stepper_does_not_honour_is_refused_by_name(field, value, message):
    with pytest.raises(StepperError, match=message.replace("(", r"\(")) as refused:
        read_config(with_fields(**{field: value}), "MiniCPM3-4B/config.json")
    assert str(refused.value).startswith("MiniCPM3-4B/config.json")


def as_transformers_saves_it(raw: dict, theta: float) -> dict:
    """The config.json transformers' save_pretrained writes for MiniCPM3: the rope block as
    rope_parameters, with rope_theta inside and none outside (the values those it read)."""
    saved = {k: v for k, v in raw.items() if k not in ("rope_scaling", "rope_theta")}
    return {**saved, "rope_parameters": {**raw["rope_scaling"], "rope_type": "longrope", "rope_theta": theta}}


def test_the_config_transformers_saves_reads_as_the_published_one():
    """tests/reference/test_transformers_saved_checkpoints.py runs what transformers saves."""
    published = family_preset("tiny-minicpm3")
    saved = read_config(as_transformers_saves_it(PRESETS["tiny-minicpm3"], published.rope_theta), "saved/config.json")
    assert saved == published
    other = read_config(as_transformers_saves_it(PRESETS["tiny-minicpm3"], 5e5), "saved/config.json")
    assert other.rope_theta == 5e5 and other.longrope == published.longrope  # rope_parameters' own theta, read
    bad = as_transformers_saves_it(PRESETS["tiny-minicpm3"], 1e4)
    bad["rope_parameters"]["long_factor"] = [1.0]
    with pytest.raises(StepperError, match=r"field 'rope_parameters.long_factor' must be 8 positive numbers"):
        read_config(bad, "saved/config.json")


@pytest.mark.parametrize("block, message", [
    ("longrope", "field 'rope_parameters' must be an object or null, got 'longrope'"),
    (3, "field 'rope_parameters' must be an object or null, got 3"),
    ({"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4},
     "field 'rope_parameters.rope_type' must be 'longrope' (or absent) for minicpm3, got 'yarn'"),
])
def test_a_rope_parameters_block_stepper_cannot_read_is_refused_not_passed_over(block, message):
    """Not an object, it was passed over for the published rope_scaling beside it (a run with LongRoPE
    that transformers would refuse); a kind other than longrope is named by the key that gives it."""
    with pytest.raises(StepperError, match=re.escape(message)):
        read_config({**PRESETS["tiny-minicpm3"], "rope_parameters": block}, "saved/config.json")
    default = read_config({**PRESETS["tiny-minicpm3"], "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}},
                          "saved/config.json")
    assert default.longrope is None and default.rope_theta == 5e5  # plain RoPE at its own theta, rope_scaling unread


def test_synth_writes_the_published_layout_and_runs_it_as_the_preset(tmp_path):
    cfg = family_preset("tiny-minicpm3")
    folder = synth_checkpoint(SyntheticWeights(cfg, seed=0), tmp_path / "tiny-minicpm3")
    written = json.loads((folder / "config.json").read_text())
    assert written["model_type"] == "minicpm3" and written["architectures"] == ["MiniCPM3ForCausalLM"]
    assert written["tie_word_embeddings"] is True and written["rope_scaling"]["type"] == "longrope"
    unnamed = {**PRESETS["tiny-minicpm3"], "_name_or_path": None}
    assert read_config(written, "written") == read_config(unnamed, "written")
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert "lm_head.weight" not in index and "model.embed_tokens.weight" in index
    mine, theirs = Recorder(), Recorder()
    run(RunSpec(model="tiny-minicpm3", prompt_len=5, decode=1), [mine])
    run(RunSpec(model=str(folder), prompt_len=5, decode=1), [theirs])
    a, b = mine.tensors(), theirs.tensors()
    assert list(a) == list(b) and "decode0.norm_scaled" in a and "decode0.layers.2.attn_scaled" in a
    assert all(np.array_equal(a[n], b[n]) for n in a)  # the synthetic weights are as stored: bit for bit


def test_the_tied_head_is_the_embedding():
    rec = Recorder()
    run(RunSpec(model="tiny-minicpm3", prompt_len=3), [rec])
    t = rec.tensors()
    embedding = SyntheticWeights(family_preset("tiny-minicpm3"), seed=0).get("model.embed_tokens.weight")  # [V, d]
    want = t["norm_scaled"].astype(np.float64) @ embedding.T.astype(np.float64)
    assert np.max(np.abs(t["logits"] - want)) <= 1e-5 * np.max(np.abs(want))
    assert np.allclose(t["norm_scaled"], t["norm"] / np.float32(128 / 32), rtol=1e-6)
    assert np.allclose(t["embed_scaled"], t["embed"] * 12, rtol=1e-6)


def test_a_pickled_checkpoint_is_refused_in_one_line_not_run_synthetic(tmp_path):
    folder = tmp_path / "MiniCPM3-4B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(PRESETS["tiny-minicpm3"]))
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x02not read")
    result = stepper("run", "--model", folder)
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0
    assert "holds pytorch_model.bin (PyTorch pickle), which stepper does not read" in result.stderr


def test_a_lone_layer_reads_the_embedding_as_the_first_layer_takes_it():
    """`stepper run --layer 0` on MiniCPM3: the layer's input is embed * scale_emb, as in the whole
    model (it was the unscaled embedding, so every layers.0 tensor differed from the full run's)."""
    whole, alone = Recorder(), Recorder()
    run(RunSpec(model="tiny-minicpm3"), [whole])
    run(RunSpec(model="tiny-minicpm3", layer=0), [alone])
    full = {e.name: e.array for e in whole.events if e.layer == 0}
    for event in (e for e in alone.events if e.layer == 0):
        np.testing.assert_array_equal(event.array, full[event.name], err_msg=event.name)
