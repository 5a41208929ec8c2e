"""DeepSeek-V4's attention: one shared key-value head, a sliding window, compressed memories, a sink.

CONTRACT (what a V4 family calls):

    attention(x, w, dims, cache, emit) -> [B, T, d]

x [B, T, d] is the layer's attention input after attn_norm (transformers: input_layernorm of the
collapsed hyper-connection streams); w a LayerWeights of the layer; dims the frozen
`AttentionDims` of THIS layer (a config's `dims(layer)` builds it); cache a `V4AttentionCache`
(v4_attention_cache.py), updated in place (None: a fresh one, i.e. a prompt from position 0); the
new tokens are at positions cache.seen .. cache.seen + T - 1. emit gets every named tensor
(`attn.*`, catalogue: stepper/catalog/v4/v4_attention.json).

Weights, relative to the layer, as transformers' DeepseekV4Attention names them
(`model.layers.N.` + name; the published names in brackets):
  self_attn.q_a_proj.weight [q_lora, d] (attn.wq_a)      self_attn.q_a_norm.weight [q_lora] (attn.q_norm)
  self_attn.q_b_proj.weight [H*D, q_lora] (attn.wq_b)    self_attn.kv_proj.weight [D, d] (attn.wkv)
  self_attn.kv_norm.weight [D] (attn.kv_norm)             self_attn.sinks [H] (attn.attn_sink)
  self_attn.o_a_proj.weight [Go*o_lora, H*D/Go] (attn.wo_a) self_attn.o_b_proj.weight [d, Go*o_lora] (attn.wo_b)
compressed layers add self_attn.compressor.* (compressor.py: kv_proj, gate_proj, position_bias,
kv_norm = attn.compressor.{wkv, wgate, ape, norm}); CSA layers add self_attn.compressor.indexer.*
(sparse_indexer.py; attn.indexer.{wq_b, weights_proj} and attn.indexer.compressor.*).
`weight_shapes(dims)` lists them all with their shapes.

The layer, step by step:
  q = q_b_proj(RMSNorm(q_a_proj(x))) per head, each head divided by its own RMS (no weight);
  kv = RMSNorm(kv_proj(x)): one head, both key and value;
  both turned by RoPE on their last `rope` channels (interleaved pairs) at their positions
  (sliding layers: rope_theta; compressed: compress_rope_theta with YaRN, no mscale);
  keys a query at p sees: the last `sliding_window` tokens (its own included) and the compressed
  entries chosen for it (HCA: every entry w < (p+1)//m; CSA: the indexer's top-k of those);
  scores = q.k * D^-0.5, one more logit per head (the sink), softmax, the sink's column dropped;
  out = weights @ kv, turned back at the query's position (its rope channels carried the keys' turns);
  heads in o_groups consecutive groups, each group by its block of o_a_proj to o_lora, then o_b_proj.
Each query's scores and weights are laid out as the keys it sees: its Wk window slots (positions
p - Wk + 1 .. p; a slot before position 0 is not seen), then its K entries, then the sink. So a
prompt costs T * (Wk + Kq) scores a head, not T^2; a longer prompt fed through the cache in pieces
gives what one run gives (tests/model/test_v4_attention.py), which bounds it further.
Shapes: B batch, T new positions, d hidden, H heads, D head dim, S_w the window's keys (kept and new),
Wk a query's window slots (sliding_window), Kq entries a query can see (chosen or all), S_q = Wk + Kq,
S_sink = S_q + 1 (the sink's logit), Ec entries made, Go o_groups, q_lora, o_lora.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from stepper.config import Yarn
from stepper.kernels.linear import linear, row_block
from stepper.kernels.query_blocks import by_query_blocks
from stepper.model.compressor import OVERLAP_RATIO, Compressor, Pending, compress, visible_entries
from stepper.model.layer_weights import LayerWeights
from stepper.model.ops import rms_norm, softmax
from stepper.model.sparse_indexer import index_entries
from stepper.model.tail_rope import Turn, rotate_heads, rotate_tail, turn_at
from stepper.model.v4_attention_cache import V4AttentionCache
from stepper.seams.trace import Emitter

COMPRESSOR = "self_attn.compressor"


@dataclass(frozen=True)
class AttentionDims:
    """Everything one V4 attention layer needs besides its weights."""

    hidden_size: int
    num_heads: int
    head_dim: int  # D: the shared kv head and each query head
    rope_dim: int  # qk_rope_head_dim: the turned tail of each head
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    sliding_window: int
    compress_ratio: int  # 0 sliding only, 4 CSA, 128 HCA
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    eps: float  # rms_norm_eps: every norm of the attention (and the per-head RMS of q)
    rope_theta: float  # this layer's: rope_theta (sliding) or compress_rope_theta (compressed)
    yarn: Yarn | None = None  # compressed layers' YaRN (None: plain RoPE)

    @property
    def has_indexer(self) -> bool:
        return self.compress_ratio == OVERLAP_RATIO

    @property
    def softmax_scale(self) -> float:
        return self.head_dim**-0.5

    def turn(self, positions: np.ndarray) -> Turn:
        return turn_at(positions, self.rope_dim, self.rope_theta, self.yarn)

    def problems(self) -> list[str]:
        """What makes these sizes unusable, in config.json's field names (empty: none); a config
        reader reports the first as its one line."""
        found = []
        if self.num_heads % self.o_groups:
            found.append(f"o_groups ({self.o_groups}) must divide num_attention_heads ({self.num_heads})")
        for field, rope_of in (("head_dim", self.head_dim), ("index_head_dim", self.index_head_dim)):
            if self.rope_dim % 2 or not 0 < self.rope_dim <= rope_of:
                found.append(f"qk_rope_head_dim ({self.rope_dim}) must be even and at most {field} ({rope_of})")
        if self.compress_ratio < 0:
            found.append(f"compress_ratios: {self.compress_ratio} is not 0 (sliding) or a window length")
        for field, value in (("sliding_window", self.sliding_window), ("index_topk", self.index_topk),
                             ("index_n_heads", self.index_n_heads)):
            if value < 1:
                found.append(f"{field} ({value}) must be at least 1")
        return found


def weight_shapes(dims: AttentionDims) -> dict[str, tuple[int, ...]]:
    """Every weight the layer's attention reads (transformers' names, relative to the layer)."""
    d, H, D, G = dims.hidden_size, dims.num_heads, dims.head_dim, dims.o_groups
    shapes = {
        "self_attn.q_a_proj.weight": (dims.q_lora_rank, d), "self_attn.q_a_norm.weight": (dims.q_lora_rank,),
        "self_attn.q_b_proj.weight": (H * D, dims.q_lora_rank), "self_attn.kv_proj.weight": (D, d),
        "self_attn.kv_norm.weight": (D,), "self_attn.sinks": (H,),
        "self_attn.o_a_proj.weight": (G * dims.o_lora_rank, H * D // G),
        "self_attn.o_b_proj.weight": (d, G * dims.o_lora_rank),
    }
    if dims.compress_ratio:
        shapes |= compressor_shapes(COMPRESSOR, dims.compress_ratio, D, d)
    if dims.has_indexer:
        Hi, Di = dims.index_n_heads, dims.index_head_dim
        shapes |= compressor_shapes(f"{COMPRESSOR}.indexer", dims.compress_ratio, Di, d)
        shapes[f"{COMPRESSOR}.indexer.q_b_proj.weight"] = (Hi * Di, dims.q_lora_rank)
        shapes[f"{COMPRESSOR}.indexer.scorer.weights_proj.weight"] = (Hi, d)
    return shapes


def compressor_shapes(module: str, ratio: int, width: int, d: int) -> dict[str, tuple[int, ...]]:
    c = 2 * width if ratio == OVERLAP_RATIO else width
    return {f"{module}.kv_proj.weight": (c, d), f"{module}.gate_proj.weight": (c, d),
            f"{module}.position_bias": (ratio, c), f"{module}.kv_norm.weight": (width,)}


def attention(x: np.ndarray, w: LayerWeights, dims: AttentionDims, cache: V4AttentionCache | None,
              emit: Emitter) -> np.ndarray:
    """x [B, T, d] after attn_norm -> the attention's output [B, T, d]; cache updated in place."""
    cache = V4AttentionCache() if cache is None else cache
    T = x.shape[1]
    positions = cache.seen + np.arange(T)  # [T]
    turn = dims.turn(positions)
    q_latent, q = queries(x, w, dims, turn, emit)  # [B, T, q_lora], [B, H, T, D]
    kv = shared_kv(x, w, dims, turn, emit)  # [B, T, D]
    window = emit("attn.window", cache.keys_with(kv, dims.sliding_window))  # [B, S_w, D]
    in_window = window_visible(positions, dims.sliding_window)  # [T, Wk]: slots before position 0 unseen
    own_window = window_keys(window, dims.sliding_window, T)  # [B, T, Wk, D]: a view
    entries, chosen = compressed_entries(x, q_latent, w, dims, cache, positions, turn, emit)  # [B, Ec, D], [B, T, Kq]
    seen_entries = gather(entries, chosen)  # [B, T, Kq, D]
    if dims.compress_ratio:
        seen_entries = emit("attn.entry_keys", seen_entries)
    seen = keys_seen(in_window, chosen)  # [B, T, S_q]
    weights = attention_weights(q, own_window, seen_entries, seen, w("self_attn.sinks"), dims, emit)  # [B, H, T, S_q]
    out = emit("attn.output", weighted_values(weights, own_window, seen_entries))  # [B, H, T, D]
    out = emit("attn.output_turned_back", rotate_heads(out, turn.inverse()))  # [B, H, T, D]
    cache.seen += T
    return grouped_output(out, w, dims, emit)


