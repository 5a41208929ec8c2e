"""Lesson 1 (tour): softmax, which turns attention scores into attention weights."""

import numpy as np


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """exp(x) / sum(exp(x)) along `axis`, in float32.  [..., S] -> [..., S]"""
    shifted = x - np.max(x, axis=axis, keepdims=True)  # the largest entry becomes 0: exp cannot overflow
    e = np.exp(shifted)  # exp(-inf) = 0: masked positions get no weight
    return e / np.sum(e, axis=axis, keepdims=True)
