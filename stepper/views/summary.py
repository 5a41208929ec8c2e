"""Statistics of a tensor as the views show them: range, moments, NaN/Inf counts, a histogram and
the corner values, and how a number of them is written. Non-finite entries (NaN, and the -inf of
masked attention scores) are counted and left out of the other statistics, so one masked entry does
not turn every figure into -inf.

Every figure is gathered a chunk at a time, exactly (`Gather`): a tensor too large to hold (a
`Tiled`, made block by block) gets the same figures, and the same histogram bins, as the whole
array would."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from fractions import Fraction

import numpy as np

from stepper.tiled import Tiled

SPARK = "▁▂▃▄▅▆▇█"
BINS = 16
CORNER = 3
CHUNK = 1 << 20  # values gathered at once (8 MB of float64)
MIN_EXPONENT = -1073  # the smallest exponent np.frexp gives a float64 (subnormals included)
EXACT_SHIFT = 1 - MIN_EXPONENT  # exact sums count units of 2**-EXACT_SHIFT (the smallest subnormal's)
WINDOW = 40  # bits of each value summed at once: 2**20 values of 2**40 stay below 2**63


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


def stats(array: np.ndarray | Tiled) -> Stats:
    """The statistics of a tensor, gathered a chunk at a time (a Tiled one a block at a time)."""
    return gather(array).stats()


def gather(array: np.ndarray | Tiled) -> Gather:
    gathered = Gather()
    for chunk in chunks(array):
        gathered.add(chunk)
    return gathered


def chunks(array: np.ndarray | Tiled) -> Iterator[np.ndarray]:
    """A tensor's values in C order, CHUNK at a time, as float64 (an array's, or a Tiled's blocks)."""
    blocks = array.blocks() if isinstance(array, Tiled) else pieces(np.asarray(array))
    for block in blocks:
        flat = block.reshape(-1)  # a view, or a copy of at most CHUNK values
        for start in range(0, flat.size, CHUNK):
            yield np.asarray(flat[start:start + CHUNK], dtype=np.float64)


def pieces(array: np.ndarray) -> Iterator[np.ndarray]:
    """An array in C order as runs along its first axis of at most CHUNK values (or one
    contiguous run), so a strided view (q_nope of q) is never copied whole."""
    inner = math.prod(array.shape[1:])
    if array.ndim <= 1 or array.flags.c_contiguous or array.size <= CHUNK:
        yield array
    elif inner > CHUNK:
        for sub in array:
            yield from pieces(sub)
    else:
        step = CHUNK // inner
        for start in range(0, array.shape[0], step):
            yield array[start:start + step]


class Gather:
    """Statistics gathered chunk by chunk, exactly: the sum and the sum of squares as exact
    rationals (Python integers over 2**EXACT_SHIFT, see `exact_sum`), the mean and std rounded
    once from them, so any split of a tensor into chunks gives the same figures to the bit.
    (The squares of float32 values are exact in float64; of float64 ones, rounded once.)"""

    def __init__(self) -> None:
        self.lo, self.hi, self.absmax = math.inf, -math.inf, 0.0
        self.nan = self.inf = self.pos_inf = self.finite = 0
        self.total = self.squares = 0  # exact, in units of 2**-EXACT_SHIFT

    def add(self, values: np.ndarray) -> None:
        """values: float64 [n], at most CHUNK of them."""
        nan = int(np.isnan(values).sum())
        finite = values[np.isfinite(values)]
        self.nan += nan
        self.inf += values.size - finite.size - nan
        self.pos_inf += int(np.isposinf(values).sum())
        if finite.size:
            self.finite += finite.size
            self.lo, self.hi = min(self.lo, float(finite.min())), max(self.hi, float(finite.max()))
            self.absmax = max(self.absmax, float(np.abs(finite).max()))
            self.total += exact_sum(finite)
            self.squares += exact_sum(np.square(finite))

    def stats(self) -> Stats:
        if self.finite == 0:
            nothing = float("nan")
            return Stats(nothing, nothing, nothing, nothing, nothing, 0.0, self.nan, self.inf, 0)
        n, unit = self.finite, Fraction(1, 2**EXACT_SHIFT)
        total, squares = self.total * unit, self.squares * unit
        variance = max(Fraction(0), (squares - total * total / n) / n)
        return Stats(min=self.lo, max=self.hi, mean=float(total / n), std=math.sqrt(variance), absmax=self.absmax,
                     sum=float(total), nan=self.nan, inf=self.inf, finite=n)


def exact_sum(values: np.ndarray) -> int:
    """The exact sum of finite float64 values [n] (n <= CHUNK), as an integer in units of
    2**-EXACT_SHIFT.

    In turn from the largest magnitude down: the values are rounded to multiples of a unit
    2**WINDOW times smaller than the largest, those multiples (integers below 2**WINDOW, so their
    sum fits an int64) are summed exactly, and what the rounding left (exactly representable,
    2**WINDOW times smaller again) goes round once more, until nothing is left: a step per
    WINDOW bits of the values' range, one or two for most tensors."""
    total, rest = 0, values
    while True:
        top = max(float(rest.max()), -float(rest.min())) if rest.size else 0.0
        if top == 0.0:
            return total
        unit = max(math.frexp(top)[1] - WINDOW, MIN_EXPONENT - 1)  # top < 2**(unit + WINDOW)
        multiples = np.rint(np.ldexp(rest, -unit))  # exact integers, |m| <= 2**WINDOW
        count = int(multiples.astype(np.int64).sum())
        total += count << (unit + EXACT_SHIFT)
        rest = rest - np.ldexp(multiples, unit)  # exact: the bits below the unit
        rest = rest[rest != 0]  # most values are done after the first round


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


def histogram(array: np.ndarray | Tiled, bins: int = BINS, known: Stats | None = None) -> tuple[list[int], float, float]:
    """Counts of the finite values in `bins` equal bins between their min and max, gathered a
    chunk at a time (a second pass once `stats` knows the range; `known` saves the first)."""
    known = known or stats(array)
    if known.finite == 0:
        return [0] * bins, float("nan"), float("nan")
    lo, hi = known.min, known.max
    edges = (lo, hi) if hi > lo else (lo - 0.5, hi + 0.5)
    counts = np.zeros(bins, np.int64)
    for chunk in chunks(array):
        counts += np.histogram(chunk[np.isfinite(chunk)], bins=bins, range=edges)[0]
    return counts.tolist(), lo, hi


def sparkline(counts: list[int]) -> str:
    """One character per bin, its height proportional to the count; empty bins are blank."""
    top = max(counts) if counts else 0
    if top == 0:
        return " " * len(counts)
    return "".join(" " if c == 0 else SPARK[min(len(SPARK) - 1, (c * len(SPARK) - 1) // top)] for c in counts)


def corners(array: np.ndarray | Tiled, n: int = CORNER) -> tuple[list[float], list[float]]:
    """The first n values of the first row and the last n of the last row (rows = last axis)."""
    if array.ndim == 0:
        return [float(np.asarray(array))], [float(np.asarray(array))]
    first, last = array[(0,) * (array.ndim - 1)], array[(-1,) * (array.ndim - 1)]
    return np.asarray(first)[:n].tolist(), np.asarray(last)[-n:].tolist()


def number(x: float) -> str:
    """A value as the views write it: 4 significant digits; NaN and infinities by name."""
    if not math.isfinite(x):
        return str(x)
    return f"{x:.4g}"


def finite_or_none(x: float) -> float | int | None:
    """A value for JSON, which has no NaN or infinities: those become null."""
    return None if isinstance(x, float) and not math.isfinite(x) else x
