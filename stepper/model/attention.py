"""Multi-head Latent Attention (MLA), the naive path of the reference modeling_deepseek.py.

The query goes through a low-rank bottleneck (q_a -> RMSNorm -> q_b). Keys and values are
compressed jointly into one latent per token (kv_lora_rank dims) plus one rotary key shared by
all heads (qk_rope_head_dim dims); the latent is normalised and up-projected into per-head keys
(nope part) and values. Only the rotary dims carry position (decoupled RoPE).

Shape symbols: B batch, T new positions, S attended positions, H heads, C kv_lora_rank,
R qk_rope_head_dim, P qk_nope_head_dim, V v_head_dim, D hidden_size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import Config
from ..ops import apply_rope, causal_mask, linear, rms_norm, softmax
from ..trace import Emitter
from .layer_weights import LayerWeights


@dataclass(frozen=True)
class Rope:
    """The rotary angles of the T new positions: cos, sin [T, R/2], and the softmax scale."""

    cos: np.ndarray
    sin: np.ndarray
    softmax_scale: float


@dataclass
class HeadCache:
    """The naive path's cache: every attended position's per-head keys and values."""

    key_states: np.ndarray | None = None  # [B, H, S, P+R]
    value_states: np.ndarray | None = None  # [B, H, S, V]

    def extend(self, keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.key_states is not None:
            keys = np.concatenate([self.key_states, keys], axis=2)
            values = np.concatenate([self.value_states, values], axis=2)
        self.key_states, self.value_states = keys, values
        return keys, values


def mla_attention(
    x: np.ndarray, w: LayerWeights, cfg: Config, rope: Rope, cache: HeadCache | None, emit: Emitter
) -> np.ndarray:
    """x [B, T, D] (after input_layernorm) -> o_proj output [B, T, D]."""
    q_nope, q_pe = query_heads(x, w, cfg, emit)  # [B, H, T, P], [B, H, T, R]
    compressed_kv, k_pe = latent(x, w, cfg, emit)  # [B, T, C], [B, 1, T, R]
    k_nope, values = up_project(compressed_kv, w, cfg, emit)  # [B, H, T, P], [B, H, T, V]

    q_pe = apply_rope(q_pe, rope.cos, rope.sin)
    emit("self_attn.q_pe_rope", q_pe)
    k_pe = apply_rope(k_pe, rope.cos, rope.sin)
    emit("self_attn.k_pe_rope", k_pe)

    query = np.concatenate([q_nope, q_pe], axis=-1)  # [B, H, T, P+R]
    emit("self_attn.query_states", query)
    keys = np.concatenate([k_nope, np.broadcast_to(k_pe, (*k_nope.shape[:3], k_pe.shape[-1]))], axis=-1)
    if cache is not None:
        keys, values = cache.extend(keys, values)  # [B, H, S, P+R], [B, H, S, V]
    emit("self_attn.key_states", keys)
    emit("self_attn.value_states", values)

    out = attend(query, keys, values, rope.softmax_scale, emit)  # [B, H, T, V]
    return output_projection(out, w, emit)


def query_heads(x: np.ndarray, w: LayerWeights, cfg: Config, emit: Emitter) -> tuple[np.ndarray, np.ndarray]:
    """q = q_b(RMSNorm(q_a(x))) split per head into its nope and rope parts."""
    B, T, _ = x.shape
    if cfg.q_lora_rank is None:
        q = linear(x, w("self_attn.q_proj.weight"))
    else:
        q_a = linear(x, w("self_attn.q_a_proj.weight"))  # [B, T, q_lora_rank]
        emit("self_attn.q_a", q_a)
        q_a = rms_norm(q_a, w("self_attn.q_a_layernorm.weight"), cfg.rms_norm_eps)
        emit("self_attn.q_a_norm", q_a)
        q = linear(q_a, w("self_attn.q_b_proj.weight"))  # [B, T, H*(P+R)]
    q = q.reshape(B, T, cfg.num_attention_heads, cfg.qk_head_dim).transpose(0, 2, 1, 3)  # [B, H, T, P+R]
    emit("self_attn.q", q)
    q_nope, q_pe = q[..., : cfg.qk_nope_head_dim], q[..., cfg.qk_nope_head_dim :]
    emit("self_attn.q_nope", q_nope)
    emit("self_attn.q_pe", q_pe)
    return q_nope, q_pe


def latent(x: np.ndarray, w: LayerWeights, cfg: Config, emit: Emitter) -> tuple[np.ndarray, np.ndarray]:
    """The joint down-projection: one kv latent per token, normalised, plus the shared rotary key."""
    B, T, _ = x.shape
    kv_a = linear(x, w("self_attn.kv_a_proj_with_mqa.weight"))  # [B, T, C+R]
    emit("self_attn.kv_a", kv_a)
    compressed_kv = kv_a[..., : cfg.kv_lora_rank]  # [B, T, C]
    emit("self_attn.compressed_kv", compressed_kv)
    k_pe = kv_a[..., cfg.kv_lora_rank :].reshape(B, T, 1, cfg.qk_rope_head_dim).transpose(0, 2, 1, 3)  # [B, 1, T, R]
    emit("self_attn.k_pe", k_pe)
    compressed_kv = rms_norm(compressed_kv, w("self_attn.kv_a_layernorm.weight"), cfg.rms_norm_eps)
    emit("self_attn.compressed_kv_norm", compressed_kv)
    return compressed_kv, k_pe


def up_project(compressed_kv: np.ndarray, w: LayerWeights, cfg: Config, emit: Emitter) -> tuple[np.ndarray, np.ndarray]:
    """kv_b turns each token's latent into per-head keys (nope part) and values."""
    B, T, _ = compressed_kv.shape
    kv = linear(compressed_kv, w("self_attn.kv_b_proj.weight"))  # [B, T, H*(P+V)]
    kv = kv.reshape(B, T, cfg.num_attention_heads, cfg.qk_nope_head_dim + cfg.v_head_dim).transpose(0, 2, 1, 3)
    emit("self_attn.kv", kv)  # [B, H, T, P+V]
    k_nope, values = kv[..., : cfg.qk_nope_head_dim], kv[..., cfg.qk_nope_head_dim :]
    emit("self_attn.k_nope", k_nope)
    return k_nope, values


def attend(query: np.ndarray, keys: np.ndarray, values: np.ndarray, scale: float, emit: Emitter) -> np.ndarray:
    """softmax(q k^T * scale, causal) v.  [B, H, T, P+R], [B, H, S, P+R], [B, H, S, V] -> [B, H, T, V]"""
    T, S = query.shape[2], keys.shape[2]
    scores = np.matmul(query, keys.swapaxes(-1, -2)) * np.float32(scale)  # [B, H, T, S]
    scores = np.where(causal_mask(T, S), scores, np.float32(-np.inf))
    emit("self_attn.attn_scores", scores)
    weights = softmax(scores)
    emit("self_attn.attn_weights", weights)
    return np.matmul(weights, values)


def output_projection(out: np.ndarray, w: LayerWeights, emit: Emitter) -> np.ndarray:
    """Merge the heads and project back to the hidden size.  [B, H, T, V] -> [B, T, D]"""
    B, H, T, V = out.shape
    merged = out.transpose(0, 2, 1, 3).reshape(B, T, H * V)  # [B, T, H*V]
    emit("self_attn.attn_output", merged)
    projected = linear(merged, w("self_attn.o_proj.weight"))
    emit("self_attn.o_proj", projected)
    return projected
