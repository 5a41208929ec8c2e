"""Multi-head Latent Attention (MLA): the naive path of the reference modeling_deepseek.py and
the absorbed path of DeepSeek's inference code.

The query goes through a low-rank bottleneck (q_a -> RMSNorm -> q_b). Keys and values are
compressed jointly into one latent per token (kv_lora_rank dims) plus one rotary key shared by
all heads (qk_rope_head_dim dims); the latent is normalised. Only the rotary dims carry position
(decoupled RoPE).

- naive: kv_b up-projects the latent into per-head keys (nope part) and values; attention runs
  over them. The cache keeps every position's per-head keys and values.
- absorbed: kv_b's key half W_UK is folded into the query (q_nope_absorbed = q_nope W_UK) and its
  value half W_UV is applied after attention, so attention runs over the cached latents
  themselves. The cache keeps one latent and one rotary key per position: the point of MLA.

Shape symbols: B batch, T new positions, S attended positions, H heads, C kv_lora_rank,
R qk_rope_head_dim, P qk_nope_head_dim, V v_head_dim, D hidden_size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepper.config import Config
from stepper.kernels import parallel
from stepper.kernels.linear import linear
from stepper.model.layer_weights import LayerWeights
from stepper.model.ops import causal_mask, rms_norm, softmax
from stepper.model.rope import apply_rope
from stepper.swap import exercise
from stepper.trace import Emitter

GROUP_SCORES = 1 << 20  # attention scores per group of heads run side by side (4 MB in float32)


@dataclass(frozen=True)
class Rope:
    """The rotary angles of the T new positions: cos, sin [T, R/2], and the softmax scale."""

    cos: np.ndarray
    sin: np.ndarray
    softmax_scale: float


@dataclass
class LayerCache:
    """What one layer remembers of earlier positions.

    The latent (compressed_kv_norm) and the roped shared key are kept by both paths; the naive
    path also keeps the per-head keys and values it attended over.
    """

    latent: np.ndarray | None = None  # [B, S, C]
    k_pe: np.ndarray | None = None  # [B, 1, S, R], after RoPE
    key_states: np.ndarray | None = None  # [B, H, S, P+R], naive path
    value_states: np.ndarray | None = None  # [B, H, S, V], naive path

    @property
    def length(self) -> int:
        return 0 if self.latent is None else self.latent.shape[1]

    def extend_latent(self, latent: np.ndarray, k_pe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.latent = latent if self.latent is None else np.concatenate([self.latent, latent], axis=1)
        self.k_pe = k_pe if self.k_pe is None else np.concatenate([self.k_pe, k_pe], axis=2)
        return self.latent, self.k_pe

    def extend_heads(self, keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.key_states is not None:
            keys = np.concatenate([self.key_states, keys], axis=2)
            values = np.concatenate([self.value_states, values], axis=2)
        self.key_states, self.value_states = keys, values
        return keys, values


def cache_bytes_per_token(cfg: Config, path: str, itemsize: int = 4) -> int:
    """Bytes one layer caches per position: per-head keys and values, or one latent + rope key."""
    if path == "naive":
        return cfg.num_attention_heads * (cfg.qk_head_dim + cfg.v_head_dim) * itemsize
    return (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * itemsize


def mla_attention(
    x: np.ndarray, w: LayerWeights, cfg: Config, rope: Rope, cache: LayerCache | None, emit: Emitter,
    path: str = "naive",
) -> np.ndarray:
    """x [B, T, D] (after input_layernorm) -> o_proj output [B, T, D]."""
    cache = LayerCache() if cache is None else cache
    q_nope, q_pe = query_heads(x, w, cfg, emit)  # [B, H, T, P], [B, H, T, R]
    compressed_kv, k_pe = latent(x, w, cfg, emit)  # [B, T, C], [B, 1, T, R]
    if path == "absorb":
        out = absorbed(q_nope, q_pe, compressed_kv, k_pe, w, cfg, rope, cache, emit)
    else:
        out = naive(q_nope, q_pe, compressed_kv, k_pe, w, cfg, rope, cache, emit)
    return output_projection(out, w, emit)  # out: [B, H, T, V]


def naive(q_nope, q_pe, compressed_kv, k_pe, w, cfg, rope, cache: LayerCache, emit: Emitter) -> np.ndarray:
    """Up-project the new latents into per-head keys and values, attend over all of them."""
    k_nope, values = up_project(compressed_kv, w, cfg, emit)  # [B, H, T, P], [B, H, T, V]
    q_pe, k_pe = rotate(q_pe, k_pe, rope, emit)
    cache.extend_latent(compressed_kv, k_pe)

    query = np.concatenate([q_nope, q_pe], axis=-1)  # [B, H, T, P+R]
    emit("self_attn.query_states", query)
    keys = np.concatenate([k_nope, np.broadcast_to(k_pe, (*k_nope.shape[:3], k_pe.shape[-1]))], axis=-1)
    keys, values = cache.extend_heads(keys, values)  # [B, H, S, P+R], [B, H, S, V]
    emit("self_attn.key_states", keys)
    emit("self_attn.value_states", values)
    return attend(lambda h: np.matmul(query[:, h], keys[:, h].swapaxes(-1, -2)),  # [B, h, T, S]
                  lambda h, weights: np.matmul(weights, values[:, h]), query.shape, rope.softmax_scale, emit)


@exercise
def absorbed(q_nope, q_pe, compressed_kv, k_pe, w, cfg, rope, cache: LayerCache, emit: Emitter) -> np.ndarray:
    """Attend over the cached latents: W_UK folded into the query, W_UV applied afterwards."""
    w_uk, w_uv = split_kv_b(w.float32("self_attn.kv_b_proj.weight"), cfg)  # [H, P, C], [H, V, C] (float32: small)
    q_latent = np.matmul(q_nope, w_uk)  # [B, H, T, C]
    emit("self_attn.q_nope_absorbed", q_latent)
    q_pe, k_pe = rotate(q_pe, k_pe, rope, emit)
    latents, k_pes = cache.extend_latent(compressed_kv, k_pe)  # [B, S, C], [B, 1, S, R]

    k_pes = k_pes[:, 0]  # [B, S, R]: like the latents, shared by every head
    # Every head's rows go into one product with what the heads share (64 matrix-vector
    # products per decode step took 6.6 ms, one 64-row product 2.5 ms).
    out_latent = attend(  # [B, H, T, C]
        lambda h: heads_of(np.matmul(head_rows(q_latent[:, h]), latents.swapaxes(-1, -2))
                           + np.matmul(head_rows(q_pe[:, h]), k_pes.swapaxes(-1, -2)), q_latent.shape[2]),
        lambda h, weights: heads_of(np.matmul(head_rows(weights), latents), q_latent.shape[2]),
        q_latent.shape, rope.softmax_scale, emit)
    emit("self_attn.attn_output_latent", out_latent)
    return np.matmul(out_latent, w_uv.swapaxes(-1, -2))  # [B, H, T, V]


def head_rows(x: np.ndarray) -> np.ndarray:
    """The rows of every head in one matrix.  [B, h, T, X] -> [B, h*T, X]"""
    return x.reshape(x.shape[0], -1, x.shape[-1])


def heads_of(rows: np.ndarray, t: int) -> np.ndarray:
    """Back to heads.  [B, h*T, X] -> [B, h, T, X]"""
    return rows.reshape(rows.shape[0], -1, t, rows.shape[-1])


def split_kv_b(kv_b: np.ndarray, cfg: Config) -> tuple[np.ndarray, np.ndarray]:
    """kv_b_proj [H*(P+V), C] -> its key half W_UK [H, P, C] and value half W_UV [H, V, C]."""
    per_head = kv_b.reshape(cfg.num_attention_heads, cfg.qk_nope_head_dim + cfg.v_head_dim, cfg.kv_lora_rank)
    return per_head[:, : cfg.qk_nope_head_dim], per_head[:, cfg.qk_nope_head_dim :]


def rotate(q_pe: np.ndarray, k_pe: np.ndarray, rope: Rope, emit: Emitter) -> tuple[np.ndarray, np.ndarray]:
    """Decoupled RoPE on the query's and the shared key's rotary dims."""
    q_pe = apply_rope(q_pe, rope.cos, rope.sin)
    emit("self_attn.q_pe_rope", q_pe)
    k_pe = apply_rope(k_pe, rope.cos, rope.sin)
    emit("self_attn.k_pe_rope", k_pe)
    return q_pe, k_pe


def query_heads(x: np.ndarray, w: LayerWeights, cfg: Config, emit: Emitter) -> tuple[np.ndarray, np.ndarray]:
    """q = q_b(RMSNorm(q_a(x))) split per head into its nope and rope parts."""
    B, T, _ = x.shape
    if cfg.q_lora_rank is None:
        q = linear(x, w.matrix("self_attn.q_proj.weight"))
    else:
        q_a = linear(x, w.matrix("self_attn.q_a_proj.weight"))  # [B, T, q_lora_rank]
        emit("self_attn.q_a", q_a)
        q_a = rms_norm(q_a, w("self_attn.q_a_layernorm.weight"), cfg.rms_norm_eps)
        emit("self_attn.q_a_norm", q_a)
        q = linear(q_a, w.matrix("self_attn.q_b_proj.weight"))  # [B, T, H*(P+R)]
    q = q.reshape(B, T, cfg.num_attention_heads, cfg.qk_head_dim).transpose(0, 2, 1, 3)  # [B, H, T, P+R]
    emit("self_attn.q", q)
    q_nope, q_pe = q[..., : cfg.qk_nope_head_dim], q[..., cfg.qk_nope_head_dim :]
    emit("self_attn.q_nope", q_nope)
    emit("self_attn.q_pe", q_pe)
    return q_nope, q_pe


@exercise
def latent(x: np.ndarray, w: LayerWeights, cfg: Config, emit: Emitter) -> tuple[np.ndarray, np.ndarray]:
    """The joint down-projection: one kv latent per token, normalised, plus the shared rotary key."""
    B, T, _ = x.shape
    kv_a = linear(x, w.matrix("self_attn.kv_a_proj_with_mqa.weight"))  # [B, T, C+R]
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
    kv = linear(compressed_kv, w.matrix("self_attn.kv_b_proj.weight"))  # [B, T, H*(P+V)]
    kv = kv.reshape(B, T, cfg.num_attention_heads, cfg.qk_nope_head_dim + cfg.v_head_dim).transpose(0, 2, 1, 3)
    emit("self_attn.kv", kv)  # [B, H, T, P+V]
    k_nope, values = kv[..., : cfg.qk_nope_head_dim], kv[..., cfg.qk_nope_head_dim :]
    emit("self_attn.k_nope", k_nope)
    return k_nope, values


def attend(scores_of, weigh_values, shape: tuple[int, ...], scale: float, emit: Emitter) -> np.ndarray:
    """Attention weights from the scores of heads h, scores_of(h) [B, h, T, S], then the values
    weighed by them, weigh_values(h, weights) [B, h, T, V]; query `shape` [B, H, T, *].

    Large attention (a prefill) runs in groups of heads, side by side on the cores: BLAS and
    NumPy's loops let go of the GIL, so threads share the work (64 heads, 512 tokens: 0.27 s at
    once, 0.19 s in groups on two cores)."""
    B, H, T, _ = shape
    per_group = max(1, GROUP_SCORES // max(1, B * T * T))  # heads per group (S >= T)
    groups = [slice(h, min(h + per_group, H)) for h in range(0, H, per_group)]
    if len(groups) == 1 or parallel.cores() == 1:
        return weigh_values(slice(None), attention_weights(scores_of(slice(None)), scale, emit))
    first = groups[0]
    first_scores, first_weights = masked_softmax(scores_of(first), scale)
    first_out = weigh_values(first, first_weights)
    # The whole arrays, each group writing its heads into them: with the page cache full of a
    # checkpoint, fresh large arrays fault in slowly, so nothing is concatenated afterwards. The
    # scores and weights (134 MB for 64 heads of 512 tokens) are kept only to be shown.
    shown = emit.listening
    kept = (first_out, first_scores, first_weights) if shown else (first_out,)
    out, *scores_weights = (np.empty((B, H, *a.shape[2:]), a.dtype) for a in kept)
    for whole, part in zip((out, *scores_weights), kept):
        whole[:, first] = part

    def run(share: list[slice]) -> None:
        for h in share:
            group_scores, group_weights = masked_softmax(scores_of(h), scale)
            out[:, h] = weigh_values(h, group_weights)
            if shown:
                scores_weights[0][:, h], scores_weights[1][:, h] = group_scores, group_weights

    parallel.split(groups[1:], run)
    if shown:
        emit("self_attn.attn_scores", scores_weights[0])
        emit("self_attn.attn_weights", scores_weights[1])
    return out


def attention_weights(scores: np.ndarray, scale: float, emit: Emitter) -> np.ndarray:
    """Scale, mask the future, softmax over the attended positions.  [B, H, T, S] -> same."""
    scores, weights = masked_softmax(scores, scale)
    emit("self_attn.attn_scores", scores)
    emit("self_attn.attn_weights", weights)
    return weights


def masked_softmax(scores: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """The scaled scores with the future masked, and their softmax.  [B, H, T, S] -> both"""
    T, S = scores.shape[-2:]
    scores = scores * np.float32(scale)
    np.copyto(scores, np.float32(-np.inf), where=~causal_mask(T, S))
    return scores, softmax(scores)


def output_projection(out: np.ndarray, w: LayerWeights, emit: Emitter) -> np.ndarray:
    """Merge the heads and project back to the hidden size.  [B, H, T, V] -> [B, T, D]"""
    B, H, T, V = out.shape
    merged = out.transpose(0, 2, 1, 3).reshape(B, T, H * V)  # [B, T, H*V]
    emit("self_attn.attn_output", merged)
    projected = linear(merged, w.matrix("self_attn.o_proj.weight"))
    emit("self_attn.o_proj", projected)
    return projected
