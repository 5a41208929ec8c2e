"""Kimi Linear's config and checkpoint: the published config.json read field by field, its layer
lists checked, the presets, synth's published layout, and bad input refused in one line that
names the file, the field or tensor and what was expected."""

import copy

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from stepper.errors import StepperError
from stepper.families import kimi_linear as kl
from stepper.seams.trace import Emitter
from tests.helpers.kimi_linear import random_weights, tiny_config, write_checkpoint


def test_the_published_config_reads_as_published():
    cfg = kl.parse(kl.KIMI_LINEAR_48B, "config.json")
    assert cfg.full_attn_layers == (3, 7, 11, 15, 19, 23, 26)  # 1-based 4, 8, ..., 27
    assert len(cfg.kda_layers) == 20 and not set(cfg.kda_layers) & set(cfg.full_attn_layers)
    assert (cfg.linear_num_heads, cfg.linear_head_dim, cfg.short_conv_kernel_size) == (32, 128, 4)
    assert (cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.n_shared_experts) == (256, 8, 1)
    assert cfg.routed_scaling_factor == 2.446 and cfg.norm_topk_prob and cfg.rms_norm_eps == 1e-5
    assert not cfg.is_moe_layer(0) and cfg.is_moe_layer(1) and cfg.is_moe_layer(26)
    assert cfg.qk_head_dim == 192 and cfg.q_lora_rank is None
    assert kl.parse(cfg.to_hf(), "again") == kl.KimiLinearConfig(**{**cfg.__dict__, "name": "again"})


def test_memory_per_layer_in_numbers():
    cfg = kl.preset("kimi-linear-48b-a3b")
    assert kl.kda_layer_bytes(cfg) == (32 * 128 * 128 + 3 * 3 * 32 * 128) * 4  # 2,244,608 B at any length
    assert kl.mla_bytes_per_position(cfg) == (512 + 64) * 4
    assert kl.mla_bytes_per_position(cfg, "naive") == 32 * (192 + 128) * 4
    line = kl.memory_line(cfg, 32768)
    assert "KDA 2,244,608 B in all" in line and "0 B per position" in line and "2,304 B per position" in line
    assert "20 KDA layers 42.8 MiB, 7 MLA layers 504.0 MiB" in line  # 7 x 2304 x 32768 = 504 MiB


def linear(**changes) -> dict:
    raw = copy.deepcopy(kl.KIMI_LINEAR_48B)
    raw["linear_attn_config"].update(changes)
    return raw


@pytest.mark.parametrize("raw, message", [
    (linear(kda_layers=[1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26]),
     ("cfg.json: field 'linear_attn_config' lists layer 4 twice (kda_layers, full_attn_layers); "
     "each layer 1..27 must be in exactly one")),
    (linear(kda_layers=[1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25]),
     ("cfg.json: field 'linear_attn_config' leaves layer 26 out of kda_layers and full_attn_layers; "
     "each layer 1..27 must be in exactly one")),
    (linear(full_attn_layers=[0, 4, 8, 12, 16, 20, 24, 27]),
     "cfg.json: field 'linear_attn_config.full_attn_layers' lists layer 0, outside 1..27 (1-based, num_hidden_layers 27)"),
    (linear(kda_layers="1-3"), "cfg.json: field 'linear_attn_config.kda_layers' must be a list of 1-based layer numbers, got '1-3'"),
    ({**kl.KIMI_LINEAR_48B, "linear_attn_config": None}, "cfg.json: field 'linear_attn_config' must be an object"),
    (linear(short_conv_kernel_size=0), "cfg.json: field 'linear_attn_config.short_conv_kernel_size' must be >= 1, got 0"),
    ({**kl.KIMI_LINEAR_48B, "q_lora_rank": 1536}, "cfg.json: field 'q_lora_rank' must be null"),
    ({**kl.KIMI_LINEAR_48B, "mla_use_nope": False}, "cfg.json: field 'mla_use_nope' must be true"),
])
def test_bad_configs_are_one_line_naming_the_field(raw, message):
    with pytest.raises(StepperError) as e:
        kl.parse(raw, "cfg.json")
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


@pytest.fixture
def checkpoint(tmp_path):
    raw = tiny_config()
    cfg = kl.KimiLinearConfig.from_hf(raw)
    return write_checkpoint(tmp_path / "ckpt", raw, random_weights(cfg))


def rewrite(folder, change) -> None:
    arrays = load_file(str(folder / "model.safetensors"))
    change(arrays)
    save_file(arrays, str(folder / "model.safetensors"))


def test_a_conv_weight_of_the_wrong_shape_is_one_line(checkpoint):
    rewrite(checkpoint, lambda a: a.update({"model.layers.2.self_attn.k_conv1d.weight": np.zeros((16, 4), np.float32)}))
    with pytest.raises(StepperError) as e:
        kl.open_checkpoint(checkpoint).check(range(3), True)
    assert str(e.value) == (f"{checkpoint}: tensor 'model.layers.2.self_attn.k_conv1d.weight' (a causal short conv's "
                            f"taps) has shape [16, 4], expected [16, 1, 4]")


def test_a_missing_a_log_is_one_line(checkpoint):
    rewrite(checkpoint, lambda a: a.pop("model.layers.0.self_attn.A_log"))
    with pytest.raises(StepperError) as e:
        kl.open_checkpoint(checkpoint).check(range(3), True)
    assert str(e.value) == (f"{checkpoint}: tensor 'model.layers.0.self_attn.A_log' (the per-head decay rate's log) "
                            f"is missing, expected [1, 1, 2, 1]")


def test_synth_writes_the_published_layout_and_it_runs(tmp_path):
    raw = kl.PRESETS["tiny-kimi-linear"]
    cfg = kl.preset("tiny-kimi-linear")
    folder = kl.synth(cfg, raw, tmp_path / "tiny", seed=1)
    stored = load_file(str(folder / "model.safetensors"))
    assert set(stored) == set(kl.weight_shapes(cfg))
    assert stored["model.layers.0.self_attn.q_conv1d.weight"].shape == (128, 1, 4)
    assert stored["model.layers.1.block_sparse_moe.experts.15.w2.weight"].shape == (160, 48)
    assert stored["model.layers.3.self_attn.kv_a_proj_with_mqa.weight"].shape == (64 + 16, 160)
    assert str(stored["model.layers.1.self_attn.A_log"].dtype) == "float32"
    assert str(stored["model.layers.1.self_attn.q_proj.weight"].dtype) == "bfloat16"
    weights = kl.open_checkpoint(folder)
    weights.check(range(cfg.num_hidden_layers), True)
    logits = kl.KimiLinear(weights).forward(np.arange(5)[None], Emitter(), kl.new_cache(cfg))
    assert logits.shape == (1, 5, 1000) and np.isfinite(logits).all() and logits.std() > 0.1
