"""DeepSeek-V4's partial RoPE: interleaved pairs on the LAST `rope` channels of a head.

Sliding layers turn by `rope_theta`; compressed layers (their compressor and indexer too) by
`compress_rope_theta` with YaRN's blend of frequencies and no mscale (cos and sin are not scaled).
Pairs are (x[n], x[n+1]) for even n counted from the start of the rotary tail, and the result keeps
that interleaved layout (unlike V3's MLA, whose output gathers evens then odds).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepper.config import Yarn
from stepper.kernels.query_blocks import by_query_blocks
from stepper.model.rope import rope_inv_freq, rope_tables


@dataclass(frozen=True)
class Turn:
    """The angles of some positions: cos, sin [T, rope/2]."""

    cos: np.ndarray
    sin: np.ndarray

    def inverse(self) -> Turn:
        """The turn back (angle -a): used to de-rotate the attention output."""
        return Turn(self.cos, -self.sin)

    def at(self, rows: slice) -> Turn:
        """The angles of some of the positions."""
        return Turn(self.cos[rows], self.sin[rows])


def turn_at(positions: np.ndarray, rope_dim: int, theta: float, yarn: Yarn | None) -> Turn:
    """cos, sin [T, rope/2] of positions * inv_freq (YaRN's frequencies when given, mscale 1)."""
    cos, sin = rope_tables(np.asarray(positions), rope_inv_freq(rope_dim, theta, yarn), 1.0)
    return Turn(cos, sin)


def rotate_tail(x: np.ndarray, turn: Turn) -> np.ndarray:
    """Rotate the interleaved pairs of the last rope channels of x by the turn's angles; the leading
    channels pass unchanged.  [..., T, D] -> [..., T, D]  (cos, sin [T, rope/2])"""
    rope = 2 * turn.cos.shape[-1]
    head, tail = x[..., :-rope], x[..., -rope:]  # the leading channels, [..., T, rope]
    even, odd = tail[..., 0::2], tail[..., 1::2]  # [..., T, rope/2] each
    turned = np.empty_like(tail)
    turned[..., 0::2] = even * turn.cos - odd * turn.sin
    turned[..., 1::2] = odd * turn.cos + even * turn.sin
    return np.concatenate([head, turned], axis=-1)


def rotate_heads(x: np.ndarray, turn: Turn) -> np.ndarray:
    """rotate_tail of heads, a block of queries at a time on every core (kernels.query_blocks: the
    same bits).  [B, H, T, D] -> [B, H, T, D]  (cos, sin [T, rope/2])"""
    return by_query_blocks(x.shape, lambda t: rotate_tail(x[:, :, t], turn.at(t)))
