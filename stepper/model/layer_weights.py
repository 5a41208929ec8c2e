"""A layer's view of a weight source: `w("self_attn.o_proj.weight")` instead of full names. It also
carries what every part of the layer reads beside its weights: the config (`w.cfg`) and the
rotary tables of the step's positions (`w.rope`)."""

from __future__ import annotations

import numpy as np

from stepper.kernels.linear import float32_kept
from stepper.model.rope import Rope
from stepper.weights.names import layer_prefix
from stepper.weights.source import WeightSource
from stepper.weights.stored import Fp8Matrix


class LayerWeights:
    def __init__(self, source: WeightSource, layer: int, scratch: dict | None = None, rope: Rope | None = None):
        self.source = source
        self.cfg = source.config
        self.rope = rope  # the rotary tables of the positions this layer runs on
        self.layer = layer
        self.prefix = layer_prefix(layer)
        self.scratch = {} if scratch is None else scratch  # float32 memory kept for `float32` (kernels.linear)

    def __call__(self, name: str) -> np.ndarray:
        """A float32 tensor (norm weights, the router, the bias)."""
        return self.source.get(self.prefix + name)

    def matrix(self, name: str) -> np.ndarray | Fp8Matrix:
        """A projection weight to multiply with: FP8 weights stay FP8 (see kernels.linear)."""
        return self.source.matrix(self.prefix + name)

    def float32(self, name: str) -> np.ndarray:
        """A weight as float32, read-only, valid until the next call (whichever layer makes it):
        an FP8 one is decoded into memory kept from one call to the next (kernels.linear.float32_kept)."""
        return float32_kept(self.matrix(name), self.scratch)
