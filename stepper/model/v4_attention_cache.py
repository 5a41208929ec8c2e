"""What a DeepSeek-V4 attention layer keeps between steps, and what that costs per position.

- the window: the last sliding_window - 1 tokens' shared kv (normalised, turned), which with the
  new token make the `sliding_window` keys a decode step sees;
- each compressor's state (compressor.Pending): its unfinished window's projections, at m = 4
  the last closed window's first halves, and every entry it has made;
- on CSA layers, the same for the indexer's compressor (its entries are the indexer's keys).

A decode step with this cache equals a re-run of the longer prompt (tests/model/test_v4_attention).
The window and the unfinished windows are bounded; the entries grow by width/m numbers a position.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepper.model.compressor import OVERLAP_RATIO, Pending


@dataclass
class V4AttentionCache:
    """One layer's cache; `seen` positions so far (the next token's position)."""

    seen: int = 0
    window: np.ndarray | None = None  # [B, S_w, D]: at most sliding_window - 1 tokens
    compressor: Pending | None = None
    indexer: Pending | None = None

    def keys_with(self, kv: np.ndarray, sliding_window: int) -> np.ndarray:
        """The kept window followed by the new tokens' kv, and keep the last sliding_window - 1.
        [B, T, D] -> [B, S_w, D]"""
        keys = kv if self.window is None else np.concatenate([self.window, kv], axis=1)  # [B, S_w, D]
        self.window = keys[:, max(keys.shape[1] - (sliding_window - 1), 0):]
        return keys

    def nbytes(self) -> int:
        """Bytes held (float32): window, unfinished windows, overlaps, entries."""
        arrays = [self.window] + [a for p in (self.compressor, self.indexer) if p is not None
                                  for a in (p.kv, p.gate, p.entries, p.overlap_kv, p.overlap_gate)]
        return sum(a.nbytes for a in arrays if a is not None)


def values_per_position(dims) -> float:
    """Numbers a layer's cache grows by per position of context, past its bounded window: the
    compressor's entries (head_dim / m) and on CSA layers the indexer's (index_head_dim / m)."""
    if dims.compress_ratio == 0:
        return 0.0
    grown = dims.head_dim / dims.compress_ratio
    return grown + (dims.index_head_dim / dims.compress_ratio if dims.has_indexer else 0.0)


def bounded_values(dims) -> int:
    """Numbers a layer's cache holds whatever the context: the window and, per compressor, at
    most m - 1 pending tokens' projections (kv and gate) and at m = 4 the overlap halves."""
    total = (dims.sliding_window - 1) * dims.head_dim
    for width, present in ((dims.head_dim, dims.compress_ratio > 0), (dims.index_head_dim, dims.has_indexer)):
        if present:
            overlap = dims.compress_ratio == OVERLAP_RATIO
            channels = 2 * width if overlap else width
            total += 2 * (dims.compress_ratio - 1) * channels + (2 * OVERLAP_RATIO * width if overlap else 0)
    return total


def mla_values_per_position(kv_lora_rank: int, qk_rope_head_dim: int) -> int:
    """DeepSeek-V3's MLA (absorbed) cache: one latent and one rotary key per position."""
    return kv_lora_rank + qk_rope_head_dim
