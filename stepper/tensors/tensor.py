"""What a tensor of a run is: a NumPy array when it is held, else a `LazyTensor`, made when read.

Two kinds are made when read, both `LazyTensor`s with the same face: a tensor too large to hold
(a long prompt's attention scores and weights: `stepper.tensors.tiled.Tiled`, made a tile at a time from
the attention's operands) and a tensor of a prefill run in chunks of positions
(`stepper.tensors.chunked.Chunked`, made by replaying the chunks). A lazy tensor tells its shape, dtype
and sizes as an array does; `cost` says, in one sentence, what reading it makes; `numpy()` (or
`np.asarray(t)`) reads it; `keep_when_read()` has a holder's tensors made together and kept (a
chunked run's: one replay for all, never one per read); `tiles()` gives its values a tile at a
time (for statistics: in no particular order); `figures` are its statistics when they are known
without reading it (a chunked prefill's, gathered as it ran), else None. `held(t)` tells an
array from a lazy tensor, so no consumer needs to know which kind it has.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from stepper.tensors.statistics import Lattice, Stats, pieces


@dataclass(frozen=True)
class Figures:
    """What the views show of a tensor, gathered exactly chunk by chunk."""

    stats: Stats
    bins: Lattice  # the histogram of the finite values
    first: list[float]  # corners: the first values of the first row, the last of the last
    last: list[float]


class LazyTensor:
    """A tensor not held, made when read: its shape, dtype and sizes as an array's; `numpy()` its values."""

    shape: tuple[int, ...]
    dtype: np.dtype
    figures: Figures | None = None  # its statistics, known without reading it (None: read to know them)
    made = "when read"  # how it is made, and what holds it whole (said when a patch would replace it)
    whole = "a held run"
    small = False  # whether it is no larger than what is made at once, so a reader may as well make it whole

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def cost(self) -> str:
        """What reading it makes, in one sentence."""
        raise NotImplementedError

    def keep_when_read(self) -> None:
        """Have the first read that makes this tensor's kind make this one with it, and keep it
        (a chunked prefill's kept tensors: one replay for all; a tile is cheap to make again)."""

    def numpy(self) -> np.ndarray:
        """The whole tensor, as `np.asarray(t)` makes it (see `cost`)."""
        return np.asarray(self)

    def tiles(self) -> Iterator[np.ndarray]:
        """The values a tile at a time (for order-free figures)."""
        return pieces(np.asarray(self))

    def in_order(self) -> Iterator[np.ndarray]:
        """The values a tile at a time, in C order (as a file of the whole tensor holds them)."""
        yield np.ascontiguousarray(self)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        raise NotImplementedError

    def __len__(self) -> int:
        return self.shape[0]

    def __getattr__(self, name: str):
        """An array's method or attribute it has not (sum, T, astype): say how to get the array."""
        if not name.startswith("_") and hasattr(np.ndarray, name):
            raise AttributeError(f"'{type(self).__name__}' has no '{name}': it is a LazyTensor, made when read; "
                                 f"its .numpy() is the array ({self.cost})")
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self.shape)}, {self.dtype}: {self.cost})"

    def _no_arithmetic(self, *other: object) -> Any:
        """lazy * 2, lazy - lazy, -lazy: say how to get the array, as a missing method does. With an
        array, NumPy's own operator reads it whole (lazy - array, as array - lazy)."""
        if other and isinstance(other[0], np.ndarray):
            return NotImplemented
        raise TypeError(f"'{type(self).__name__}' takes no arithmetic: it is a LazyTensor, made when read; "
                        f"its .numpy() is the array ({self.cost})")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _no_arithmetic
    __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __pow__ = __rpow__ = __matmul__ = __rmatmul__ = _no_arithmetic
    __neg__ = __pos__ = __abs__ = __lt__ = __le__ = __gt__ = __ge__ = _no_arithmetic


Tensor = np.ndarray | LazyTensor


def held(tensor: Tensor) -> bool:
    """Whether a tensor is a whole array (not one made when read)."""
    return not isinstance(tensor, LazyTensor)


def same_values(a: np.ndarray, b: np.ndarray, block: int = 1 << 16) -> bool:
    """Whether two arrays of one shape hold the same values (NaN the same as NaN), a block at a time:
    np.array_equal of the whole makes copies of both, 2.75 times their bytes."""
    flat_a, flat_b, nan = np.ravel(a), np.ravel(b), a.dtype.kind in "fc"
    return all(np.array_equal(flat_a[s:s + block], flat_b[s:s + block], equal_nan=nan) for s in range(0, a.size, block))


def mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:,.1f} MiB"
