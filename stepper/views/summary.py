"""Statistics of a tensor as the views show them: range, moments, NaN/Inf counts, a histogram and
the corner values, and how a number of them is written. Non-finite entries (NaN, and the -inf of
masked attention scores) are counted and left out of the other statistics, so one masked entry does
not turn every figure into -inf.

Every figure is gathered a batch of values at a time, exactly (stepper.tensors.statistics): a tensor too large to
hold (a `Tiled`, made block by block) gets the same figures, and the same histogram bins, as the
whole array would; a lazy tensor that knows its `figures` (a chunked prefill's, gathered as the
prefill ran) brings them."""

from __future__ import annotations

import math

import numpy as np

from stepper.tensors import statistics
from stepper.tensors.statistics import BINS, CORNER, Gather, Stats, bin_counts, chunks, edges, no_finite
from stepper.tensors.tensor import Figures, Tensor, held

SPARK = "▁▂▃▄▅▆▇█"


def stats(array: Tensor) -> Stats:
    """The statistics of a tensor, gathered a batch of values at a time (a Tiled one a block at a time)."""
    known = figures(array)
    if known is not None:
        return known.stats
    return gather(array).stats()


def gather(array: Tensor) -> Gather:
    gathered = Gather()
    for batch in chunks(array):
        gathered.add(batch)
    return gathered


def combine(parts: list[Stats]) -> Stats:
    """The statistics of several parts together (one part: its own statistics, unchanged)."""
    if len(parts) == 1:
        return parts[0]
    nan, inf = sum(p.nan for p in parts), sum(p.inf for p in parts)
    finite = [p for p in parts if p.finite]
    n = sum(p.finite for p in finite)
    if n == 0:
        return no_finite(nan, inf)
    total = math.fsum(p.sum for p in finite)
    mean = total / n
    m2 = math.fsum(p.finite * (p.std**2 + (p.mean - mean) ** 2) for p in finite)
    return Stats(
        min=min(p.min for p in finite), max=max(p.max for p in finite), mean=mean, std=math.sqrt(m2 / n),
        absmax=max(p.absmax for p in finite), sum=total, nan=nan, inf=inf, finite=n,
    )


def histogram(array: Tensor, bins: int = BINS,
              known: Stats | None = None) -> tuple[list[int], float, float]:
    """Counts of the finite values in `bins` equal bins between their min and max, gathered a
    batch of values at a time (a second pass once `stats` knows the range; `known` saves the first)."""
    known = known or stats(array)
    if known.finite == 0:
        return [0] * bins, float("nan"), float("nan")
    if (fig := figures(array)) is not None and bins == len(fig.counts):
        return list(fig.counts), known.min, known.max
    span, counts = edges(known), np.zeros(bins, np.int64)
    for batch in chunks(array):
        counts += bin_counts(batch, span, bins)
    return counts.tolist(), known.min, known.max


def sparkline(counts: list[int]) -> str:
    """One character per bin, its height proportional to the count; empty bins are blank."""
    top = max(counts) if counts else 0
    if top == 0:
        return " " * len(counts)
    return "".join(" " if c == 0 else SPARK[min(len(SPARK) - 1, (c * len(SPARK) - 1) // top)] for c in counts)


def corners(array: Tensor, n: int = CORNER) -> tuple[list[float], list[float]]:
    """The first n values of the first row and the last n of the last row (rows = last axis)."""
    if (fig := figures(array)) is not None and n == CORNER:
        return list(fig.first), list(fig.last)
    return statistics.corners(array, n)


def figures(array: Tensor) -> Figures | None:
    """The figures a lazy tensor knows without being read; None for others."""
    return None if held(array) else array.figures


def number(x: float) -> str:
    """A value as the views write it: 4 significant digits; NaN and infinities by name."""
    if not math.isfinite(x):
        return str(x)
    return f"{x:.4g}"


def finite_or_none(x: float) -> float | int | None:
    """A value for JSON, which has no NaN or infinities: those become null."""
    return None if isinstance(x, float) and not math.isfinite(x) else x
