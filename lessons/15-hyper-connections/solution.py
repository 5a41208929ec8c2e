"""Lesson 15 (hyper-connections): Sinkhorn's normalisation of the mixing matrix."""

import numpy as np


def sinkhorn(comb: np.ndarray, iters: int, hc_eps: float) -> np.ndarray:
    """Columns divided by their sums, then iters - 1 rounds of rows then columns (each sum + hc_eps).
    [..., n, n] -> [..., n, n]"""
    eps = np.float32(hc_eps)  # a float32 constant keeps the matrices float32
    columns, rows = -2, -1  # comb[..., j, k]: row j, column k
    comb = comb / (comb.sum(axis=columns, keepdims=True) + eps)  # [..., n, n]: each column sums to about 1
    for _ in range(iters - 1):
        comb = comb / (comb.sum(axis=rows, keepdims=True) + eps)  # each row sums to about 1
        comb = comb / (comb.sum(axis=columns, keepdims=True) + eps)  # each column again
    return comb
