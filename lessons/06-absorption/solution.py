"""Lesson 6 (absorption): Multi-head Latent Attention over the cached latents, W_UK and W_UV absorbed."""

import numpy as np

from stepper.model.attention import attention_weights, rotate, split_kv_b


def absorbed(q_nope, q_pe, compressed_kv, k_pe, w, cfg, rope, cache, emit, mask=None):
    """Attention over the cached latents.  -> [B, H, T, V] (the heads' outputs, before merging)"""
    w_uk, w_uv = split_kv_b(w("self_attn.kv_b_proj.weight"), cfg)  # [H, P, C], [H, V, C]
    q_latent = np.matmul(q_nope, w_uk)  # [B, H, T, C]
    emit("self_attn.q_nope_absorbed", q_latent)
    q_pe, k_pe = rotate(q_pe, k_pe, rope, emit)
    latents, k_pes = cache.extend_latent(compressed_kv, k_pe)  # [B, S, C], [B, 1, S, R]

    # Every head attends over the same latents and rotary keys, so all H*T query rows go into one
    # product with them (a decode step: one 64-row product instead of 64 one-row ones).
    B, H, T, C = q_latent.shape
    scores = (np.matmul(q_latent.reshape(B, H * T, C), latents.swapaxes(-1, -2))  # [B, H*T, S]
              + np.matmul(q_pe.reshape(B, H * T, -1), k_pes[:, 0].swapaxes(-1, -2))).reshape(B, H, T, -1)
    weights = attention_weights(scores, rope.softmax_scale, emit, mask)  # [B, H, T, S]
    out_latent = np.matmul(weights.reshape(B, H * T, -1), latents).reshape(B, H, T, C)
    emit("self_attn.attn_output_latent", out_latent)
    return np.matmul(out_latent, w_uv.swapaxes(-1, -2))  # [B, H, T, V]
