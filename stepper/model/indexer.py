"""DeepSeek-V3.2's Lightning Indexer: a mask producer in front of the same MLA attention.

For each query, small index heads score every earlier position, and attention may look only at
the index_topk best (DeepSeek Sparse Attention). The indexer has its own projections: queries
from MLA's query latent q_a_norm (wq_b, index_n_heads heads of index_head_dim), one key per
token (wk, then a LayerNorm with a bias), and a per-token weight for each head (weights_proj).
RoPE rotates the first qk_rope_head_dim dims of each, as two halves (not MLA's interleaved
pairs), with MLA's angles (GLM-5: interleaved pairs; Hy4: the last qk_rope_head_dim dims). The
score of key s for query t is the sum over heads of w_h * relu(q_h . k_s) * index_head_dim^-0.5;
the future is masked; the best index_topk are kept.
The result is an additive mask, 0 where attention may look, -inf elsewhere, and the indexer's
keys have their own cache.

transformers' deepseek_v32, which this follows, scores in float32 ("exact" scoring). DeepSeek's
inference code rotates q and k by a Hadamard transform and scores them in FP8 (model.index_fp8):
with scoring "fp8" the indexer keeps the positions those scores choose, and says per query how
many of the positions the exact scores keep it kept too.

q_a_norm is recomputed here from x (one more q_lora x d product per token, equal bit for bit to
self_attn.q_a_norm), so that the attention it feeds stays unchanged but for its mask.

Shapes name the catalogue's dimensions: B batch, T new positions, S attended positions, d hidden,
Hi index heads, Di index head dims, Ki kept positions, rope the rotary dims.
"""

from __future__ import annotations

import numpy as np

from stepper.config import Config
from stepper.kernels.linear import linear
from stepper.model.attention import LATENT_NORM_EPS
from stepper.model.cache import LayerCache
from stepper.model.index_fp8 import fp8_index_scores
from stepper.model.layer_weights import LayerWeights
from stepper.model.ops import causal_mask, rms_norm
from stepper.model.options import LayerOptions
from stepper.model.query_scale import learned_scale
from stepper.model.rope import Rope, apply_rope
from stepper.model.rope import rotate_halves as rope_halves
from stepper.seams.swap import exercise
from stepper.seams.trace import Emitter


def index_mask(x: np.ndarray, w: LayerWeights, cache: LayerCache, options: LayerOptions, emit: Emitter) -> np.ndarray:
    """x [B, T, d] (after input_layernorm) -> the additive mask [B, T, S] of the positions each
    query may attend; the options' index scoring "exact" (float32) or "fp8" (DeepSeek's kernel).
    w carries the config and the rotary tables."""
    cfg, rope = w.cfg, w.rope
    q = index_queries(x, w, cfg, emit)  # [B, Hi, T, Di]
    k = index_key(x, w, emit)  # [B, T, Di]
    if cfg.rope_dims(w.layer):  # none in a NoPE layer (Mistral Large 4)
        q = emit("self_attn.indexer.q_rope", rotate_index(q, rope, cfg))  # [B, Hi, T, Di]
        k = emit("self_attn.indexer.k_rope", rotate_index(k, rope, cfg))  # [B, T, Di]
    keys = emit("self_attn.indexer.keys", cache.extend_index_keys(k))  # [B, S, Di]
    head_weights = linear(x, w.matrix("self_attn.indexer.weights_proj.weight")) * np.float32(cfg.index_n_heads**-0.5)
    head_weights = emit("self_attn.indexer.head_weights", head_weights)  # [B, T, Hi]
    if options.index_scoring == "fp8":
        scores, exact_idx = fp8_scores_beside_exact(q, k, keys, head_weights, cfg, cache, emit)  # [B, T, S], [B, T, Ki]
    else:
        scores, exact_idx = index_scores(q, keys, head_weights), None
    scores = emit("self_attn.indexer.index_scores", scores)  # [B, T, S]
    topk_idx = emit.choice("self_attn.indexer.topk_idx", chosen_positions(scores, cfg.index_topk), keys.shape[1],
                           "positions", none=True)  # [B, T, Ki]
    cache.index_choice = topk_idx  # what a next layer that reuses it attends (GLM-5)
    mask = mask_of(topk_idx, keys.shape[1])  # [B, T, S]
    if exact_idx is not None:
        emit.shown("self_attn.indexer.kept_of_exact", kept_of_exact(mask, mask_of(exact_idx, keys.shape[1])))  # [B, T]
    return emit("self_attn.indexer.mask", mask)


