"""A tensor of a prefill run a chunk of positions at a time (stepper.prefill): one tensor over
every position of the prompt, as the whole prompt's run has it, though only one chunk of it is
made at a time.

A `Chunked` knows its shape, dtype and figures (the statistics, the sparkline's histogram and the
corners, gathered exactly chunk by chunk while the prefill ran), so the views show it at no cost.
Its values come from its `Source`, the prefill's replay: reading one (`np.asarray(chunked)`,
`numpy()`) replays the chunks once against the cache as it was. The tensors a holder keeps
(`keep_when_read`: a `stepper.run`'s) are made together on the first read and kept, so reading
the others replays nothing; `cost` says which.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from stepper.tensors.tensor import Figures, LazyTensor


class Source(Protocol):
    """Where a chunked tensor's values come from: the replay of the prefill's chunks."""

    def whole(self, name: str) -> np.ndarray:
        """The tensor `name` over every chunk (made with the others it keeps, in one replay)."""

    def cost(self, name: str) -> str:
        """What reading `name` makes, in one sentence."""

    def keep(self, name: str) -> None:
        """Make `name` with the others kept on the first read of one, and keep it."""


class Chunked(LazyTensor):
    """A tensor whose positions axis `axis` is made in `chunks` pieces, read from `source` by its name."""

    made, whole = "a chunk of the prefill at a time", "a prefill run whole"

    def __init__(self, name: str, shape: tuple[int, ...], dtype: np.dtype, axis: int, chunks: int, source: Source,
                 figures: Figures):
        self.name, self.shape, self.dtype = name, tuple(int(n) for n in shape), np.dtype(dtype)
        self.axis, self.chunks, self.source, self.figures = axis, chunks, source, figures

    @property
    def cost(self) -> str:
        return self.source.cost(self.name)

    def keep_when_read(self) -> None:
        self.source.keep(self.name)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        whole = self.source.whole(self.name)
        return whole if dtype is None else whole.astype(dtype, copy=False)

    def __getitem__(self, index) -> np.ndarray:
        return np.asarray(self)[index]
