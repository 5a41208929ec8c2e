"""A.X-K2's gated RMSNorms: RMSNorm, then its output times a sigmoid gate made from itself
through a rank-`gated_norm_rank` SwiGLU-less bottleneck: y * sigmoid(W_up silu(W_down y)).
input_layernorm is gated in every layer, post_attention_layernorm in the MoE layers; the norm's
own weight is stored as `<norm>.norm.weight` beside `<norm>.W_down.weight` and `<norm>.W_up.weight`.

Shapes: B batch, T new positions, d hidden (the bottleneck, gated_norm_rank, is not shown).
"""

from __future__ import annotations

import numpy as np

from stepper.config import Config
from stepper.kernels.linear import linear
from stepper.model.layer_weights import LayerWeights
from stepper.model.ops import sigmoid, silu
from stepper.seams.trace import Emitter


def is_gated(cfg: Config, layer: int, norm: str) -> bool:
    """Whether the layer's norm ("input_layernorm" or "post_attention_layernorm") is gated."""
    return cfg.has_gated_norms and (norm == "input_layernorm" or cfg.is_moe_layer(layer))


def norm_weight(cfg: Config, layer: int, norm: str) -> str:
    """The RMSNorm weight's name: `<norm>.weight`, or a gated norm's `<norm>.norm.weight`."""
    return f"{norm}.norm.weight" if is_gated(cfg, layer, norm) else f"{norm}.weight"


def norm_gate(y: np.ndarray, w: LayerWeights, norm: str) -> np.ndarray:
    """sigmoid(W_up silu(W_down y)).  [B, T, d] -> [B, T, d]"""
    return sigmoid(linear(silu(linear(y, w.matrix(f"{norm}.W_down.weight"))), w.matrix(f"{norm}.W_up.weight")))


def gated_input_norm(y: np.ndarray, w: LayerWeights, emit: Emitter) -> np.ndarray:
    """input_layernorm's output times its gate.  [B, T, d] -> [B, T, d]"""
    gate = emit("input_layernorm_gate", norm_gate(y, w, "input_layernorm"))
    return emit("input_layernorm_gated", y * gate)


def gated_post_attention_norm(y: np.ndarray, w: LayerWeights, emit: Emitter) -> np.ndarray:
    """post_attention_layernorm's output times its gate (MoE layers).  [B, T, d] -> [B, T, d]"""
    gate = emit("post_attention_layernorm_gate", norm_gate(y, w, "post_attention_layernorm"))
    return emit("post_attention_layernorm_gated", y * gate)