def fp8_scores_beside_exact(q: np.ndarray, k: np.ndarray, keys: np.ndarray, head_weights: np.ndarray, cfg: Config,
                            cache: LayerCache, emit: Emitter) -> tuple[np.ndarray, np.ndarray]:
    """DeepSeek's FP8 index scores, and the positions the exact scores would choose.
    q [B, Hi, T, Di], k [B, T, Di], keys [B, S, Di], head_weights [B, T, Hi] -> [B, T, S], [B, T, Ki]"""
    scores = fp8_index_scores(q, k, head_weights, cache, emit)  # [B, T, S]
    exact = emit("self_attn.indexer.exact_index_scores", index_scores(q, keys, head_weights))  # [B, T, S]
    return scores, emit("self_attn.indexer.exact_topk_idx", chosen_positions(exact, cfg.index_topk))


def index_queries(x: np.ndarray, w: LayerWeights, cfg: Config, emit: Emitter) -> np.ndarray:
    """q = wq_b(q_a_norm) split into the index heads; Mistral Large 4's wq_b(LayerNorm(x)), each
    index head's queries then times its learned scale at their position.  [B, T, d] -> [B, Hi, T, Di]"""
    B, T, _ = x.shape
    if cfg.indexer_query_from_hidden:
        norm = "self_attn.indexer.q_input_norm."
        source = emit("self_attn.indexer.q_input_norm",
                      layer_norm(x, w(norm + "weight"), w(norm + "bias"), cfg.indexer_norm_eps))  # [B, T, d]
    else:
        q_a = linear(x, w.matrix("self_attn.q_a_proj.weight"))  # [B, T, q_lora], as MLA's query makes it
        source = rms_norm(q_a, w("self_attn.q_a_layernorm.weight"), LATENT_NORM_EPS)  # as attention's q_a_norm
    q = linear(source, w.matrix("self_attn.indexer.wq_b.weight"))  # [B, T, Hi*Di]
    q = q.reshape(B, T, cfg.index_n_heads, cfg.index_head_dim).transpose(0, 2, 1, 3)
    q = emit("self_attn.indexer.q", q)
    if not cfg.learned_query_scale:
        return q
    factor = emit("self_attn.indexer.softmax_scaling", learned_scale(w, "self_attn.indexer.", w.rope.log_positions))
    return emit("self_attn.indexer.q_scaled", q * factor[..., None])  # [B, Hi, T, Di] times [Hi, T, 1]


