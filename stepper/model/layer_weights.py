"""A layer's view of a weight source: `w("self_attn.o_proj.weight")` instead of full names."""

from __future__ import annotations

import numpy as np

from ..weights import WeightSource, layer_prefix


class LayerWeights:
    def __init__(self, source: WeightSource, layer: int):
        self.source = source
        self.layer = layer
        self.prefix = layer_prefix(layer)

    def __call__(self, name: str) -> np.ndarray:
        return self.source.get(self.prefix + name)
