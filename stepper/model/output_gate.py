"""A.X-K2's attention output gate: q_b_proj makes, beside each head's query, a gate of v_head
dims, from the query latent and its normalised copy side by side; the heads' merged output is
multiplied by its sigmoid before o_proj.

Shapes: B batch, T new positions, H heads, q_lora the query latent, qk_head, v_head, Hv = H * v_head.
"""

from __future__ import annotations

import numpy as np

from stepper.config import Config
from stepper.model.ops import sigmoid


def q_b_input(q_a_norm: np.ndarray, q_a: np.ndarray, cfg: Config) -> np.ndarray:
    """What q_b_proj reads: q_a_norm, or (A.X-K2) q_a_norm and q_a side by side.
    -> [B, T, q_lora] or [B, T, 2 * q_lora]"""
    return np.concatenate([q_a_norm, q_a], axis=-1) if cfg.q_gate else q_a_norm


def split_gate(q: np.ndarray, cfg: Config) -> tuple[np.ndarray, np.ndarray | None]:
    """Each head's q_b output [B, H, T, qk_head (+ v_head)] -> its query [B, H, T, qk_head] and
    (A.X-K2) the gate of its output merged over the heads [B, T, Hv], else None."""
    if not cfg.q_gate:
        return q, None
    B, H, T, _ = q.shape
    gate = q[..., cfg.qk_head_dim :].transpose(0, 2, 1, 3).reshape(B, T, H * cfg.v_head_dim)  # [B, T, Hv]
    return q[..., : cfg.qk_head_dim], gate


def gated(merged: np.ndarray, gate: np.ndarray) -> np.ndarray:
    """merged * sigmoid(gate).  [B, T, Hv] -> [B, T, Hv]"""
    return merged * sigmoid(gate)