def index_key(x: np.ndarray, w: LayerWeights, emit: Emitter) -> np.ndarray:
    """One key per token, shared by the index heads: LayerNorm(wk(x)).  [B, T, d] -> [B, T, Di]"""
    k = emit("self_attn.indexer.k", linear(x, w.matrix("self_attn.indexer.wk.weight")))  # [B, T, Di]
    eps = w.cfg.indexer_norm_eps  # DeepSeek's LayerNorm default (not in config.json); Hy4's rms_norm_eps
    k = layer_norm(k, w("self_attn.indexer.k_norm.weight"), w("self_attn.indexer.k_norm.bias"), eps)
    return emit("self_attn.indexer.k_norm", k)


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis (the biased variance).  [..., Di] -> same"""
    centred = x - np.mean(x, axis=-1, keepdims=True)
    variance = np.mean(np.square(centred), axis=-1, keepdims=True)
    return centred / np.sqrt(variance + np.float32(eps)) * weight + bias


def rotate_index(x: np.ndarray, rope: Rope, cfg: Config) -> np.ndarray:
    """RoPE on the first qk_rope_head_dim dims of each index head: two halves (V3.2) or, GLM-5's
    indexer, interleaved pairs, laid out (rotated evens, then rotated odds) as MLA lays them; Hy4's
    on the last qk_rope_head_dim dims, two halves.  [..., T, Di] -> same"""
    dims = cfg.qk_rope_head_dim
    if cfg.indexer_rope_last:
        rest = x.shape[-1] - dims
        return np.concatenate([x[..., :rest], rotate_halves(x[..., rest:], rope, dims)], axis=-1)
    if not cfg.indexer_rope_interleave:
        return rotate_halves(x, rope, dims)
    return np.concatenate([apply_rope(x[..., :dims], rope.cos, rope.sin), x[..., dims:]], axis=-1)


def reused_index_mask(cache: LayerCache, T: int, layer: int, emit: Emitter) -> np.ndarray:
    """GLM-5's "shared" layer: no indexer of its own, the positions the layer before it chose for
    these queries (its own choice, or the one it reused; cache.previous is that layer's cache).
    A shared layer run alone has no such choice (the session refuses that; what a layer emits is
    learned from one run alone, families.derive): it keeps every earlier position.  -> [B, T, S]"""
    S = cache.length + T
    previous = cache.previous.index_choice if cache.previous is not None else None
    if previous is None:  # [B, T, Ki]: every position up to each query's own
        previous = np.where(causal_mask(T, S), np.arange(S), -1)[None].astype(np.int64)
    topk_idx = emit.choice("self_attn.indexer.reused_topk_idx", previous, S, "positions", none=True)  # [B, T, Ki]
    cache.index_choice = topk_idx
    return emit("self_attn.indexer.reused_mask", mask_of(topk_idx, S))  # [B, T, S]


def rotate_halves(x: np.ndarray, rope: Rope, dims: int) -> np.ndarray:
    """RoPE on the first `dims` dims (the rope dims), dim i turning with dim i + dims/2; the rest
    unchanged.  [..., T, Di] -> same"""
    return rope_halves(x, rope.cos, rope.sin, dims)


@exercise
def index_scores(q: np.ndarray, keys: np.ndarray, head_weights: np.ndarray) -> np.ndarray:
    """sum_h head_weights[h] * relu(q_h . k) * Di^-0.5, -inf in the future.
    q [B, Hi, T, Di], keys [B, S, Di], head_weights [B, T, Hi] -> [B, T, S]; one head at a time."""
    B, H, T, D = q.shape
    scale = np.float32(D**-0.5)
    scores = np.zeros((B, T, keys.shape[1]), dtype=np.float32)  # [B, T, S]
    for h in range(H):
        per_head = np.matmul(q[:, h], keys.swapaxes(-1, -2)) * scale  # [B, T, S]
        np.maximum(per_head, 0, out=per_head)  # relu
        scores += head_weights[:, :, h, None] * per_head
    np.copyto(scores, np.float32(-np.inf), where=~causal_mask(T, keys.shape[1]))
    return scores


def chosen_positions(scores: np.ndarray, topk: int) -> np.ndarray:
    """The min(topk, S) best positions of each query, best first (ties: the lower position);
    -1 where fewer positions than that are in the past.  [B, T, S] -> [B, T, Ki] int64"""
    best = np.argsort(-scores, axis=-1, kind="stable")[..., :topk].astype(np.int64)  # [B, T, Ki]
    return np.where(np.isfinite(np.take_along_axis(scores, best, axis=-1)), best, np.int64(-1))


def mask_of(topk_idx: np.ndarray, S: int) -> np.ndarray:
    """0 at the chosen positions, -inf elsewhere.  [B, T, Ki] -> [B, T, S] float32"""
    mask = np.full((*topk_idx.shape[:2], S + 1), -np.inf, dtype=np.float32)  # one more column for the -1s
    np.put_along_axis(mask, np.where(topk_idx >= 0, topk_idx, S), np.float32(0), axis=-1)
    return np.ascontiguousarray(mask[..., :S])


def kept_of_exact(mask: np.ndarray, exact_mask: np.ndarray) -> np.ndarray:
    """For each query, how many positions both masks keep (0 in both).  [B, T, S] twice -> [B, T] int64"""
    return np.count_nonzero((mask == 0) & (exact_mask == 0), axis=-1).astype(np.int64)
