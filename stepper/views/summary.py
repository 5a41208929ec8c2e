"""Statistics of a tensor as the views show them: range, moments, NaN/Inf counts, a histogram and
the corner values, and how a number of them is written. Non-finite entries (NaN, and the -inf of
masked attention scores) are counted and left out of the other statistics, so one masked entry does
not turn every figure into -inf."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

SPARK = "▁▂▃▄▅▆▇█"
BINS = 16
CORNER = 3


@dataclass(frozen=True)
class Stats:
    min: float
    max: float
    mean: float
    std: float
    absmax: float
    sum: float  # of the finite entries, accumulated in float64
    nan: int
    inf: int
    finite: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def stats(array: np.ndarray) -> Stats:
    values = np.asarray(array, dtype=np.float64).ravel()
    finite_mask = np.isfinite(values)
    finite = values[finite_mask]
    nan = int(np.isnan(values).sum())
    inf = int(values.size - finite.size - nan)
    if finite.size == 0:
        nothing = float("nan")
        return Stats(nothing, nothing, nothing, nothing, nothing, 0.0, nan, inf, 0)
    return Stats(
        min=float(finite.min()),
        max=float(finite.max()),
        mean=float(finite.mean()),
        std=float(finite.std()),
        absmax=float(np.abs(finite).max()),
        sum=float(finite.sum()),
        nan=nan,
        inf=inf,
        finite=int(finite.size),
    )


def combine(parts: list[Stats]) -> Stats:
    """The statistics of several chunks together (one chunk: its own statistics, unchanged)."""
    if len(parts) == 1:
        return parts[0]
    nan, inf = sum(p.nan for p in parts), sum(p.inf for p in parts)
    finite = [p for p in parts if p.finite]
    n = sum(p.finite for p in finite)
    if n == 0:
        nothing = float("nan")
        return Stats(nothing, nothing, nothing, nothing, nothing, 0.0, nan, inf, 0)
    total = math.fsum(p.sum for p in finite)
    mean = total / n
    m2 = math.fsum(p.finite * (p.std**2 + (p.mean - mean) ** 2) for p in finite)
    return Stats(
        min=min(p.min for p in finite), max=max(p.max for p in finite), mean=mean, std=math.sqrt(m2 / n),
        absmax=max(p.absmax for p in finite), sum=total, nan=nan, inf=inf, finite=n,
    )


def histogram(array: np.ndarray, bins: int = BINS) -> tuple[list[int], float, float]:
    """Counts of the finite values in `bins` equal bins between their min and max."""
    finite = np.asarray(array, dtype=np.float64).ravel()
    finite = finite[np.isfinite(finite)]
    if finite.size == 0:
        return [0] * bins, float("nan"), float("nan")
    lo, hi = float(finite.min()), float(finite.max())
    counts, _ = np.histogram(finite, bins=bins, range=(lo, hi) if hi > lo else (lo - 0.5, hi + 0.5))
    return counts.tolist(), lo, hi


def sparkline(counts: list[int]) -> str:
    """One character per bin, its height proportional to the count; empty bins are blank."""
    top = max(counts) if counts else 0
    if top == 0:
        return " " * len(counts)
    return "".join(" " if c == 0 else SPARK[min(len(SPARK) - 1, (c * len(SPARK) - 1) // top)] for c in counts)


def corners(array: np.ndarray, n: int = CORNER) -> tuple[list[float], list[float]]:
    """The first n values of the first row and the last n of the last row (rows = last axis)."""
    rows = np.asarray(array).reshape(-1, array.shape[-1]) if array.ndim else np.asarray(array).reshape(1, 1)
    return rows[0, :n].tolist(), rows[-1, -n:].tolist()


def number(x: float) -> str:
    """A value as the views write it: 4 significant digits; NaN and infinities by name."""
    if not math.isfinite(x):
        return str(x)
    return f"{x:.4g}"


def finite_or_none(x: float) -> float | int | None:
    """A value for JSON, which has no NaN or infinities: those become null."""
    return None if isinstance(x, float) and not math.isfinite(x) else x
