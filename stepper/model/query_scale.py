"""Mistral 4's position-dependent query scale (Llama 4's attention scaling): past the YaRN
context it was trained on, every query is multiplied by 1 + beta * ln(1 + floor(p / L)) at its
position p (L = original_max_position_embeddings), so the attention stays sharp over long
contexts. Both parts of the query are scaled after RoPE, before the scores; keys are not.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from stepper.config import QueryScale
from stepper.model.rope import Rope
from stepper.seams.trace import Emitter


def llama4_query_scale(positions: np.ndarray, scale: QueryScale) -> np.ndarray:
    """1 + beta * ln(1 + floor(p / L)) for positions [T] -> [T], in float32 as the reference."""
    blocks = np.floor(positions.astype(np.float32) / np.float32(scale.original_max_position_embeddings))  # [T]
    return np.float32(1) + np.float32(scale.beta) * np.log(np.float32(1) + blocks)


def shown_query_scale(rope: Rope, emit: Emitter) -> Rope:
    """The rope of this layer with its query scale [T] shown (no scale: as it is)."""
    if rope.query_scale is None:
        return rope
    return dataclasses.replace(rope, query_scale=emit("self_attn.q_position_scale", rope.query_scale))


def position_scaled(q: np.ndarray, rope: Rope) -> np.ndarray:
    """Each position's queries times its scale.  [B, H, T, *] -> same (no scale: q itself)"""
    return q if rope.query_scale is None else q * rope.query_scale[:, None]
