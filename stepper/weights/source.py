"""Where the layer's weights come from, behind one small interface: `source.get(name)`.

Names are those of an HF checkpoint (`model.layers.3.self_attn.kv_a_proj_with_mqa.weight`).
Every source also gives a tensor in bands of rows (`row_bands`), so a product with a matrix
too large to hold in float32 (Kimi K2's lm_head, 4.7 GB) can run one band at a time.
`ArrayWeights` serves float32 tensors already in memory (tests, the PyTorch cross-check).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol

import numpy as np

from stepper.config import Config
from stepper.errors import StepperError
from stepper.weights.names import global_shapes, layer_shapes, shape_of
from stepper.weights.stored import Fp8Matrix, Stored


class WeightSource(Protocol):
    config: Config

    def get(self, name: str) -> np.ndarray:
        """The float32 tensor stored under an HF checkpoint name (FP8 dequantized)."""
        ...

    def get_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        """get(name)[rows], reading only those rows where the source can (embeddings)."""
        ...

    def matrix(self, name: str) -> np.ndarray | Fp8Matrix:
        """A weight to multiply with: float32, or FP8 codes with scales (see ops.linear)."""
        ...

    def row_bands(self, name: str, rows: int) -> Iterator[Stored]:
        """The stored tensor in consecutive bands of `rows` rows (the last may be shorter), each
        made or read only when the previous one is done with (see row_spans)."""
        ...

    def has(self, name: str) -> bool: ...

    def check(self, layers: Iterable[int], with_globals: bool) -> None:
        """Raise a StepperError listing every tensor these layers need that is missing or wrong."""
        ...


class ArrayWeights:
    """Weights already in memory, checked against the config's shapes when read."""

    def __init__(self, config: Config, arrays: Mapping[str, np.ndarray], source: str = "weights"):
        self.config = config
        self.arrays = arrays
        self.source = source

    def get_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        return self.get(name)[rows]

    def row_bands(self, name: str, rows: int) -> Iterator[Stored]:
        return Stored("F32", self.get(name)).row_bands(rows)

    def matrix(self, name: str) -> np.ndarray:
        return self.get(name)

    def has(self, name: str) -> bool:
        return name in self.arrays

    def check(self, layers: Iterable[int], with_globals: bool) -> None:
        needed = [n for layer in layers for n in layer_shapes(self.config, layer)]
        needed += list(global_shapes(self.config)) if with_globals else []
        missing = [n for n in needed if n not in self.arrays]
        if missing:
            raise StepperError(f"{self.source}: {len(missing)} tensor(s) missing, first '{missing[0]}'")

    def get(self, name: str) -> np.ndarray:
        if name not in self.arrays:
            raise StepperError(f"{self.source}: tensor '{name}' is missing")
        array = np.asarray(self.arrays[name], dtype=np.float32)
        expected = shape_of(self.config, name)
        if array.shape != expected:
            raise StepperError(f"{self.source}: tensor '{name}' has shape {list(array.shape)}, expected "
                               f"{list(expected)}")
        return array
