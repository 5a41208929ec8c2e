"""Lesson 5 (rope-yarn): YaRN's rotary frequencies, and rotating the interleaved pairs."""

import numpy as np

from stepper.config import Yarn
from stepper.model.rope import yarn_correction_range

F32 = np.float32


def rope_inv_freq(dim: int, theta: float, yarn: Yarn | None) -> np.ndarray:
    """Inverse frequencies [dim/2], float32: theta^(-2i/dim), blended by YaRN."""
    exponent = np.arange(0, dim, 2, dtype=F32) / F32(dim)  # [dim/2]
    pos_freqs = (np.float64(theta) ** exponent.astype(np.float64)).astype(F32)  # rounded once
    extrapolation = F32(1) / pos_freqs
    if yarn is None:
        return extrapolation
    interpolation = F32(1) / (F32(yarn.factor) * pos_freqs)
    low, high = yarn_correction_range(dim, theta, yarn)
    ramp = np.clip((np.arange(dim // 2, dtype=F32) - low) / (high - low if high > low else 0.001), 0, 1)
    keep = F32(1) - ramp.astype(F32)  # 1 = keep the original frequency
    return interpolation * (F32(1) - keep) + extrapolation * keep


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Turn the interleaved pairs (x0, x1), (x2, x3), ... by their angles.  [..., T, R] -> [..., T, R]"""
    even, odd = x[..., 0::2], x[..., 1::2]  # [..., T, R/2] each: the pairs' first and second numbers
    return np.concatenate([even * cos - odd * sin, odd * cos + even * sin], axis=-1)
