"""A memory-bounded cache of decoded weights (`--weight-cache-mb`).

Decoding FP8 costs more than multiplying by the decoded float32 matrix. Decode steps read the
same attention and shared-expert weights every step (and often the same experts), so keeping
decoded matrices, least recently used out first, makes the second and later steps faster. The
cache never holds more than its budget; a weight bigger than the budget is never kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator

import numpy as np

from .fp8_matmul import Fp8Matrix
from .weights import Stored, WeightSource


class CachedWeights:
    """A WeightSource that keeps decoded float32 matrices of another, up to `max_bytes`."""

    def __init__(self, source: WeightSource, max_bytes: int):
        self.source = source
        self.config = source.config
        self.max_bytes = max_bytes
        self.kept: OrderedDict[str, np.ndarray] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def matrix(self, name: str) -> np.ndarray | Fp8Matrix:
        if name in self.kept:
            self.kept.move_to_end(name)
            self.hits += 1
            return self.kept[name]
        self.misses += 1
        weight = self.source.matrix(name)
        size = int(np.prod(weight.shape)) * 4
        if size > self.max_bytes:
            return weight
        dense = weight.dense() if isinstance(weight, Fp8Matrix) else weight
        while self.bytes + size > self.max_bytes:
            _, old = self.kept.popitem(last=False)
            self.bytes -= old.nbytes
        self.kept[name] = dense
        self.bytes += dense.nbytes
        return dense

    def get(self, name: str) -> np.ndarray:
        return self.source.get(name)

    def get_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        return self.source.get_rows(name, rows)

    def row_blocks(self, name: str, rows: int) -> Iterator[Stored]:
        return self.source.row_blocks(name, rows)

    def has(self, name: str) -> bool:
        return self.source.has(name)

    def check(self, layers: Iterable[int], with_globals: bool) -> None:
        self.source.check(layers, with_globals)

    def stored(self, name: str):
        return self.source.stored(name)
