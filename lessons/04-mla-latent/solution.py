"""Lesson 4 (mla-latent): the joint KV down-projection, split into the latent and the shared rotary key."""

from stepper.kernels.linear import linear
from stepper.model.attention import LATENT_NORM_EPS
from stepper.model.ops import rms_norm


def latent(x, w, cfg, emit):
    """x [B, T, D] (after input_layernorm) -> (compressed_kv_norm [B, T, C], k_pe [B, 1, T, R])."""
    B, T, _ = x.shape
    kv_a = linear(x, w.matrix("self_attn.kv_a_proj_with_mqa.weight"))  # [B, T, C + R]
    emit("self_attn.kv_a", kv_a)
    compressed_kv = kv_a[..., : cfg.kv_lora_rank]  # [B, T, C]
    emit("self_attn.compressed_kv", compressed_kv)
    k_pe = kv_a[..., cfg.kv_lora_rank :].reshape(B, T, 1, cfg.qk_rope_head_dim).transpose(0, 2, 1, 3)  # [B, 1, T, R]
    emit("self_attn.k_pe", k_pe)
    compressed_kv = rms_norm(compressed_kv, w("self_attn.kv_a_layernorm.weight"), LATENT_NORM_EPS)
    emit("self_attn.compressed_kv_norm", compressed_kv)
    return compressed_kv, k_pe
