"""MLA without RoPE: Kimi Linear's full-attention layers.

The same projections as DeepSeek's MLA (stepper.model.attention: the query, the joint latent with
its `rope` dims, the up-projection, the output projection), but no position is rotated in: the
`rope` dims of the query and the shared key enter the scores as they come out of the projections
(transformers' KimiLinearAttention concatenates them unrotated). Positions are told apart only by
the causal mask and by the KDA layers around it. The softmax scale is qk_head_dim^-0.5.

naive: per-head keys and values are up-projected and cached; absorbed: W_UK is folded into the
query and W_UV applied after, attending over the cached latents (see stepper.model.attention).
"""

from __future__ import annotations

import numpy as np

from stepper.kernels import attention as kernels
from stepper.model.attention import attend, latent, output_projection, query_heads, split_kv_b, up_project
from stepper.model.cache import LayerCache
from stepper.model.layer_weights import LayerWeights
from stepper.model.options import LayerOptions
from stepper.seams.trace import Emitter


def mla_nope_attention(x: np.ndarray, w: LayerWeights, cache: LayerCache | None, options: LayerOptions,
                       emit: Emitter) -> np.ndarray:
    """x [B, T, d] (after input_layernorm) -> o_proj output [B, T, d] on the options' attention
    path (naive or absorb). w carries the config; its rotary tables go unused."""
    cfg = w.cfg
    cache = LayerCache() if cache is None else cache
    q_nope, q_pe = query_heads(x, w, cfg, emit)  # [B, H, T, nope], [B, H, T, rope]
    compressed_kv, k_pe = latent(x, w, cfg, emit)  # [B, T, kv_lora], [B, one, T, rope]
    attend_over = absorbed if options.attention == "absorb" else naive
    out = attend_over(q_nope, q_pe, compressed_kv, k_pe, w, cfg, cache, emit)  # [B, H, T, v_head]
    return output_projection(out, w, emit)


def naive(q_nope, q_pe, compressed_kv, k_pe, w, cfg, cache: LayerCache, emit: Emitter) -> np.ndarray:
    """Per-head keys (k_nope, then the shared k_pe) and values over every cached position.  -> [B, H, T, v_head]"""
    k_nope, value_states = up_project(compressed_kv, w, cfg, emit)  # [B, H, T, nope], [B, H, T, v_head]
    cache.extend_latent(compressed_kv, k_pe)
    query_states = emit("self_attn.query_states", np.concatenate([q_nope, q_pe], axis=-1))  # [B, H, T, qk_head]
    k_pe_per_head = np.broadcast_to(k_pe, (*k_nope.shape[:3], k_pe.shape[-1]))  # [B, H, T, rope]
    key_states = np.concatenate([k_nope, k_pe_per_head], axis=-1)  # [B, H, T, qk_head]
    key_states, value_states = cache.extend_heads(key_states, value_states)  # [B, H, S, qk_head], [B, H, S, v_head]
    key_states = emit("self_attn.key_states", key_states)
    value_states = emit("self_attn.value_states", value_states)
    return attend(kernels.Operands([query_states], [key_states], value_states, softmax_scale(cfg)), emit)


def absorbed(q_nope, q_pe, compressed_kv, k_pe, w, cfg, cache: LayerCache, emit: Emitter) -> np.ndarray:
    """Attend over the cached latents and the shared unrotated keys.  -> [B, H, T, v_head]"""
    w_uk, w_uv = split_kv_b(w.float32("self_attn.kv_b_proj.weight"), cfg)  # [H, nope, kv_lora], [H, v_head, kv_lora]
    q_latent = emit("self_attn.q_nope_absorbed", np.matmul(q_nope, w_uk))  # [B, H, T, kv_lora]
    latents, k_pes = cache.extend_latent(compressed_kv, k_pe)  # [B, S, kv_lora], [B, one, S, rope]
    shared = latents[:, None]  # [B, one, S, kv_lora]: keys and values alike
    ops = kernels.Operands([q_latent, q_pe], [shared, k_pes], shared, softmax_scale(cfg))
    out_latent = emit("self_attn.attn_output_latent", attend(ops, emit))  # [B, H, T, kv_lora]
    return np.matmul(out_latent, w_uv.swapaxes(-1, -2))  # [B, H, T, v_head]


def softmax_scale(cfg) -> float:
    return cfg.qk_head_dim**-0.5
