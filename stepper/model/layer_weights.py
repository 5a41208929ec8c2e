"""A layer's view of a weight source: `w("self_attn.o_proj.weight")` instead of full names."""

from __future__ import annotations

import numpy as np

from stepper.kernels.linear import float32_weight
from stepper.weights.names import layer_prefix
from stepper.weights.source import WeightSource
from stepper.weights.stored import Fp8Matrix


class LayerWeights:
    def __init__(self, source: WeightSource, layer: int, scratch: dict | None = None):
        self.source = source
        self.layer = layer
        self.prefix = layer_prefix(layer)
        self.scratch = {} if scratch is None else scratch  # shape -> (float32 memory, the weight it holds), for `float32`

    def __call__(self, name: str) -> np.ndarray:
        """A float32 tensor (norm weights, the router, the bias)."""
        return self.source.get(self.prefix + name)

    def matrix(self, name: str) -> np.ndarray | Fp8Matrix:
        """A projection weight to multiply with: FP8 weights stay FP8 (see ops.linear)."""
        return self.source.matrix(self.prefix + name)

    def float32(self, name: str) -> np.ndarray:
        """A weight as float32, read-only; an FP8 one decoded into memory reused from one call to
        the next (so valid only until the next call, whichever layer makes it). kv_b of the
        absorbed attention is asked for at every decode step: a fresh 33 MB array, its pages
        faulted in while the page cache is full, took as long again as the decoding, and the
        decoding itself (6-7 ms) is skipped when the memory still holds the same checkpoint
        weight, as it does when one layer is stepped through."""
        weight = self.matrix(name)
        if not isinstance(weight, Fp8Matrix):
            return weight
        memory, holds = self.scratch.get(weight.shape, (None, None))
        if memory is None:
            memory = np.empty(weight.shape, np.float32)
        key = weight.file_key  # synthetic weights: no key
        if key is None or key != holds:
            self.scratch[weight.shape] = (memory, None)  # holds nothing whole until decoded
            memory.flags.writeable = True
            float32_weight(weight, memory)
            memory.flags.writeable = False
            self.scratch[weight.shape] = (memory, key)
        return memory
