"""Statistics of a tensor, gathered a chunk at a time and exactly, so that any split of a tensor
into chunks (a `Tiled`'s tiles, a chunked prefill's chunks) gives the figures, and the histogram
bins, of the whole array: range, moments, NaN/Inf counts (non-finite entries are counted and left
out of the other figures), histogram counts (`Lattice`: in the same pass, the range not needed
first; an integer tensor's in bins of whole integers, `IntegerLattice`), corners. views.summary
shows them."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from fractions import Fraction
from functools import cache

import numpy as np

from stepper.kernels import cpu_caches

BINS = 16  # the bins of a sparkline's histogram
FINE = 4096  # the finest bins a histogram keeps (`Lattice`): at most 32 KB of counts while gathering, 8-16 KB kept
CORNER = 3  # values of each corner
CHUNK = 1 << 17  # values gathered at once (1 MB of float64: the passes over a chunk stay in cache)
MIN_EXPONENT = -1073  # the smallest exponent np.frexp gives a float64 (subnormals included)
EXACT_SHIFT = 1 - MIN_EXPONENT  # exact sums count units of 2**-EXACT_SHIFT (the smallest subnormal's)
WINDOW = 40  # bits of each value summed at once: 2**20 values of 2**40 stay below 2**63
FLOAT32_BITS = 24  # significant bits of a float32: one of magnitude at least 2**(unit + 23) is a multiple of 2**unit


@dataclass(frozen=True)
class Stats:
    min: float
    max: float
    mean: float
    std: float
    absmax: float
    sum: float  # of the finite entries, accumulated in float64; nan when there are none, as the mean
    nan: int
    inf: int
    finite: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def no_finite(nan: int, inf: int) -> Stats:
    """The statistics of values none of which is finite: every figure nan (a sum of nothing shown
    as 0 beside a nan mean would read as values that cancel out), the counts."""
    nothing = float("nan")
    return Stats(nothing, nothing, nothing, nothing, nothing, nothing, nan, inf, 0)


def chunks(array) -> Iterator[np.ndarray]:
    """A tensor's values CHUNK at a time, as float32 where that is exact (float32, BF16, FP8, small
    integers), else as float64: an array's in C order, or the tiles of a tensor made tile by
    tile (a Tiled's in C order, a chunked prefill's chunk by chunk)."""
    blocks = array.tiles() if hasattr(array, "tiles") else pieces(np.asarray(array))
    for block in blocks:
        flat = block.reshape(-1)  # a view, or a copy of at most CHUNK values
        wide = exact_dtype(flat.dtype)
        for start in range(0, flat.size, CHUNK):
            yield np.asarray(flat[start:start + CHUNK], dtype=wide)


def exact_dtype(dtype) -> np.dtype:
    """The dtype `chunks` gives a tensor's values in: float32 where that is exact, else float64."""
    return np.dtype(np.float32 if np.can_cast(dtype, np.float32, "safe") else np.float64)


def integral(dtype) -> bool:
    """Whether a dtype holds integers (booleans too): its histogram's bins are whole integers."""
    return np.dtype(dtype).kind in "iub"


