"""Lesson 14 (compressed-attention): the compressor's gated pooling."""

import numpy as np


def gated_pool(slots_kv: np.ndarray, slots_gate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """softmax of the gates over the slots, per channel; the slots' weighted sum.
    slots_kv, slots_gate [B, Wc, slots, Dc] -> weights [B, Wc, slots, Dc], pooled [B, Wc, Dc]"""
    shifted = slots_gate - np.max(slots_gate, axis=2, keepdims=True)  # [B, Wc, slots, Dc]: the best slot at 0
    weights = np.exp(shifted)  # a -inf gate (no window before the first) gets weight exactly 0
    weights /= np.sum(weights, axis=2, keepdims=True)  # [B, Wc, slots, Dc]: each channel sums to 1 over the slots
    return weights, np.sum(slots_kv * weights, axis=2)  # [B, Wc, Dc]
