"""The k largest scores of each row, best first, ties to the lower index: what
`np.argsort(-scores, axis=-1, kind="stable")[..., :k]` gives (the readable line, which the tests
hold this to), without sorting the whole row. A decode step over a 1,048,576-position context
picks 512 of 262,144 indexer scores: the full sort took 0.16 s of a 0.9 s step.

The k-th largest value of each row is found by a partition; the values above it are all kept, and
of those equal to it the lowest indices fill the rest; only those k are sorted (stably, so equal
scores keep their index order). A row with a NaN is sorted whole, as the readable line sorts it.
"""

from __future__ import annotations

import numpy as np


def best_first(scores: np.ndarray, k: int) -> np.ndarray:
    """[..., E] -> the indices of the k best scores per row, best first, ties to the lower index.  [..., k] int64"""
    n = scores.shape[-1]
    if k >= n or np.isnan(scores).any():
        return np.argsort(-scores, axis=-1, kind="stable")[..., :k]
    neg = -scores  # [..., E]: the best smallest
    kth = np.partition(neg, k - 1, axis=-1)[..., k - 1 : k]  # [..., 1]: the k-th best of each row
    above = neg < kth  # [..., E]: fewer than k of these
    ties = neg == kth  # [..., E]
    room = k - above.sum(axis=-1, keepdims=True)  # [..., 1]: how many ties are taken, lowest index first
    kept = above | (ties & (np.cumsum(ties, axis=-1) <= room))  # [..., E]: exactly k per row
    chosen = np.nonzero(kept.reshape(-1, n))[1].reshape(*scores.shape[:-1], k)  # [..., k], in index order
    order = np.argsort(np.take_along_axis(neg, chosen, axis=-1), axis=-1, kind="stable")  # [..., k]
    return np.take_along_axis(chosen, order, axis=-1).astype(np.int64)
