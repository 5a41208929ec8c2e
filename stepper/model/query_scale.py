"""Position-dependent query scales, so that attention stays sharp over long contexts. Both parts
of the query are scaled after RoPE, before the scores; keys are not.

- Mistral 4 (Llama 4's attention scaling): past the YaRN context it was trained on, every query is
  multiplied by 1 + beta * ln(1 + floor(p / L)) at its position p (L = original_max_position_embeddings).
- Mistral Large 4 (`softmax_scaling`): each head h's queries at position p times scale_h ln(p + 1)
  + bias_h, scale and bias learned per layer (and, before its RoPE, the indexer's per index head).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from stepper.config import QueryScale
from stepper.model.layer_weights import LayerWeights
from stepper.model.rope import Rope
from stepper.seams.trace import Emitter


def llama4_query_scale(positions: np.ndarray, scale: QueryScale) -> np.ndarray:
    """1 + beta * ln(1 + floor(p / L)) for positions [T] -> [T], in float32 as the reference."""
    blocks = np.floor(positions.astype(np.float32) / np.float32(scale.original_max_position_embeddings))  # [T]
    return np.float32(1) + np.float32(scale.beta) * np.log(np.float32(1) + blocks)


def learned_scale(w: LayerWeights, module: str, log_positions: np.ndarray) -> np.ndarray:
    """Mistral Large 4's factor of each head's queries at each position: scale_h ln(p + 1) + bias_h
    (`module`.softmax_scaling.scale and .bias [H], the indexer's [Hi]).  log_positions [T] -> [H, T] (or [Hi, T])"""
    scale, bias = w(f"{module}softmax_scaling.scale"), w(f"{module}softmax_scaling.bias")  # [H] each
    return scale[:, None] * log_positions[None, :] + bias[:, None]


def shown_query_scale(rope: Rope, w: LayerWeights, emit: Emitter) -> Rope:
    """The rope of this layer with its query scale shown: Mistral 4's [T], or Mistral Large 4's
    learned [H, T] (no scale: as it is)."""
    if w.cfg.learned_query_scale:
        factor = emit("self_attn.softmax_scaling", learned_scale(w, "self_attn.", rope.log_positions))  # [H, T]
        return dataclasses.replace(rope, query_scale=factor)
    if rope.query_scale is None:
        return rope
    return dataclasses.replace(rope, query_scale=emit("self_attn.q_position_scale", rope.query_scale))


def position_scaled(q: np.ndarray, rope: Rope) -> np.ndarray:
    """Each position's queries (each head's: [H, T]) times its scale.  [B, H, T, *] -> same (no scale: q itself)"""
    return q if rope.query_scale is None else q * rope.query_scale[..., None]
