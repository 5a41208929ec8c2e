"""The dense SwiGLU MLP of the first `first_k_dense_replace` layers."""

from __future__ import annotations

import numpy as np

from stepper.kernels.linear import linear, linears
from stepper.model.layer_weights import LayerWeights
from stepper.model.ops import silu
from stepper.seams.trace import Emitter


def dense_mlp(x: np.ndarray, w: LayerWeights, emit: Emitter) -> np.ndarray:
    """down(silu(gate(x)) * up(x)).  [B, T, d] -> [B, T, d]"""
    gate, up = linears(x, (w.matrix("mlp.gate_proj.weight"), w.matrix("mlp.up_proj.weight")))  # [B, T, inter] each
    gate = emit("mlp.gate_proj", gate)
    up = emit("mlp.up_proj", up)
    act = emit("mlp.act", silu(gate) * up)  # [B, T, inter]
    return linear(act, w.matrix("mlp.down_proj.weight"))
