"""A long V4 context without a long prefill: N synthetic positions in one attention layer's cache.

What N positions leave in a V4 layer's cache (v4_attention_cache.py) is drawn from the statistics
of the layer's own projections of a few real inputs (a mean and a standard deviation per channel,
deterministic from the seed) and then made as real state is made:
- the window: the last sliding_window - 1 tokens' kv, drawn like kv_proj(x), RMSNorm, turned at
  their positions;
- per compressor: N // m entries, each a pooled vector drawn like the compressor's kv_proj(x),
  RMSNorm with the compressor's weight, turned at its window's start; the N mod m pending tokens'
  kv and gate projections drawn like the real ones; at m = 4 the last closed window's first
  halves (its gate with the position bias added, as the state keeps it).
The entries are made ROWS at a time into one array: at N = 1,048,576 a CSA layer of V4-Flash holds
262,144 entries of 512 and 262,144 of 128 (640 MiB in float32).
"""

from __future__ import annotations

import numpy as np

from stepper.kernels.linear import linear
from stepper.model.compressed_attention import COMPRESSOR, AttentionDims
from stepper.model.compressor import OVERLAP_RATIO, Pending
from stepper.model.layer_weights import LayerWeights
from stepper.model.ops import rms_norm
from stepper.model.synthetic_cache import ROWS, like
from stepper.model.tail_rope import rotate_tail
from stepper.model.v4_attention_cache import V4AttentionCache


def seeded_cache(x: np.ndarray, w: LayerWeights, dims: AttentionDims, n: int, seed: int) -> V4AttentionCache:
    """The cache a layer would hold after n positions; x [1, T, d]: a few real inputs of the layer
    (after attn_norm) whose projections give the statistics."""
    rng = np.random.default_rng([seed, 4, w.layer])
    cache = V4AttentionCache(seen=n)
    kept = min(n, dims.sliding_window - 1)
    kv = like(linear(x, w.matrix("self_attn.kv_proj.weight")), kept, rng)  # [1, S_w, D]
    kv = rms_norm(kv, w("self_attn.kv_norm.weight"), dims.eps)
    cache.window = rotate_tail(kv, dims.turn(np.arange(n - kept, n)))  # [1, S_w, D]
    if dims.compress_ratio:
        cache.compressor = seeded_state(x, w, dims, COMPRESSOR, dims.head_dim, n, rng)
    if dims.has_indexer:
        cache.indexer = seeded_state(x, w, dims, f"{COMPRESSOR}.indexer", dims.index_head_dim, n, rng)
    return cache


def seeded_state(x: np.ndarray, w: LayerWeights, dims: AttentionDims, module: str, width: int, n: int,
                 rng: np.random.Generator) -> Pending:
    """One compressor's state after n positions (entries, pending tokens, overlap)."""
    m = dims.compress_ratio
    kv = linear(x, w.matrix(f"{module}.kv_proj.weight"))  # [1, T, c]: the real projections
    gate = linear(x, w.matrix(f"{module}.gate_proj.weight"))  # [1, T, c]
    pooled_like = kv[..., -width:]  # [1, T, Dc]: the channels of a window's own slots
    count = n // m
    entries = np.empty((1, count, width), np.float32)  # [1, Ec, Dc]
    for start in range(0, count, ROWS):
        rows = slice(start, min(start + ROWS, count))
        pooled = like(pooled_like, rows.stop - rows.start, rng)  # [1, Ec, Dc]
        normed = rms_norm(pooled, w(f"{module}.kv_norm.weight"), dims.eps)
        entries[:, rows] = rotate_tail(normed, dims.turn(np.arange(rows.start, rows.stop) * m))
    pending = n - count * m
    state = Pending(like(kv, pending, rng), like(gate, pending, rng), entries)
    if m != OVERLAP_RATIO or count == 0:
        return state
    ape = w(f"{module}.position_bias")[:, :width]  # [m, Dc]
    return Pending(state.kv, state.gate, entries, like(kv[..., :width], m, rng), like(gate[..., :width], m, rng) + ape)
