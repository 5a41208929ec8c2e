"""Lesson 2 (rmsnorm): RMSNorm."""

import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x * rsqrt(mean(x^2) + eps) * weight over the last axis, in float32.  [..., D] -> [..., D]"""
    x = x.astype(np.float32, copy=False)
    variance = np.mean(np.square(x), axis=-1, keepdims=True)  # [..., 1]: each vector's mean square
    return weight * (x * (np.float32(1) / np.sqrt(variance + np.float32(eps))))
