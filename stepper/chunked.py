"""A tensor of a prefill run a chunk of positions at a time (stepper.prefill): one tensor over
every position of the prompt, as the whole prompt's run has it, though only one chunk of it is
made at a time.

A `Chunked` knows its shape, dtype and figures (the statistics, the sparkline's histogram and the
corners, gathered exactly chunk by chunk while the prefill ran), so the views show it at no cost;
its values are made again, a chunk at a time, by whoever asks for them (`pieces()`, `blocks()`,
`np.asarray(chunked)`): each piece is that chunk's run replayed against the cache as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from stepper.statistics import Stats, pieces
from stepper.tiled import Tiled, Unheld

Piece = Callable[[int], "np.ndarray | Tiled"]  # chunk k -> its part of the tensor, as the whole tensor has it


@dataclass(frozen=True)
class Figures:
    """What the views show of a tensor, gathered exactly chunk by chunk."""

    stats: Stats
    counts: list[int]  # the histogram of the finite values in len(counts) equal bins between stats.min and max
    first: list[float]  # corners: the first values of the first row, the last of the last
    last: list[float]


class Chunked(Unheld):
    """A tensor whose positions axis `axis` is made in `chunks` pieces, `piece(k)` each."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, axis: int, chunks: int, piece: Piece, figures: Figures):
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        self.axis, self.chunks, self.piece, self.figures = axis, chunks, piece, figures

    def pieces(self) -> Iterator[np.ndarray | Tiled]:
        """Each chunk's part, in order along the positions axis."""
        for k in range(self.chunks):
            yield self.piece(k)

    def blocks(self) -> Iterator[np.ndarray]:
        """The values a block at a time, chunk by chunk (not in C order: for order-free figures)."""
        for part in self.pieces():
            yield from part.blocks() if isinstance(part, Tiled) else pieces(np.asarray(part))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        whole = np.concatenate([np.asarray(part) for part in self.pieces()], axis=self.axis)
        return whole if dtype is None else whole.astype(dtype, copy=False)

    def __getitem__(self, index) -> np.ndarray:
        return np.asarray(self)[index]

    def __repr__(self) -> str:
        return f"Chunked({list(self.shape)}, {self.dtype}, {self.chunks} chunks)"
