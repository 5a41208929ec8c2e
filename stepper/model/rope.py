"""Rotary position embedding with YaRN: the frequencies, the cos/sin tables, the rotation."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from stepper.config import LongRope, Yarn
from stepper.seams.swap import exercise


@dataclass(frozen=True)
class Rope:
    """The rotary angles of the T new positions: cos, sin [T, rope/2], the softmax scale, and the
    queries' scale per position [T] (or per head and position [H, T]) where the model has one
    (Mistral 4, Mistral Large 4: model.query_scale, llama4_query_scale and learned_scale). A model
    that rotates nothing (Kimi Linear's MLA layers) has rotates False and no angles."""

    cos: np.ndarray
    sin: np.ndarray
    softmax_scale: float
    query_scale: np.ndarray | None = None
    interleaved: bool = True  # MLA's rotary dims: interleaved pairs (DeepSeek) or two halves (MiniCPM3)
    rotates: bool = True
    log_positions: np.ndarray | None = None  # ln(p + 1) [T], Mistral Large 4's learned query scales' (query_scale)

    def at(self, rows: slice) -> Rope:
        """The angles of some of the positions (query scales left out: they scale queries, not keys)."""
        return Rope(self.cos[rows], self.sin[rows], self.softmax_scale, None, self.interleaved, self.rotates)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction 0.1 * mscale * ln(scale) + 1 (1 when not scaling)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_cos_sin_scale(yarn: Yarn) -> float:
    """What YaRN multiplies cos and sin by: the block's attention_factor where it gives one
    (transformers' YaRN), else mscale / mscale_all_dim's magnitude corrections' ratio."""
    if yarn.attention_factor is not None:
        return yarn.attention_factor
    return yarn_mscale(yarn.factor, yarn.mscale) / yarn_mscale(yarn.factor, yarn.mscale_all_dim)


def yarn_correction_dim(rotations: float, dim: int, theta: float, original_max: int) -> float:
    """The rotary dim index whose wavelength fits `rotations` full turns in `original_max` positions."""
    return (dim * math.log(original_max / (rotations * 2 * math.pi))) / (2 * math.log(theta))


def yarn_correction_range(dim: int, theta: float, yarn: Yarn) -> tuple[float, float]:
    """The rotary dims (low, high): below low the frequency is kept (extrapolated), above high it is
    divided by factor; rounded out to whole dims unless the block says `truncate: false`."""
    low = yarn_correction_dim(yarn.beta_fast, dim, theta, yarn.original_max_position_embeddings)
    high = yarn_correction_dim(yarn.beta_slow, dim, theta, yarn.original_max_position_embeddings)
    if yarn.truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


@exercise
def rope_inv_freq(dim: int, theta: float, yarn: Yarn | None) -> np.ndarray:
    """Inverse frequencies [rope/2] (dim = rope), float32, with YaRN's blend between kept and interpolated ones.

    The arithmetic is the reference's float32 arithmetic, step by step, except theta ** (2i/dim),
    which stepper rounds correctly (float64, then float32) where torch's float32 pow may be one ulp
    off; see docs/numerics.md.
    """
    exponent = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)  # [rope/2]
    pos_freqs = (np.float64(theta) ** exponent.astype(np.float64)).astype(np.float32)
    extrapolation = np.float32(1) / pos_freqs
    if yarn is None:
        return extrapolation
    interpolation = np.float32(1) / (np.float32(yarn.factor) * pos_freqs)
    low, high = yarn_correction_range(dim, theta, yarn)
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low if high > low else 0.001), 0, 1)
    keep = np.float32(1) - ramp.astype(np.float32)  # 1 = extrapolate (keep the original frequency)
    return interpolation * (np.float32(1) - keep) + extrapolation * keep


def longrope_inv_freq(dim: int, theta: float, longrope: LongRope, positions: np.ndarray) -> np.ndarray:
    """LongRoPE's inverse frequencies [rope/2]: 1 / (factor_i * theta^(2i/dim)), the short factors
    while every position is below original_max_position_embeddings, the long ones past it (as
    transformers decides per call, from the largest position)."""
    long = int(positions.max()) + 1 > longrope.original_max_position_embeddings
    factors = np.array(longrope.long_factor if long else longrope.short_factor, dtype=np.float32)  # [rope/2]
    exponent = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)  # [rope/2]
    pos_freqs = (np.float64(theta) ** exponent.astype(np.float64)).astype(np.float32)
    return np.float32(1) / (factors * pos_freqs)


def rope_tables(positions: np.ndarray, inv_freq: np.ndarray, mscale: float) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [T, rope/2] of the angles position * inv_freq, times YaRN's cos/sin mscale.

    Angles are float32 products as in the reference; cos and sin are then correctly rounded
    (computed in float64), so they do not depend on the machine's float32 libm.
    """
    angles = positions.astype(np.float32)[:, None] * inv_freq[None, :]  # [T, rope/2]
    cos = np.cos(angles.astype(np.float64)).astype(np.float32) * np.float32(mscale)
    sin = np.sin(angles.astype(np.float64)).astype(np.float32) * np.float32(mscale)
    return cos, sin


@exercise
def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate interleaved pairs (x0, x1), (x2, x3), ... by their angles.  [..., T, rope] -> same.

    The output is in the reference's layout, the rotated evens then the rotated odds: the pairs are
    first gathered into halves (as modeling_deepseek.py does with view/transpose) and then
    x * cos + rotate_half(x) * sin is applied.  cos, sin: [T, rope/2].
    """
    even, odd = x[..., 0::2], x[..., 1::2]  # [..., T, rope/2] each
    return np.concatenate([even * cos - odd * sin, odd * cos + even * sin], axis=-1)


def rotate_halves(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, dims: int) -> np.ndarray:
    """RoPE on the first `dims` dims (the rope dims), dim i turning with dim i + dims/2 (Llama's
    rotate_half); the rest unchanged.  [..., T, Di] -> same (MiniCPM3's [..., T, rope] whole);
    cos, sin: [T, rope/2]."""
    x1, x2, rest = x[..., : dims // 2], x[..., dims // 2 : dims], x[..., dims:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)