def gather_held(array) -> Gather:
    """The figures of a held array, its chunks gathered in C order on this thread. (Threads
    sharing the chunks ran slower than one: each pass is a short NumPy call that hands the GIL
    over, and 32 M float32 values took 0.29-0.30 s on two threads' Gathers merged, 0.24 s on one.)"""
    gather = Gather(integral(array.dtype))
    for block in chunks(array):
        gather.add(block)
    return gather


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
    rationals (Python integers over 2**EXACT_SHIFT), the mean and std rounded once from them, so
    any split of a tensor into chunks gives the same figures to the bit. (The squares of float32
    values are exact in float64; of float64 ones, rounded once.) `integers`: the values are an
    integer tensor's, binned in whole integers (`IntegerLattice`)."""

    def __init__(self, integers: bool = False) -> None:
        self.lo, self.hi, self.absmax = math.inf, -math.inf, 0.0
        self.nan = self.inf = self.pos_inf = self.finite = 0
        self.total = self.squares = 0  # exact, in units of 2**-EXACT_SHIFT
        self.sums = Float32Sums()  # the float32 values' sums
        self.bins = IntegerLattice() if integers else Lattice()  # the histogram

    def add(self, values: np.ndarray) -> None:
        """values: float32 or float64 [n], at most CHUNK of them."""
        lo, hi = values.min(initial=np.inf), values.max(initial=-np.inf)  # NaN if any is
        if values.size and not (np.isfinite(lo) and np.isfinite(hi)):
            values = self.non_finite(values, float(lo), float(hi))
            lo, hi = values.min(initial=np.inf), values.max(initial=-np.inf)
        if values.size:
            self.finite += values.size
            self.lo, self.hi = min(self.lo, float(lo)), max(self.hi, float(hi))
            self.absmax = max(self.absmax, -float(lo), float(hi))
            if values.dtype == np.float32:
                self.sums.add(values, max(-float(lo), float(hi)))
            else:
                self.total += exact_sum(values)
                self.squares += square_sum(values)
            self.bins.add(values, float(lo), float(hi))

    def merge(self, other: Gather) -> None:
        """The figures of another's values too (as if added here: every figure is order-free)."""
        self.lo, self.hi, self.absmax = min(self.lo, other.lo), max(self.hi, other.hi), max(self.absmax, other.absmax)
        self.nan, self.inf, self.pos_inf = self.nan + other.nan, self.inf + other.inf, self.pos_inf + other.pos_inf
        self.finite += other.finite
        total, squares = other.sums.exact()
        self.total, self.squares = self.total + other.total + total, self.squares + other.squares + squares
        self.bins.merge(other.bins)

    def non_finite(self, values: np.ndarray, lo: float, hi: float) -> np.ndarray:
        """Counts the NaN and infinite values, knowing their min and max (NaN where any is NaN: a
        masked chunk of scores, -inf and finite values, needs no pass for NaN or +inf). -> the finite ones"""
        finite = np.isfinite(values)
        kept = int(np.count_nonzero(finite))
        nan = int(np.count_nonzero(np.isnan(values))) if math.isnan(lo) else 0
        self.nan += nan
        self.inf += values.size - kept - nan
        self.pos_inf += int(np.count_nonzero(values == np.inf)) if nan or hi == math.inf else 0
        return values[finite]

    def add_repeated(self, value: float, count: int) -> None:
        """`count` more entries equal to `value`, as if added one by one (the masked entries a
        chunk of a prefill leaves out: -inf scores, zero weights)."""
        if count <= 0:
            return
        if not math.isfinite(value):
            self.nan += count if math.isnan(value) else 0
            self.inf += 0 if math.isnan(value) else count
            self.pos_inf += count if value == math.inf else 0
            return
        self.finite += count
        self.lo, self.hi, self.absmax = min(self.lo, value), max(self.hi, value), max(self.absmax, abs(value))
        self.total += count * exact_sum(np.array([value]))
        self.squares += count * square_sum(np.array([value]))
        self.bins.add_repeated(value, count)

    def stats(self) -> Stats:
        if self.finite == 0:
            return no_finite(self.nan, self.inf)
        total, squares = self.sums.exact()
        n, unit = self.finite, Fraction(1, 2**EXACT_SHIFT)
        total, squares = (self.total + total) * unit, (self.squares + squares) * unit
        variance = max(Fraction(0), (squares - total * total / n) / n)
        return Stats(min=self.lo, max=self.hi, mean=float(total / n), std=square_root(variance), absmax=self.absmax,
                     sum=rounded(total), nan=self.nan, inf=self.inf, finite=n)


