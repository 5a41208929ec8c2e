"""A layer's view of a weight source: `w("self_attn.o_proj.weight")` instead of full names."""

from __future__ import annotations

import numpy as np

from ..fp8_matmul import Fp8Matrix
from ..weights import WeightSource, layer_prefix


class LayerWeights:
    def __init__(self, source: WeightSource, layer: int):
        self.source = source
        self.layer = layer
        self.prefix = layer_prefix(layer)

    def __call__(self, name: str) -> np.ndarray:
        """A float32 tensor (norm weights, the router, the bias)."""
        return self.source.get(self.prefix + name)

    def matrix(self, name: str) -> np.ndarray | Fp8Matrix:
        """A projection weight to multiply with: FP8 weights stay FP8 (see ops.linear)."""
        return self.source.matrix(self.prefix + name)
