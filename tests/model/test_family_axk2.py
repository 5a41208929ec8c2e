"""A.X-K2 read from its published config.json: V3.2's fields with A.X-K2's defaults (no expert
groups, first layer dense, 16 index heads), each field stepper does not honour refused by name,
the router's 0.0 fill of dropped groups worked by hand, and `synth` writing the published names
(q_b_proj with the gate, gated norms' norm.weight / W_down / W_up in BF16 beside FP8 projections)."""

import copy
import json

import numpy as np
import pytest
from helpers.configs import family_preset

from stepper.config import Config
from stepper.errors import StepperError
from stepper.families import read_config
from stepper.model.router import route
from stepper.presets import PRESETS
from stepper.seams.trace import Emitter, Recorder
from stepper.session import RunSpec, run
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.synth_checkpoint import requantized, synth_checkpoint


def axk2(**fields) -> Config:
    raw = copy.deepcopy(PRESETS["a.x-k2"])
    raw.update(fields)
    return read_config(raw, "A.X-K2/config.json")


def test_the_published_sizes_read_as_axk2():
    cfg = family_preset("a.x-k2")
    assert (cfg.model_type, cfg.n_group, cfg.topk_group) == ("axk2", 1, 1)
    assert (cfg.index_n_heads, cfg.gated_norm_rank) == (16, 16)
    assert cfg.q_gate and cfg.masked_groups_zero and cfg.first_k_dense_replace == 1
    assert not cfg.is_moe_layer(0) and cfg.is_moe_layer(1)
    assert "n_group" not in cfg.to_hf()  # written back as published: no expert groups


@pytest.mark.parametrize("fields, message", [
    ({"attention_bias": True}, "field 'attention_bias' must be False"),
    ({"n_group": 8}, "field 'topk_group' must be given with n_group"),
    ({"mlp_layer_types": ["sparse"] * 48}, "field 'mlp_layer_types' must be 'dense' then 'sparse'"),
    ({"gated_norm_rank": 0}, "field 'gated_norm_rank' must be >= 1"),
    ({"q_lora_rank": None}, "field 'q_lora_rank' is missing"),
    ({"hidden_act": "gelu"}, "field 'hidden_act' must be 'silu'"),
])
def test_a_field_stepper_does_not_honour_is_refused_by_name(fields, message):
    with pytest.raises(StepperError, match=message) as refused:
        axk2(**fields)
    assert str(refused.value).startswith("A.X-K2/config.json")


def test_a_dropped_group_scores_zero_so_it_can_beat_a_negative_kept_expert():
    """4 experts in 2 groups, 2 chosen, 1 group kept: group 0 wins; its expert 1 scores -0.30
    biased, so a -inf fill would choose [0, 1]; with A.X-K2's 0.0 fill a dropped expert (0.0)
    beats it: the lowest index among the tied zeros, expert 2."""
    cfg = axk2(n_routed_experts=4, n_group=2, topk_group=1, num_experts_per_tok=2)
    bias = np.array([0.0, -0.8, -0.9, -0.9], dtype=np.float32)
    logits = np.array([[2.2, 0.0, 0.0, 0.0]], dtype=np.float32)  # sigmoid: 0.90, 0.5, 0.5, 0.5
    gate = np.eye(4, 2048, dtype=np.float32)  # the logits are x's first four channels
    x = np.zeros((1, 2048), dtype=np.float32)
    x[0, :4] = logits
    routing = route(x, gate, bias, cfg, Emitter())
    # biased: 0.90, -0.30, -0.40, -0.40; group 0 (0.60) beats group 1 (-0.80); expert 1's -0.30 < 0.0
    assert routing.topk_idx.tolist() == [[0, 2]]


def test_synth_writes_the_published_names_and_runs_as_the_preset(tmp_path):
    cfg = requantized(family_preset("tiny-axk2"), "fp8")
    folder = synth_checkpoint(SyntheticWeights(cfg, seed=0), tmp_path / "tiny-axk2")
    written = json.loads((folder / "config.json").read_text())
    assert written["model_type"] == "axk2" and written["gated_norm_rank"] == 8 and written["n_group"] == 4
    header = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.layers.1.self_attn.q_b_proj.weight_scale_inv" in header  # FP8, the gate included
    assert "model.layers.1.post_attention_layernorm.W_down.weight" in header
    assert "model.layers.1.post_attention_layernorm.W_down.weight_scale_inv" not in header  # BF16
    assert "model.layers.0.post_attention_layernorm.weight" in header  # the dense layer's plain norm
    mine = Recorder()
    run(RunSpec(model=str(folder), prompt_len=7, decode=1), [mine])
    t = mine.tensors()
    assert "decode0.layers.1.post_attention_layernorm_gated" in t
    assert "decode0.layers.0.post_attention_layernorm_gate" not in t
    assert np.isfinite(t["decode0.logits"]).all()
