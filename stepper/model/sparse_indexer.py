"""DeepSeek-V4's Lightning Indexer (CSA layers): which compressed entries each query attends.

It has its own overlapping compressor (m = 4) at `index_head_dim` whose entries are its keys.
Its queries come from the attention's query latent: q = q_b_proj(q_a_norm) in `index_n_heads`
heads of index_head_dim, turned like the keys (compress_rope_theta with YaRN) at the query's
position. The score of entry e for a query is

    score_e = sum_h  weights_h * relu(q_h . K_e) * index_head_dim^-0.5,
    weights = weights_proj(x) * index_n_heads^-0.5,

entries the query cannot see yet (e >= (p+1)//m) score -inf, and the best min(index_topk,
entries made) are kept, best first; a pick the query cannot see (fewer visible than picks) is -1.

Weights (relative to the layer, transformers' names): `self_attn.compressor.indexer.{kv_proj,
gate_proj}.weight` [2*Di, d], `.position_bias` [4, 2*Di], `.kv_norm.weight` [Di],
`.q_b_proj.weight` [Hi*Di, q_lora], `.scorer.weights_proj.weight` [Hi, d].
Shapes: B batch, T new positions, Ec entries made, Hi index heads, Di index head dims, Kq picks.
"""

from __future__ import annotations

import numpy as np

from stepper.kernels.linear import linear
from stepper.kernels.topk import best_first
from stepper.model.compressor import Compressor, Pending, compress, visible_entries
from stepper.model.layer_weights import LayerWeights
from stepper.model.tail_rope import Turn, rotate_tail
from stepper.seams.trace import Emitter

MODULE = "self_attn.compressor.indexer"


def index_entries(x: np.ndarray, q_latent: np.ndarray, w: LayerWeights, dims, state: Pending, positions: np.ndarray,
                  turn: Turn, turn_of, emit: Emitter) -> tuple[np.ndarray, Pending]:
    """x [B, T, d], q_latent [B, T, q_lora] (q_a_norm) -> the picks [B, T, Kq] (-1: none) and the
    indexer compressor's new state. turn: the query positions' angles; turn_of: the windows'."""
    comp = Compressor(MODULE, "attn.indexer.compressor", dims.compress_ratio, dims.index_head_dim, dims.eps)
    state = compress(x, w, comp, state, turn_of, emit)
    keys = emit("attn.indexer.keys", state.entries)  # [B, Ec, Di]
    q = index_queries(q_latent, w, dims, turn, emit)  # [B, Hi, T, Di]
    head_weights = linear(x, w.matrix(f"{MODULE}.scorer.weights_proj.weight")) * np.float32(dims.index_n_heads**-0.5)
    head_weights = emit("attn.indexer.head_weights", head_weights)  # [B, T, Hi]
    scores = index_scores(q, keys, head_weights, dims.index_head_dim)  # [B, T, Ec]
    visible = visible_entries(positions, dims.compress_ratio)  # [T]
    scores = emit("attn.indexer.scores", np.where(np.arange(keys.shape[1]) < visible[:, None], scores, -np.inf))
    chosen = emit.choice("attn.indexer.chosen", picks(scores, dims.index_topk, visible), keys.shape[1], "entries",
                         none=True)  # a patched choice checked before it is read, as attn.chosen is
    return chosen, state


def index_queries(q_latent: np.ndarray, w: LayerWeights, dims, turn: Turn, emit: Emitter) -> np.ndarray:
    """q_b_proj(q_a_norm) split into index heads and turned at the query positions.
    [B, T, q_lora] -> [B, Hi, T, Di]"""
    B, T, _ = q_latent.shape
    q = linear(q_latent, w.matrix(f"{MODULE}.q_b_proj.weight"))  # [B, T, Hi*Di]
    q = q.reshape(B, T, dims.index_n_heads, dims.index_head_dim).transpose(0, 2, 1, 3)  # [B, Hi, T, Di]
    return emit("attn.indexer.q", rotate_tail(q, turn))


def index_scores(q: np.ndarray, keys: np.ndarray, head_weights: np.ndarray, head_dim: int) -> np.ndarray:
    """sum_h weights_h * relu(q_h . K_e) * Di^-0.5.  [B, Hi, T, Di], [B, Ec, Di], [B, T, Hi] -> [B, T, Ec]"""
    B, Hi, T, Di = q.shape
    rows = q.reshape(B, Hi * T, Di)  # every head's queries as rows of one product, which reads the keys once
    dots = np.stack([linear(rows[b], keys[b]) for b in range(B)])  # [B, Hi*T, Ec]: the keys as a weight [Ec, Di]
    per_head = dots.reshape(B, Hi, T, -1)  # [B, Hi, T, Ec]: a view
    np.maximum(per_head, 0, out=per_head)  # relu and scale in place: a long prompt's largest indexer tensor, held once
    per_head *= np.float32(head_dim**-0.5)
    weighted = np.matmul(head_weights[:, :, None, :], per_head.transpose(0, 2, 1, 3))  # [B, T, one, Ec]: sum over heads
    return weighted[:, :, 0]  # [B, T, Ec]


def picks(scores: np.ndarray, topk: int, visible: np.ndarray) -> np.ndarray:
    """The min(topk, Ec) best entries per query, best first (equal scores: the lower index first);
    a pick past what the query sees is -1.  [B, T, Ec] -> [B, T, Kq] int64"""
    k = min(topk, scores.shape[-1])
    order = best_first(scores, k)  # [B, T, Kq]: argsort(-scores, stable)[..., :k], without sorting every entry
    return np.where(order < visible[:, None], order, -1).astype(np.int64)
