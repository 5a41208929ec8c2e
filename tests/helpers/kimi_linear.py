"""A tiny Kimi Linear checkpoint in the published layout (the names and shapes of
Kimi-Linear-48B-A3B's safetensors), written by a test, and its config."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from stepper.families.kimi_linear import KimiLinearConfig, weight_shapes


def tiny_config(**changes) -> dict:
    """3 layers: KDA (dense MLP), MLA without RoPE (MoE), KDA (MoE); 2 KDA heads of 8 dims, 4 taps."""
    raw = KimiLinearConfig(
        name="tiny-kimi-linear", vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
        num_hidden_layers=3, num_attention_heads=2, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4,
        v_head_dim=8, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
        routed_scaling_factor=2.446, norm_topk_prob=True, first_k_dense_replace=1, rms_norm_eps=1e-5,
        max_position_embeddings=4096, linear_num_heads=2, linear_head_dim=8, short_conv_kernel_size=4,
        kda_layers=(0, 2), full_attn_layers=(1,),
    ).to_hf()
    raw.update(pad_token_id=63, bos_token_id=1, eos_token_id=2)  # inside the tiny vocabulary
    raw.update(changes)
    return raw


def random_weights(cfg: KimiLinearConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Weights of the published shapes at scales that keep every activation in a useful range:
    A_log = log(uniform(1, 16)) and a small dt_bias as Kimi Linear initialises them, norms near 1."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, shape in weight_shapes(cfg).items():
        if name.endswith("A_log"):
            value = np.log(rng.uniform(1, 16, shape))
        elif name.endswith("dt_bias"):
            value = rng.uniform(-6, -2, shape)
        elif name.endswith(("norm.weight", "layernorm.weight")):
            value = 1 + 0.1 * rng.standard_normal(shape)
        elif name.endswith("e_score_correction_bias"):
            value = 0.1 * rng.standard_normal(shape)
        elif name.endswith("conv1d.weight"):
            value = 0.5 * rng.standard_normal(shape)
        else:
            value = rng.standard_normal(shape) / np.sqrt(shape[-1])
        arrays[name] = value.astype(np.float32)
    return arrays


def write_checkpoint(folder: Path, raw: dict, arrays: dict[str, np.ndarray]) -> Path:
    """config.json and one safetensors file (float32) in the published layout."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(raw))
    save_file(arrays, str(folder / "model.safetensors"))
    return folder
