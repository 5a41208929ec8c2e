"""A tensor too large to hold, shown without being held: the attention scores and weights
[B, H, T, S] of a long prompt.

A `Tiled` knows its shape and dtype and makes any tile of heads and query rows on demand
(`tile(heads, queries)` -> [B, h, t, S]); everything that looks at it works a tile at a time:
the statistics (views.summary), the heat map (pooled tile by tile), a slice (`tiled[0, 3, 100]`
computes that head's row only), a dump (written tile by tile). `np.asarray(tiled)` makes the
whole array, for the small sizes where that is fine.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import cache

import numpy as np

from stepper.tensors.tensor import LazyTensor, mib

Tile = Callable[[slice, slice], np.ndarray]  # (heads, queries) -> [B, h, t, S]
TILE_VALUES = 1 << 22  # values per tile a reader asks for (16 MB of float32)
FLOAT32 = np.dtype(np.float32)
MAKER = "stepper-tiles"  # the thread that makes the next tile


class Tiled(LazyTensor):
    """A [B, H, T, S] tensor made tile by tile; `tile(heads, queries)` -> [B, h, t, S]."""

    made, whole = "a tile at a time", "a shorter prompt"

    def __init__(self, shape: tuple[int, int, int, int], tile: Tile, dtype: np.dtype = FLOAT32):
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        self.tile = tile

    def rows_per_tile(self) -> int:
        """Query rows of one head per tile, so a tile holds about TILE_VALUES values."""
        B, _, T, S = self.shape
        return max(1, min(T, TILE_VALUES // max(1, B * S)))

    def tiles(self) -> Iterator[np.ndarray]:
        """The whole tensor in C order, a tile of one batch row at a time: [t, S] of one head,
        or, where a head's rows are few (a decode step), [h, T, S] of several heads at once, so
        the keys are read once for many heads. Each tile is made while the one before is looked
        at (`ahead`)."""
        B, H, T, S = self.shape
        rows = self.rows_per_tile()
        heads = max(1, TILE_VALUES // max(1, B * T * S)) if rows == T else 1
        spans = [(b, slice(h, min(h + heads, H)), slice(t, min(t + rows, T)))
                 for b in range(B) for h in range(0, H, heads) for t in range(0, T, rows)]
        return ahead(lambda span: self.tile(span[1], span[2])[span[0]], spans)

    in_order = tiles

    @property
    def cost(self) -> str:
        return f"reading it makes {mib(self.nbytes)} a tile at a time from the attention's operands (no model run)"

    def __getitem__(self, index) -> np.ndarray:
        """The values at an index of ints and slices, computing only the heads and query rows it touches."""
        index = basic_index(index)
        heads, queries = touched(index[1], self.shape[1]), touched(index[2], self.shape[2])
        part = self.tile(heads, queries)  # [B, h, t, S]
        part = np.take(part, np.arange(self.shape[2])[index[2]] - queries.start, axis=2)
        part = np.take(part, np.arange(self.shape[1])[index[1]] - heads.start, axis=1)
        return part[index[0], ..., index[3]]  # the batch and key axes are still there

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        whole = np.empty(self.shape, self.dtype)
        _, H, T, _ = self.shape
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


def basic_index(index) -> tuple:
    """An index of ints, slices and at most one Ellipsis as one entry per axis of [B, H, T, S]."""
    index = np.index_exp[index]
    if any(not isinstance(i, int | slice) and i is not Ellipsis for i in index):
        raise TypeError("only ints and slices index a tensor made in tiles")
    if Ellipsis in index:
        at = index.index(Ellipsis)
        index = index[:at] + (slice(None),) * (5 - len(index)) + index[at + 1:]
    if len(index) > 4:
        raise IndexError(f"too many indices for a tensor of 4 dimensions: {len(index)}")
    return index + (slice(None),) * (4 - len(index))


def touched(index: int | slice, n: int) -> slice:
    """The smallest slice of range(n) holding every position an index of one axis selects."""
    picked = np.atleast_1d(np.arange(n)[index])
    if picked.size == 0:
        return slice(0, 0)
    return slice(int(picked.min()), int(picked.max()) + 1)
