"""A tensor too large to hold, shown without being held: the attention scores and weights
[B, H, T, S] of a long prompt, a KDA layer's state after every token [B, H, T, K, V].

A `Tiled` [B, H, T, ...] knows its shape and dtype and makes any tile of heads and rows (query
rows, tokens) on demand (`tile(heads, rows)` -> [B, h, t, ...]); everything that looks at it works
a tile at a time: the statistics (views.summary), the heat map (pooled tile by tile), a slice
(`tiled[0, 3, 100]` computes that head's row only), a dump (written tile by tile).
`np.asarray(tiled)` makes the whole array, for the small sizes where that is fine. `source` says
what the tiles are made from.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import cache

import numpy as np

from stepper.tensors.tensor import LazyTensor, mib

Tile = Callable[[slice, slice], np.ndarray]  # (heads, rows) -> [B, h, t, ...]
TILE_VALUES = 1 << 22  # values per tile a reader asks for (16 MB of float32)
FLOAT32 = np.dtype(np.float32)
MAKER = "stepper-tiles"  # the thread that makes the next tile


class Tiled(LazyTensor):
    """A [B, H, T, ...] tensor made tile by tile; `tile(heads, rows)` -> [B, h, t, ...]."""

    made, whole = "a tile at a time", "a shorter prompt"

    def __init__(self, shape: tuple[int, ...], tile: Tile, dtype: np.dtype = FLOAT32,
                 source: str = "the attention's operands (no model run)"):
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        self.tile = tile
        self.source = source

    @property
    def row_values(self) -> int:
        """Values in one row of one head (S keys; K x V of a state)."""
        return math.prod(self.shape[3:])

    @property
    def small(self) -> bool:
        """Whether it is no larger than a tile (a short prompt's states after every token)."""
        return self.size <= TILE_VALUES

    def rows_per_tile(self) -> int:
        """Rows of one head per tile, so a tile holds about TILE_VALUES values."""
        B, _, T = self.shape[:3]
        return max(1, min(T, TILE_VALUES // max(1, B * self.row_values)))

    def tiles(self) -> Iterator[np.ndarray]:
        """The whole tensor in C order, a tile of one batch row at a time: [t, ...] of one head,
        or, where a head's rows are few (a decode step), [h, T, ...] of several heads at once, so
        the keys are read once for many heads. Each tile is made while the one before is looked
        at (`ahead`)."""
        B, H, T = self.shape[:3]
        rows = self.rows_per_tile()
        heads = max(1, TILE_VALUES // max(1, B * T * self.row_values)) if rows == T else 1
        spans = [(b, slice(h, min(h + heads, H)), slice(t, min(t + rows, T)))
                 for b in range(B) for h in range(0, H, heads) for t in range(0, T, rows)]
        return ahead(lambda span: self.tile(span[1], span[2])[span[0]], spans)

    in_order = tiles

    @property
    def cost(self) -> str:
        return f"reading it makes {mib(self.nbytes)} a tile at a time from {self.source}"

    def __getitem__(self, index) -> np.ndarray:
        """The values at an index of ints and slices, computing only the heads and rows it touches."""
        index = basic_index(index, self.ndim)
        heads, rows = touched(index[1], self.shape[1]), touched(index[2], self.shape[2])
        part = self.tile(heads, rows)  # [B, h, t, ...]
        part = np.take(part, np.arange(self.shape[2])[index[2]] - rows.start, axis=2)
        part = np.take(part, np.arange(self.shape[1])[index[1]] - heads.start, axis=1)
        return part[(index[0], Ellipsis, *index[3:])]  # the batch and trailing axes are still there

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        whole = np.empty(self.shape, self.dtype)
        H, T = self.shape[1:3]
        rows = self.rows_per_tile()
        for h in range(H):
            for t in range(0, T, rows):
                queries = slice(t, min(t + rows, T))
                whole[:, h:h + 1, queries] = self.tile(slice(h, h + 1), queries)
        return whole if dtype is None else whole.astype(dtype, copy=False)


def ahead(make: Callable[[object], np.ndarray], items: list) -> Iterator[np.ndarray]:
    """make(item) for each item in turn, the next one made on another thread while the caller
    looks at this one: a tile's products (which release the GIL) beside the statistics of the
    one before (which mostly hold it), so both cores work. (On that thread itself, in turn.)"""
    if threading.current_thread().name.startswith(MAKER):
        yield from map(make, items)
        return
    if not items:
        return
    coming = _maker().submit(make, items[0])
    for item in items[1:]:
        made = coming.result()
        coming = _maker().submit(make, item)
        yield made
    yield coming.result()


@cache
def _maker() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(1, thread_name_prefix=MAKER)


def basic_index(index, ndim: int = 4) -> tuple:
    """An index of ints, slices and at most one Ellipsis as one entry per axis of [B, H, T, ...]."""
    index = np.index_exp[index]
    if any(not isinstance(i, int | slice) and i is not Ellipsis for i in index):
        raise TypeError("only ints and slices index a tensor made in tiles")
    if Ellipsis in index:
        at = index.index(Ellipsis)
        index = index[:at] + (slice(None),) * (ndim + 1 - len(index)) + index[at + 1:]
    if len(index) > ndim:
        raise IndexError(f"too many indices for a tensor of {ndim} dimensions: {len(index)}")
    return index + (slice(None),) * (ndim - len(index))


def touched(index: int | slice, n: int) -> slice:
    """The smallest slice of range(n) holding every position an index of one axis selects."""
    picked = np.atleast_1d(np.arange(n)[index])
    if picked.size == 0:
        return slice(0, 0)
    return slice(int(picked.min()), int(picked.max()) + 1)