def queries(x: np.ndarray, w: LayerWeights, dims: AttentionDims, turn: Turn, emit: Emitter):
    """q_a_norm [B, T, q_lora] (the indexer's query latent too) and the turned heads [B, H, T, D]."""
    B, T, _ = x.shape
    q_a = emit("attn.q_a", linear(x, w.matrix("self_attn.q_a_proj.weight")))  # [B, T, q_lora]
    q_latent = emit("attn.q_a_norm", rms_norm(q_a, w("self_attn.q_a_norm.weight"), dims.eps))  # [B, T, q_lora]
    q = linear(q_latent, w.matrix("self_attn.q_b_proj.weight"))  # [B, T, H*D]
    heads = emit("attn.q_b", q.reshape(B, T, dims.num_heads, dims.head_dim).transpose(0, 2, 1, 3))  # [B, H, T, D]
    unit = np.float32(1)  # each head over its own RMS, no weight
    q = emit("attn.q", by_query_blocks(heads.shape, lambda t: rms_norm(heads[:, :, t], unit, dims.eps)))  # [B, H, T, D]
    return q_latent, emit("attn.q_rope", rotate_heads(q, turn))  # [B, H, T, D]


def shared_kv(x: np.ndarray, w: LayerWeights, dims: AttentionDims, turn: Turn, emit: Emitter) -> np.ndarray:
    """The one head that serves as key and value: RMSNorm(kv_proj(x)), turned.  [B, T, d] -> [B, T, D]"""
    kv = emit("attn.kv_proj", linear(x, w.matrix("self_attn.kv_proj.weight")))  # [B, T, D]
    kv = emit("attn.kv", rms_norm(kv, w("self_attn.kv_norm.weight"), dims.eps))  # [B, T, D]
    return emit("attn.kv_rope", rotate_tail(kv, turn))


