"""A memory-bounded cache of decoded weights (`--weight-cache-mb`).

Decoding FP8 (or INT4) costs more than multiplying by the decoded float32 matrix. Decode steps read the
same attention and shared-expert weights every step (and sometimes the same experts), so keeping
decoded matrices makes the second and later steps faster. The cache never holds more than its
budget; a weight bigger than the budget is never kept.

Which weights are kept: a weight is kept from its second use on, and room is made for it only by
letting go of weights used fewer times than it (least recently used first). Routed experts mostly
change from one step to the next; kept as they come, least recently used out, each step's new
experts (176 MB each in float32 at full size) pushed the attention and shared-expert weights out,
and every step decoded whole weights it then used once, slower than no cache at all. Making a fresh
176 MB array costs more than the FP8 product of one use. Every AGE_EVERY uses all the counts are
halved, so that a weight used often long ago does not keep its place against one used often now (a
run stepping on to other layers, say).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator

import numpy as np

from stepper.kernels.linear import float32_weight
from stepper.weights.source import WeightSource
from stepper.weights.stored import Fp8Matrix, Int4Matrix, Stored

USES_KEPT = 1 << 16  # names whose uses are counted, kept weights aside
AGE_EVERY = 1 << 12  # uses between two halvings of every count (a full-size decode step makes ~2,000)


class CachedWeights:
    """A WeightSource that keeps decoded float32 matrices of another, up to `max_bytes`."""

    def __init__(self, source: WeightSource, max_bytes: int):
        self.source = source
        self.config = source.config
        self.max_bytes = max_bytes
        self.kept: OrderedDict[str, np.ndarray] = OrderedDict()  # least recently used first
        self.uses: dict[str, int] = {}
        self.uses_since_aging = 0
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def matrix(self, name: str) -> np.ndarray | Fp8Matrix | Int4Matrix:
        uses = self._count_use(name)
        if name in self.kept:
            self.kept.move_to_end(name)
            self.hits += 1
            return self.kept[name]
        self.misses += 1
        weight = self.source.matrix(name)
        if uses < 2 or not self._make_room(int(np.prod(weight.shape)) * 4, uses):
            return weight
        decoded = float32_weight(weight)
        self.kept[name] = decoded
        self.bytes += decoded.nbytes
        return decoded

    def _count_use(self, name: str) -> int:
        if len(self.uses) >= USES_KEPT:
            self.uses = {kept: self.uses[kept] for kept in self.kept}
        self.uses_since_aging += 1
        if self.uses_since_aging >= AGE_EVERY:
            self.uses = {n: count // 2 for n, count in self.uses.items() if count > 1 or n in self.kept}
            self.uses_since_aging = 0
        self.uses[name] = self.uses.get(name, 0) + 1
        return self.uses[name]

    def _make_room(self, size: int, uses: int) -> bool:
        """Room for `size` bytes, made by letting go of the least recently used weights among
        those used fewer than `uses` times; False, and nothing let go, if that is not enough."""
        free, going = self.max_bytes - self.bytes, []
        for name, array in self.kept.items():
            if free >= size:
                break
            if self.uses[name] < uses:
                going.append(name)
                free += array.nbytes
        if free < size:
            return False
        for name in going:
            self.bytes -= self.kept.pop(name).nbytes
        return True

    def get(self, name: str) -> np.ndarray:
        return self.source.get(name)

    def get_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        return self.source.get_rows(name, rows)

    def row_bands(self, name: str, rows: int) -> Iterator[Stored]:
        return self.source.row_bands(name, rows)

    def has(self, name: str) -> bool:
        return self.source.has(name)

    def check(self, layers: Iterable[int], with_globals: bool) -> None:
        self.source.check(layers, with_globals)

    def stored(self, name: str):
        return self.source.stored(name)