def rounded(value: Fraction) -> float:
    """The nearest float64; +-inf past its largest (a sum of float64 values near it)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def square_root(value: Fraction) -> float:
    """sqrt of a non-negative rational that may lie past float64's range (the variance of values
    near 1e300), whose root does not: halved in exponent by an exact power of four first."""
    half = max(0, (value.numerator.bit_length() - value.denominator.bit_length()) // 2 - 500)
    return math.ldexp(math.sqrt(value / 4**half), half)


class Float32Sums:
    """Exact sums of finite float32 values and of their squares, in units of 2**-EXACT_SHIFT.

    A part of n values below 2**E in magnitude: those of magnitude at least 2**(E - window + 23)
    (`window_of`: window = 53 - log2(n), 38 bits for parts of 2**15) are multiples of
    2**(E - window), so their float64 sum is exact in any order, one pass; their squares, exact in
    float64, span 2 * window bits, so each is cut into a part rounded to multiples of
    2**(2E - window) and the rest, two exact sums again. The far smaller ones (few, but for the
    softmax's weights, which span many binades) wait until a part's worth has come, then make a
    part of their own with their own E: at least 13 binades lower each time, down to the subnormals."""

    def __init__(self) -> None:
        self.total = self.squares = 0
        self.smaller: list[np.ndarray] = []  # far smaller values waiting for a part of their own (`later`)
        self.waiting = 0  # how many

    def add(self, values: np.ndarray, top: float | None = None) -> None:
        """values: finite float32 [n], n <= CHUNK, summed in_cache() values at a time; top: their
        largest magnitude, if known."""
        top = float(np.max(np.abs(values), initial=0.0)) if top is None else top
        if top == 0.0:  # zeros add nothing
            return
        step = in_cache()
        for start in range(0, values.size, step):
            self.add_part(values[start : start + step], top)

    def add_part(self, values: np.ndarray, top: float) -> None:
        """The values near the largest (`window_of`) are summed, and so are their squares' two
        halves, by float64 sums that are exact; the far smaller ones make a part of their own.
        Every pass writes into memory kept from one call to the next (`scratch`): fresh arrays of
        a chunk's size fault their pages in at every call, which cost ten times the arithmetic here."""
        n = values.size
        unit, window = window_of(top, n)
        wide, square, high = (scratch(use, n, np.float64) for use in ("wide", "square", "high"))
        small = scratch("small", n, np.bool_)
        np.copyto(wide, values)  # exact (and normal: no subnormal float64 arithmetic, which is slow)
        magnitude = np.abs(wide, out=square)
        np.logical_and(np.less(magnitude, 2.0 ** (unit + FLOAT32_BITS - 1), out=small), magnitude, out=small)
        where = np.flatnonzero(small)  # the values with bits below 2**unit (zeros have none)
        smaller = values.take(where) if where.size else None  # a copy: the scratch is the next part's
        wide.put(where, 0.0)
        self.total += units(float(wide.sum()))  # multiples of 2**unit below 2**(unit + 53): exact
        np.multiply(wide, wide, out=square)  # exact: multiples of 2**(2 * unit) below 2**(2 * E)
        bound = 1.5 * 2.0 ** (2 * unit + window + 52)
        np.subtract(np.add(square, bound, out=high), bound, out=high)  # rounded to multiples of 2**(2 * unit + window)
        np.subtract(square, high, out=square)  # the rest, exact: multiples of 2**(2 * unit), at most half that unit
        self.squares += units(float(high.sum())) + units(float(square.sum()))  # each below 2**53 of its unit: exact
        if smaller is not None:
            self.later(smaller)  # last: a part of them uses the same scratch

    def later(self, values: np.ndarray) -> None:
        """Far smaller values [n], kept until a part's worth has come: then a part of their own."""
        self.smaller.append(values)
        self.waiting += values.size
        if self.waiting >= in_cache():
            self.add_smaller()

    def add_smaller(self) -> None:
        while self.smaller:  # a part of small ones may leave smaller ones still
            values = np.concatenate(self.smaller)
            self.smaller, self.waiting = [], 0
            self.add(values)

    def exact(self) -> tuple[int, int]:
        """-> the sum of the values and of their squares so far, in units of 2**-EXACT_SHIFT"""
        self.add_smaller()
        return self.total, self.squares


def window_of(top: float, n: int) -> tuple[int, int]:
    """For n float32 values of magnitude at most `top`: the unit 2**unit of which the ones at
    most 2**(window - 24) times smaller than 2**E (|values| < 2**E) are multiples, and `window`,
    the bits n float64 multiples of it below 2**E leave for their sum: n * 2**E <= 2**(unit + 53),
    so their float64 sum is exact in any order. -> (unit, window), window <= 51"""
    bits = max(2, (n - 1).bit_length())  # n <= 2**bits
    window = 53 - bits
    return math.frexp(top)[1] - window, window


_kept = threading.local()
PART_BYTES = 64  # bytes per value a part may take of the L2 (Float32Sums.add_part's arrays take 25), and room
FEWEST_IN_PART = 1 << 15  # below this a part's twenty NumPy calls cost more than a smaller L2 saves


@cache
def in_cache() -> int:
    """Values Float32Sums.add_part takes at once: a power of two whose arrays fit the L2 the machine
    reports (cpu_caches), 2^15 to CHUNK. (On a Zen 3's 512 KiB L2 parts of 2^13 fit, and took 5.7 ns a
    value against 4.7 in parts of 2^15; on a 2 MiB L2 parts of 2^15 took 15% less than of 2^17.)"""
    fit = cpu_caches.l2_bytes() // PART_BYTES
    return max(FEWEST_IN_PART, min(CHUNK, 1 << (fit.bit_length() - 1)))


def scratch(use: str, n: int, dtype) -> np.ndarray:
    """This thread's memory for one use, at least CHUNK values of dtype, kept from call to call.  -> [n]"""
    kept = getattr(_kept, use, None)
    if kept is None or kept.size < n:
        kept = np.empty(max(n, CHUNK), dtype)
        setattr(_kept, use, kept)
    return kept[:n]


def units(value: float) -> int:
    """A finite float64 as an exact integer count of 2**-EXACT_SHIFT."""
    numerator, denominator = value.as_integer_ratio()  # the denominator a power of two, at most 2**1074
    return numerator << (EXACT_SHIFT - denominator.bit_length() + 1)


SQUARE_SAFE = 2.0**511  # a float64 of smaller magnitude has a finite square
SQUARE_SHIFT = 600  # larger ones are squared times 2**-1200 (exact, and neither overflows nor underflows)


def square_sum(values: np.ndarray) -> int:
    """The exact sum of finite float64 values' squares [n], each square rounded once as float64
    rounds it where it does not overflow (past 2**1024 too: a large value is squared times an exact
    power of two), in units of 2**-EXACT_SHIFT."""
    large = np.abs(values) >= SQUARE_SAFE
    if not large.any():
        return exact_sum(np.square(values))
    scaled = np.ldexp(values[large], -SQUARE_SHIFT)
    return exact_sum(np.square(values[~large])) + (exact_sum(np.square(scaled)) << 2 * SQUARE_SHIFT)


def exact_sum(values: np.ndarray) -> int:
    """The exact sum of finite float64 values [n] (n <= CHUNK), as an integer in units of
    2**-EXACT_SHIFT.

    In turn from the largest magnitude down: the values are cut toward zero to multiples of a
    unit 2**WINDOW times smaller than the largest (so none grows past float64's largest), those
    multiples (integers below 2**WINDOW, so their sum fits an int64) are summed exactly, and what
    the cut left (exactly representable, 2**WINDOW times smaller again) goes round once more,
    until nothing is left: a step per WINDOW bits of the values' range, one or two for most
    tensors."""
    total, rest = 0, values
    while True:
        top = max(float(rest.max()), -float(rest.min())) if rest.size else 0.0
        if top == 0.0:
            return total
        unit = max(math.frexp(top)[1] - WINDOW, MIN_EXPONENT - 1)  # top < 2**(unit + WINDOW)
        multiples = np.trunc(np.ldexp(rest, -unit))  # exact integers, |m| < 2**WINDOW, |m * 2**unit| <= |value|
        count = int(multiples.astype(np.int64).sum())
        total += count << (unit + EXACT_SHIFT)
        rest = rest - np.ldexp(multiples, unit)  # exact: the bits below the unit
        rest = rest[rest != 0]  # most values are done after the first round


class Lattice:
    """Exact histogram counts of finite values, gathered in any order and split: the values' bins of
    width 2**exponent on the lattice of its multiples, where the exponent is the smallest that fits
    the values' range [lo, hi] in FINE bins. It grows with the range, and the bins merge in pairs
    exactly when it does, so the counts never wait for the final range (a chunked prefill's
    scores, whose range grows to the last chunk, are binned in the pass that makes them) and are
    the same for every split of the values. `view(bins)` puts runs of them together."""

    def __init__(self) -> None:
        self.lo, self.hi = math.inf, -math.inf  # the range of the values so far
        self.exponent: int | None = None  # None while every value so far is lo (or there is none)
        self.base = 0  # the lattice index of the first bin: floor(lo / 2**exponent)
        self.counts = np.zeros(0, np.int64)  # [FINE] once there is an exponent
        self.equal = 0  # the values counted while there is none, each equal to lo

    def add(self, values: np.ndarray, lo: float, hi: float) -> None:
        """values: finite float32 or float64 [n], lo and hi their min and max."""
        if not values.size:
            return
        self.widen(lo, hi)
        if self.exponent is None:
            self.equal += values.size
        else:
            self.counts += fine_counts(values, self.exponent, self.base)

    def add_repeated(self, value: float, count: int) -> None:
        """`count` more values equal to the finite `value`."""
        self.widen(value, value)
        if self.exponent is None:
            self.equal += count
        else:
            self.counts[lattice_index(value, self.exponent) - self.base] += count

    def merge(self, other: Lattice) -> None:
        """The counts of another's values too."""
        if other.lo > other.hi:  # no values
            return
        self.widen(other.lo, other.hi)
        if other.exponent is None:
            self.add_repeated(other.lo, other.equal)
        else:
            self.counts += other.rebased(self.exponent, self.base)

    def widen(self, lo: float, hi: float) -> None:
        """The range grown to take [lo, hi]: a larger exponent merges the bins, a lower min shifts them."""
        lo, hi = min(self.lo, lo), max(self.hi, hi)
        if (lo, hi) == (self.lo, self.hi):
            return
        if lo < hi:
            exponent = self.finest(lo, hi)
            base = lattice_index(lo, exponent)
            if (exponent, base) != (self.exponent, self.base):
                self.counts, self.equal = self.rebased(exponent, base), 0
            self.exponent, self.base = exponent, base
        self.lo, self.hi = lo, hi

    def finest(self, lo: float, hi: float) -> int:
        """The exponent of the bins for the range [lo, hi] (lo < hi)."""
        return finest(lo, hi)

    def rebased(self, exponent: int, base: int) -> np.ndarray:
        """The counts so far in the bins of a lattice as fine or coarser, from `base`. -> int64 [FINE]"""
        counts = np.zeros(FINE, np.int64)
        if self.exponent is None:
            if self.equal:
                counts[lattice_index(self.lo, exponent) - base] = self.equal
            return counts
        shift = exponent - self.exponent  # each new bin takes 2**shift of the old
        held = np.flatnonzero(self.counts)
        if shift <= 32:  # base + i = q * 2**shift + r: it goes to q + (r + i) // 2**shift
            q, r = divmod(self.base, 1 << shift)
            np.add.at(counts, (q - base) + ((held + r) >> shift), self.counts[held])
        else:  # the range grew more than 2**32-fold: the old bins go to one or two new ones
            for i in held.tolist():
                counts[((self.base + i) >> shift) - base] += self.counts[i]
        return counts

    def used(self) -> int:
        """How many bins, from the first, reach the max (there is an exponent)."""
        return lattice_index(self.hi, self.exponent) - self.base + 1

    def kept(self) -> Lattice:
        """A copy holding only the bins up to the max, as uint32 where the counts fit: what a finished
        tensor's figures keep (a chunked run keeps thousands). `view` reads it, and `merge` takes it
        as the other; nothing adds to it."""
        copy = type(self)()
        copy.lo, copy.hi, copy.exponent, copy.base, copy.equal = self.lo, self.hi, self.exponent, self.base, self.equal
        if self.exponent is not None:
            used = self.counts[: self.used()]
            copy.counts = used.astype(np.uint32) if used.max(initial=0) <= np.iinfo(np.uint32).max else used.copy()
        return copy

    def view(self, bins: int) -> tuple[np.ndarray, np.ndarray]:
        """`bins` equal bins, each a run of the lattice's, from the lattice point at or below the
        min; the last ends past the max by less than one of them (values equal to lo: one bin
        around it, width 1/bins). -> (counts int64 [bins], edges float64 [bins + 1])"""
        counts = np.zeros(bins, np.int64)
        if self.lo > self.hi:
            return counts, np.full(bins + 1, np.nan)
        if self.exponent is None:
            counts[bins // 2] = self.equal
            return counts, np.linspace(self.lo - 0.5, self.hi + 0.5, bins + 1)
        used = self.used()
        run = -(-used // bins)
        fine = np.zeros(bins * run, np.int64)
        fine[:used] = self.counts[:used]
        edges = [ldexp_or_inf(float(self.base + i * run), self.exponent) for i in range(bins + 1)]  # past 1.8e308: inf
        return fine.reshape(bins, run).sum(axis=1), np.array(edges)


class IntegerLattice(Lattice):
    """A Lattice of an integer tensor's values: its bins at least one integer wide (exponent >= 0),
    so each holds whole integers; the exponent still follows the range alone, so the counts are
    the same for every split. `view` gives a bin per value where the range fits, else equal runs
    of whole integers, no bin wholly past the max."""

    def finest(self, lo: float, hi: float) -> int:
        return max(0, finest(lo, hi))

    def view(self, bins: int) -> tuple[np.ndarray, np.ndarray]:
        """At most `bins` bins of equal runs of whole integers (one each where the range has at
        most `bins` values), from the min (or the multiple of the lattice's width at or below
        it); the last is the first that holds the max. -> (counts int64 [n], edges int64 [n + 1]:
        bin i holds the integers from edges[i] to edges[i + 1] - 1)"""
        if self.lo > self.hi:
            return super().view(bins)
        if self.exponent is None:  # every value is lo
            return np.array([self.equal], np.int64), np.array([self.lo, self.lo + 1], np.int64)
        used = self.used()
        run = -(-used // bins)
        n = -(-used // run)
        fine = np.zeros(n * run, np.int64)
        fine[:used] = self.counts[:used]
        edges = (np.arange(n + 1, dtype=np.int64) * run + self.base) << self.exponent
        return fine.reshape(n, run).sum(axis=1), edges


def ldexp_or_inf(x: float, e: int) -> float:
    """x * 2**e, +-inf past float64's largest."""
    try:
        return math.ldexp(x, e)
    except OverflowError:
        return math.copysign(math.inf, x)


def lattice_index(x: float, exponent: int) -> int:
    """floor(x / 2**exponent), exactly, for a finite x."""
    numerator, denominator = x.as_integer_ratio()  # the denominator a power of two
    if exponent < 0:
        return (numerator << -exponent) // denominator
    return numerator // (denominator << exponent)


def finest(lo: float, hi: float) -> int:
    """The smallest exponent whose lattice holds [lo, hi] (lo < hi) in at most FINE bins."""
    def fits(exponent: int) -> bool:
        return lattice_index(hi, exponent) - lattice_index(lo, exponent) < FINE

    width = hi - lo if math.isfinite(hi - lo) else 2 * (hi / 2 - lo / 2)
    exponent = math.frexp(width)[1] - FINE.bit_length() + 1  # width < 2**(exponent + 12): fits, or nearly
    while not fits(exponent):
        exponent += 1
    while fits(exponent - 1):
        exponent -= 1
    return exponent


FLOAT32_EXACT = 1 << 23  # lattice indices below this are exact in float32, and so is their difference


def fine_counts(values: np.ndarray, exponent: int, base: int) -> np.ndarray:
    """How many of the finite values [n] fall in each of the FINE bins of width 2**exponent from
    base * 2**exponent (every value does). -> int64 [FINE]"""
    if values.dtype == np.float32 and -126 <= exponent <= 0 and abs(base) + FINE < FLOAT32_EXACT:
        scaled = scratch("scaled", values.size, np.float32)  # values * 2**-exponent: exact, below 2**23
        np.floor(np.multiply(values, np.float32(2.0**-exponent), out=scaled), out=scaled)
        index = scratch("lattice32", values.size, np.int32)  # float32 to int32 is 5x faster than to int64 here
        np.copyto(index, np.subtract(scaled, np.float32(base), out=scaled), casting="unsafe")
    else:
        index = scratch("lattice", values.size, np.intp)
        scaled = np.floor(np.ldexp(values.astype(np.float64, copy=False), -exponent))  # exact but for underflow
        if exponent > 0:  # a tiny negative value scaled to -0.0: its bin is -1
            scaled[(scaled == 0) & (values < 0)] = -1
        np.copyto(index, scaled - float(base), casting="unsafe")  # exact: a difference below FINE
    counts = np.bincount(index, minlength=FINE)
    if counts.size != FINE:
        raise ValueError(f"a value past the histogram's bins: {counts.size} > {FINE}")
    return counts


def corners(array, n: int = CORNER) -> tuple[list[float], list[float]]:
    """The first n values of the first row and the last n of the last row (rows = last axis)."""
    if array.ndim == 0:
        return [float(np.asarray(array))], [float(np.asarray(array))]
    if array.size == 0:  # V4's compressor before its first window closes: no entries yet
        return [], []
    first, last = array[(0,) * (array.ndim - 1)], array[(-1,) * (array.ndim - 1)]
    return np.asarray(first)[:n].tolist(), np.asarray(last)[-n:].tolist()
