"""Lesson 11 (sparse-attention): the Lightning Indexer's scores."""

import numpy as np

from stepper.model.ops import causal_mask


def index_scores(q: np.ndarray, keys: np.ndarray, head_weights: np.ndarray) -> np.ndarray:
    """sum_h head_weights[h] * relu(q_h . k) * Di^-0.5, -inf in the future.
    q [B, Hi, T, Di], keys [B, S, Di], head_weights [B, T, Hi] -> [B, T, S]"""
    B, H, T, D = q.shape
    scale = np.float32(D**-0.5)
    scores = np.zeros((B, T, keys.shape[1]), dtype=np.float32)  # [B, T, S]
    for h in range(H):
        dots = np.matmul(q[:, h], keys.swapaxes(-1, -2))  # [B, T, S]: every query against every key
        scores += head_weights[:, :, h, None] * (np.maximum(dots, 0) * scale)  # relu before the weight
    scores[:, ~causal_mask(T, keys.shape[1])] = -np.inf  # a query sees its own position and those before
    return scores