def window_visible(positions: np.ndarray, sliding_window: int) -> np.ndarray:
    """Which of its window's slots each query sees: slot j of the query at p is position
    p - sliding_window + 1 + j, seen if it is not before the context's start.  [T] -> [T, Wk] bool"""
    return positions[:, None] - sliding_window + 1 + np.arange(sliding_window)[None, :] >= 0


def window_keys(window: np.ndarray, sliding_window: int, T: int) -> np.ndarray:
    """Each query's own window: the keys of positions p - sliding_window + 1 .. p, slots before
    the context's start zero.  window [B, S_w, D] (the last T positions being the queries') ->
    [B, T, Wk, D], a view of the window padded at the front."""
    B, S_w, D = window.shape
    before = np.zeros((B, sliding_window + T - 1 - S_w, D), np.float32)  # the slots before the kept keys: zero
    padded = np.concatenate([before, window], axis=1)  # T + Wk - 1 rows: slot 0 of query t is row t
    return sliding_window_view(padded, sliding_window, axis=1).swapaxes(-1, -2)  # [B, T, Wk, D]


def keys_seen(in_window: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """Which of a query's keys are real: its window slots, then its entries.  [T, Wk], [B, T, Kq] -> [B, T, S_q]"""
    window_part = np.broadcast_to(in_window, (chosen.shape[0], *in_window.shape))  # [B, T, Wk]
    return np.concatenate([window_part, chosen >= 0], axis=-1)


def compressed_entries(x, q_latent, w, dims: AttentionDims, cache: V4AttentionCache, positions, turn, emit):
    """Run the layer's compressor (and indexer) over the new tokens: every entry made so far
    [B, Ec, D] and, per query, the entries it attends [B, T, Kq] (-1: none; Kq 0 on sliding layers)."""
    B = x.shape[0]
    if dims.compress_ratio == 0:
        return np.zeros((B, 0, dims.head_dim), np.float32), np.zeros((B, len(positions), 0), np.int64)
    turn_of = partial(turn_at, rope_dim=dims.rope_dim, theta=dims.rope_theta, yarn=dims.yarn)
    comp = Compressor(COMPRESSOR, "attn.compressor", dims.compress_ratio, dims.head_dim, dims.eps)
    state = cache.compressor or Pending.empty(B, comp.channels, comp.width)
    cache.compressor = compress(x, w, comp, state, turn_of, emit)
    entries = emit("attn.entries", cache.compressor.entries)  # [B, Ec, D]
    if dims.has_indexer:
        state = cache.indexer or Pending.empty(B, 2 * dims.index_head_dim, dims.index_head_dim)
        chosen, cache.indexer = index_entries(x, q_latent, w, dims, state, positions, turn, turn_of, emit)
    else:
        chosen = every_visible(positions, entries.shape[1], dims.compress_ratio, B)
    return entries, emit.choice("attn.chosen", chosen, entries.shape[1], "entries", none=True)


def every_visible(positions: np.ndarray, count: int, ratio: int, batch: int) -> np.ndarray:
    """HCA keeps every entry a query can see: entry e for e < (p+1)//m, else -1.  -> [B, T, Ec]"""
    e = np.arange(count)[None, :]  # [1, Ec]
    chosen = np.where(e < visible_entries(positions, ratio)[:, None], e, -1)  # [T, Ec]
    return np.broadcast_to(chosen, (batch, *chosen.shape)).astype(np.int64)


def gather(entries: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """The chosen entries per query (zeros where none).  [B, Ec, D], [B, T, Kq] -> [B, T, Kq, D]"""
    B = chosen.shape[0]
    picked = entries[np.arange(B)[:, None, None], np.maximum(chosen, 0)]  # [B, T, Kq, D]: a copy
    picked[chosen < 0] = 0  # in place: the largest tensor of a long CSA prompt is not held twice
    return picked


def attention_weights(q, own_window, seen_entries, seen, sinks, dims: AttentionDims, emit: Emitter) -> np.ndarray:
    """softmax over each query's window keys, its entries and the sink, per head; the sink's
    column dropped. q [B, H, T, D], own_window [B, T, Wk, D], seen_entries [B, T, Kq, D],
    seen [B, T, S_q] (which keys are real) -> [B, H, T, S_q]. Each array is made a block of
    queries at a time on every core (kernels.query_blocks: the same bits as made whole)."""
    B, H, T, _ = q.shape
    S_sink = own_window.shape[2] + seen_entries.shape[2] + 1

    def block_scores(t: slice) -> np.ndarray:  # the rows t of the scores
        return scores_with_sink(q[:, :, t], own_window[:, t], seen_entries[:, t], seen[:, t], sinks, dims)

    scores = emit("attn.scores", by_query_blocks((B, H, T, S_sink), block_scores))  # [B, H, T, S_sink]
    probs = by_query_blocks(scores.shape, lambda t: softmax(scores[:, :, t]))  # [B, H, T, S_sink]
    emit.shown("attn.sink_mass", probs[..., -1])  # [B, H, T]
    return emit("attn.weights", probs[..., :-1])


def scores_with_sink(q, own_window, seen_entries, seen, sinks, dims: AttentionDims) -> np.ndarray:
    """Each query's scaled scores against its window keys and its entries, -inf where a key is not
    real, then the sink's logit per head. q [B, H, T, D], own_window [B, T, Wk, D], seen_entries
    [B, T, Kq, D], seen [B, T, S_q] -> [B, H, T, S_sink]"""
    B, H, T, _ = q.shape
    per_query = q.transpose(0, 2, 1, 3)  # [B, T, H, D]
    from_window = np.matmul(per_query, own_window.swapaxes(-1, -2))  # [B, T, H, Wk]
    from_entries = np.matmul(per_query, seen_entries.swapaxes(-1, -2))  # [B, T, H, Kq]
    scores = np.concatenate([from_window, from_entries], axis=-1).transpose(0, 2, 1, 3)  # [B, H, T, S_q]
    scores = np.where(seen[:, None], scores * np.float32(dims.softmax_scale), -np.inf)
    sink = np.broadcast_to(sinks.astype(np.float32)[None, :, None, None], (B, H, T, 1))  # [B, H, T, one]
    return np.concatenate([scores, sink], axis=-1)  # [B, H, T, S_sink]


def weighted_values(weights: np.ndarray, own_window: np.ndarray, seen_entries: np.ndarray) -> np.ndarray:
    """The keys serve as values: each query's weights times its window keys, then its entries,
    a block of queries at a time on every core (kernels.query_blocks).
    [B, H, T, S_q], [B, T, Wk, D], [B, T, Kq, D] -> [B, H, T, D]"""
    B, H, T, _ = weights.shape
    return by_query_blocks((B, H, T, own_window.shape[-1]),
                           lambda t: values_of(weights[:, :, t], own_window[:, t], seen_entries[:, t]))


def values_of(weights: np.ndarray, own_window: np.ndarray, seen_entries: np.ndarray) -> np.ndarray:
    """Each query's weights times its keys.  [B, H, T, S_q], [B, T, Wk, D], [B, T, Kq, D] -> [B, H, T, D]"""
    per_query = weights.transpose(0, 2, 1, 3)  # [B, T, H, S_q]
    Wk = own_window.shape[2]
    out = np.matmul(per_query[..., :Wk], own_window) + np.matmul(per_query[..., Wk:], seen_entries)  # [B, T, H, D]
    return out.transpose(0, 2, 1, 3)


def grouped_output(out: np.ndarray, w: LayerWeights, dims: AttentionDims, emit: Emitter) -> np.ndarray:
    """Heads in o_groups consecutive groups, each projected by its own block of o_a_proj to
    o_lora, then o_b_proj mixes the groups.  [B, H, T, D] -> [B, T, d]"""
    B, H, T, D = out.shape
    Go, o_lora = dims.o_groups, dims.o_lora_rank
    grouped = out.transpose(0, 2, 1, 3).reshape(B, T, Go, H * D // Go)  # [B, T, Go, H*D/Go]
    o_a = w.matrix("self_attn.o_a_proj.weight")  # [Go*o_lora, H*D/Go], as stored: group g's block is rows g*o_lora..
    per_group = np.stack([linear(grouped[:, :, g], row_block(o_a, g * o_lora, (g + 1) * o_lora))
                          for g in range(Go)], axis=2)  # [B, T, Go, o_lora]
    per_group = emit("attn.o_groups", per_group)  # [B, T, Go, o_lora]
    merged = per_group.reshape(B, T, Go * o_lora)  # [B, T, Go*o_lora]
    return emit("attn.o", linear(merged, w.matrix("self_attn.o_b_proj.weight")))  # [B, T, d]
