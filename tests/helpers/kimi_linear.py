"""A tiny Kimi Linear model in the published layout (the names and shapes of Kimi-Linear-48B-A3B's
safetensors), its config, its weights in memory, and the checkpoint `stepper synth` writes of it."""

from __future__ import annotations

from pathlib import Path

from stepper import families
from stepper.families.kimi_linear import KimiLinearConfig
from stepper.model.kimi_linear_layer import PublishedLayerWeights, published
from stepper.model.layer_weights import LayerWeights
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.source import ArrayWeights
from stepper.weights.synth_checkpoint import synth_checkpoint


def tiny_config(**changes) -> dict:
    """3 layers: KDA (dense MLP), MLA without RoPE (MoE), KDA (MoE); 2 KDA heads of 8 dims, 4 taps."""
    raw = KimiLinearConfig(
        name="tiny-kimi-linear-3", vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
        num_hidden_layers=3, num_attention_heads=2, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4,
        v_head_dim=8, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
        routed_scaling_factor=2.446, norm_topk_prob=True, first_k_dense_replace=1, rms_norm_eps=1e-5,
        max_position_embeddings=4096, linear_num_heads=2, linear_head_dim=8, short_conv_kernel_size=4,
        kda_layers=(0, 2), full_attn_layers=(1,), bos_token_id=1, eos_token_id=2, pad_token_id=63,
    ).to_hf()
    raw.update(changes)
    return raw


def config(raw: dict | None = None) -> KimiLinearConfig:
    return families.read_config(tiny_config() if raw is None else raw, "tiny config")


def layer_weights(cfg: KimiLinearConfig, layer: int = 0, seed: int = 3) -> PublishedLayerWeights:
    """Layer `layer`'s synthetic weights, asked for by the parts' names (as the decoder layer does)."""
    source = SyntheticWeights(cfg, seed)
    arrays = {name: source.get(name) for name in cfg.layer_shapes(layer)}
    return published(LayerWeights(ArrayWeights(cfg, arrays), layer))


def write_checkpoint(folder: Path, raw: dict, seed: int = 0) -> Path:
    """`stepper synth`'s checkpoint of the config (BF16 weights, A_log, dt_bias and the router's bias
    F32; config.json as the family writes it, token ids included)."""
    synth_checkpoint(SyntheticWeights(config(raw), seed), folder, force=True)
    return folder
