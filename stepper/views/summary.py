"""Statistics of a tensor as the views show them: range, moments, NaN/Inf counts, a histogram and
the corner values, and how a number of them is written. Non-finite entries (NaN, and the -inf of
masked attention scores) are counted and left out of the other statistics, so one masked entry does
not turn every figure into -inf.

Every figure is gathered a batch of values at a time, exactly and in one pass
(stepper.tensors.statistics): a tensor too large to hold (a `Tiled`, made block by block) gets the
same figures, and the same histogram bins, as the whole array would; a lazy tensor that knows its
`figures` (a chunked prefill's, gathered as the prefill ran) brings them.

A histogram's `bins` equal bins are runs of the exact lattice bins the statistics gathered
(`statistics.Lattice`): they start at a round point at or below the min (a multiple of a power
of two) and end past the max by less than a bin, so that any split of a tensor, in any order,
gives the same counts without waiting for its range.

An integer tensor (the router's chosen experts, the indexer's chosen positions) is shown as
integers: its bins are whole integers (`statistics.IntegerLattice`: a bin per value where the
range fits, else equal runs of them), and its min, max, absmax, sum, corners and bin edges are
written exactly (`value`); its mean and std as any tensor's."""

from __future__ import annotations

import math

from stepper.tensors import statistics
from stepper.tensors.statistics import BINS, CORNER, Gather, Lattice, Stats, chunks, integral, ldexp_or_inf, no_finite
from stepper.tensors.tensor import Figures, Tensor, held

SPARK = "▁▂▃▄▅▆▇█"


def stats(array: Tensor) -> Stats:
    """The statistics of a tensor, gathered a batch of values at a time (a Tiled one a block at a time)."""
    return look(array)[0]


def look(array: Tensor) -> tuple[Stats, Lattice]:
    """The statistics and histogram of a tensor, in one pass (or known: a lazy tensor's `figures`)."""
    known = figures(array)
    if known is not None:
        return known.stats, known.bins
    gathered = gather(array)
    return gathered.stats(), gathered.bins


def gather(array: Tensor) -> Gather:
    gathered = Gather(integral(array.dtype))
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
    # in units of 2**e, every |value| below 1: no square or sum overflows (values near 1e300); the same figures
    # otherwise (powers of two scale exactly)
    e = math.frexp(max(p.absmax for p in finite))[1]
    total = math.fsum(math.ldexp(p.sum, -e) for p in finite)
    mean = total / n
    m2 = math.fsum(p.finite * (math.ldexp(p.std, -e) ** 2 + (math.ldexp(p.mean, -e) - mean) ** 2) for p in finite)
    return Stats(
        min=min(p.min for p in finite), max=max(p.max for p in finite), mean=ldexp_or_inf(mean, e),
        std=ldexp_or_inf(math.sqrt(m2 / n), e), absmax=max(p.absmax for p in finite),
        sum=ldexp_or_inf(total, e), nan=nan, inf=inf, finite=n,
    )


def histogram(array: Tensor, bins: int = BINS) -> tuple[list[int], float | int, float | int]:
    """Counts of the finite values in `bins` equal bins (`Lattice.view`; an integer tensor's: at
    most `bins`, of whole integers). -> (counts, the first bin's left edge, the last one's right
    edge: integers for an integer tensor); nan edges when no value is finite"""
    counts, edges = look(array)[1].view(bins)
    return counts.tolist(), edges[0].item(), edges[-1].item()


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


def value(x: float, integers: bool) -> str:
    """A value of a tensor as the views write it: an integer tensor's as an integer, else `number`."""
    return str(int(x)) if integers and math.isfinite(x) else number(x)


def exact(x: float, integers: bool) -> float | int | None:
    """A value of a tensor for JSON (`finite_or_none`): an integer tensor's as an integer."""
    return int(x) if integers and math.isfinite(x) else finite_or_none(x)


def finite_or_none(x: float) -> float | int | None:
    """A value for JSON, which has no NaN or infinities: those become null."""
    return None if isinstance(x, float) and not math.isfinite(x) else x


def token_ids(ids, shown: int = 16) -> str:
    """Token ids as a list, a long one cut to its first and last few with its length, so that a
    512-token prompt does not fill the screen."""
    ids = [int(i) for i in ids]
    if len(ids) <= shown:
        return str(ids)
    head, tail = ids[: shown * 3 // 4], ids[-(shown // 4) :]
    return f"[{', '.join(map(str, head))}, … {', '.join(map(str, tail))}] ({len(ids)} tokens)"
