"""The exact statistics of float32 chunks (stepper.tensors.statistics): sums and sums of squares equal to
exact rational arithmetic, any split into chunks giving the same figures; histogram counts equal
to np.histogram's over the lattice's edges, at and beside every edge, for any split and order."""

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from stepper.tensors import statistics
from stepper.tensors.statistics import EXACT_SHIFT, FINE, Gather, Lattice

TINY = np.float32(2.0**-149)  # the smallest subnormal float32
BIG = np.finfo(np.float32).max


def wide_float32(rng: np.random.Generator, n: int) -> np.ndarray:
    """float32 values over the whole range: normal, subnormal, huge, zeros of both signs, mixed signs."""
    values = rng.standard_normal(n) * np.exp2(rng.uniform(-140, 120, n))
    values = values.astype(np.float32)
    values[:8] = [TINY, -TINY, BIG, -BIG, 0.0, -0.0, 2.0**-126, np.float32(3.0)]
    return values


def exact(values: np.ndarray) -> tuple[Fraction, Fraction]:
    finite = [Fraction(float(v)) for v in values[np.isfinite(values)]]
    return sum(finite, Fraction(0)), sum((v * v for v in finite), Fraction(0))


def gathered(values: np.ndarray, chunk: int) -> Gather:
    gather = Gather()
    for start in range(0, values.size, chunk):
        gather.add(values[start:start + chunk])
    return gather


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_float32_sums_and_squares_are_exact_over_the_whole_range(seed):
    values = wide_float32(np.random.default_rng(seed), 3000)
    gather = gathered(values, 1000)
    total, squares = gather.sums.exact()
    want_total, want_squares = exact(values)
    assert Fraction(total, 2**EXACT_SHIFT) == want_total
    assert Fraction(squares, 2**EXACT_SHIFT) == want_squares
    st = gather.stats()
    assert st.sum == float(want_total) and st.mean == float(want_total / values.size)
    assert st.min == float(values.min()) and st.max == float(values.max()) and st.absmax == float(BIG)


def test_float32_figures_equal_float64_ones_and_do_not_depend_on_the_split():
    rng = np.random.default_rng(3)
    values = np.exp(rng.standard_normal(5000) * 8 - 20).astype(np.float32)  # softmax-like: 100 bits of range
    values[::9] *= -1
    values[::13] = -np.inf
    values[5] = np.nan
    values[6] = np.inf
    whole = gathered(values, values.size).stats()
    assert whole == gathered(values.astype(np.float64), values.size).stats()  # the float64 path's exact sums
    for chunk in (1, 7, 999, 4096):
        assert gathered(values, chunk).stats() == whole
    assert (whole.nan, whole.inf, whole.finite) == (1, 385 + 1, 5000 - 1 - 386)
    want_total, want_squares = exact(values)
    n = whole.finite
    assert whole.mean == float(want_total / n)
    assert whole.std == pytest.approx(float(want_squares / n - (want_total / n) ** 2) ** 0.5, rel=1e-15)


@pytest.mark.parametrize("part", [4, 64, 4096])
def test_the_window_sums_are_exact_at_their_bounds(monkeypatch, part):
    """Parts of n values below 2**E (Float32Sums.add_part): full 24-bit significands just below
    2**E, whose sums fill the window's 53 bits; the window's lower edge 2**(unit + 23) and its
    neighbours; squares whose rest is exactly half the rounding unit (a tie); the far smaller
    values, part after part, down to the subnormals; zeros."""
    monkeypatch.setattr(statistics, "in_cache", lambda: part)
    rng = np.random.default_rng(7)
    top = np.float32(2.0**10) * np.float32(1 - 2.0**-24)  # every bit set: E = 10
    unit, window = statistics.window_of(float(top), part)
    edge = np.float32(2.0 ** (unit + 23))
    cut = 2 * unit + window  # the squares' high part: multiples of 2**cut
    ties = [np.float32(2.0**e * (1 + 2.0**-b)) for e in range(unit + 23, 10) for b in range(1, 24)
            if Fraction(2.0**e * (1 + 2.0**-b)) ** 2 % Fraction(2) ** cut == Fraction(2) ** (cut - 1)]
    assert ties  # such squares exist at this window
    pool = np.array([top, -top, edge, -edge, np.nextafter(edge, np.float32(0)), np.nextafter(edge, np.float32(np.inf)),
                     TINY, -TINY, np.float32(2.0**-126), np.float32(3e-30), 0.0, *ties], np.float32)
    full = (rng.integers(2**23, 2**24, 3 * part) * 2.0 ** (rng.integers(unit, 10 - 23, 3 * part))).astype(np.float32)
    values = np.concatenate([rng.choice(pool, 3 * part), full * rng.choice([-1, 1], 3 * part)]).astype(np.float32)
    values[0] = top  # each chunk's largest: top (chunks of 2 * part values, the first of each)
    values[2 * part::2 * part] = top
    total, squares = gathered(values, 2 * part).sums.exact()
    assert (Fraction(total, 2**EXACT_SHIFT), Fraction(squares, 2**EXACT_SHIFT)) == exact(values)


def test_gathers_merged_equal_one_gather_of_every_chunk(monkeypatch):
    """Part of a held array's chunks gathered apart and merged, and the held array gathered chunk
    by chunk (`gather_held`): the same figures, and the same histogram counts."""
    values = wide_float32(np.random.default_rng(8), 6000)
    values[17], values[18] = np.nan, -np.inf
    one, first, second = gathered(values, 1000), gathered(values[:2000], 1000), gathered(values[2000:], 1000)
    first.merge(second)
    assert first.stats() == one.stats() and exact_totals(first) == exact_totals(one) == exact(values)
    monkeypatch.setattr(statistics, "CHUNK", 256)  # 24 chunks
    held = statistics.gather_held(values.reshape(3, 2000))
    assert held.stats() == one.stats() and exact_totals(held) == exact(values)
    counts, edges = held.bins.view(16)
    np.testing.assert_array_equal(counts, np.histogram(values[np.isfinite(values)].astype(np.float64), edges)[0])
    for other in (one, first):
        np.testing.assert_array_equal(other.bins.view(16)[0], counts)
        np.testing.assert_array_equal(other.bins.view(16)[1], edges)


def exact_totals(gather: Gather) -> tuple[Fraction, Fraction]:
    total, squares = gather.sums.exact()
    return Fraction(gather.total + total, 2**EXACT_SHIFT), Fraction(gather.squares + squares, 2**EXACT_SHIFT)


def lattice_of(values: np.ndarray, sizes: list[int]) -> Lattice:
    """The values' histogram, added in pieces of these sizes in turn (each piece's finite values)."""
    lattice, start = Lattice(), 0
    for size in sizes:
        piece = values[start:start + size]
        piece = piece[np.isfinite(piece)]
        if piece.size:
            lattice.add(piece, float(piece.min()), float(piece.max()))
        start += size
    return lattice


def beside(edges: np.ndarray, dtype) -> np.ndarray:
    """Every edge in dtype and its neighbours on both sides."""
    at = edges.astype(dtype)
    return np.concatenate([at, np.nextafter(at, dtype(np.inf)), np.nextafter(at, dtype(-np.inf))])


@pytest.mark.parametrize("scale,shift", [(3.0, 0.0), (8.0, -20.0), (1e-3, 5.0), (1e-30, 0.0), (1e5, 0.0)])
def test_histogram_counts_equal_np_histograms_at_every_edge_for_any_split(scale, shift):
    """The view's counts are np.histogram's over its edges, with values at and beside every one of
    the lattice's edges; the edges are runs of 2**exponent from the lattice point at or below the
    min, the last past the max by less than a bin; any split and order gives the same."""
    rng = np.random.default_rng(4)
    values = (rng.standard_normal(20000) * scale + shift).astype(np.float32)
    if shift < 0:
        values = np.exp(values)
    lattice = lattice_of(values, [values.size])
    fine = np.ldexp(np.arange(lattice.base, lattice.base + FINE, dtype=np.float64), lattice.exponent)
    inside = beside(fine, np.float32)
    values = np.concatenate([values, inside[(inside >= values.min()) & (inside <= values.max())]])
    rng.shuffle(values)
    want = lattice_of(values, [values.size]).view(16)
    counts, edges = want
    np.testing.assert_array_equal(counts, np.histogram(values.astype(np.float64), bins=edges)[0])
    step = edges[1] - edges[0]
    assert edges[0] <= values.min() < edges[0] + 2.0**lattice.exponent and edges[-1] - step <= values.max() < edges[-1]
    assert np.all(edges == np.ldexp(np.rint(np.ldexp(edges, -lattice.exponent)), lattice.exponent))
    for sizes in ([1000] * 21, [7, 13, 20000, 100], [1] * 50):  # and the rest at once
        sizes = [*sizes, values.size]
        for order in (values, values[::-1]):
            got = lattice_of(np.concatenate([order, np.float32([np.nan, -np.inf])]), sizes).view(16)
            np.testing.assert_array_equal(got[0], counts)
            np.testing.assert_array_equal(got[1], edges)


def test_the_exponent_is_the_smallest_that_fits_the_range_in_fine_bins():
    for lo, hi in ((0.0, 1.0), (-5.0, 3.0), (1.0, 1.0 + 2.0**-20), (-1e-40, 1e-40), (1e6, 3e7)):
        lattice = lattice_of(np.array([lo, hi]), [2])
        e = lattice.exponent
        bins = [np.floor(hi / 2.0**x) - np.floor(lo / 2.0**x) for x in (e, e - 1)]  # lattice bins spanned
        assert bins[0] < FINE <= bins[1]
        assert lattice.base == np.floor(lo / 2.0**e)


def test_a_range_grown_far_merges_the_bins_exactly():
    """From values within 2**-30 to values of 2**20 (the bins merge 2**40-fold), float64 values, tiny
    negative ones in bins far wider than they (bin -1, not 0), and merges of lattices apart."""
    rng = np.random.default_rng(5)
    small = rng.uniform(-2.0**-30, 2.0**-30, 5000)
    large = rng.uniform(-2.0**20, 2.0**20, 5000)
    tiny = np.array([-5e-324, 5e-324, -1e-300, 0.0, -0.0])
    values = np.concatenate([small, tiny, large])
    counts, edges = lattice_of(values, [5000, 5, 5000]).view(16)
    np.testing.assert_array_equal(counts, np.histogram(values, bins=edges)[0])
    first, second = lattice_of(values[:5003], [5003]), lattice_of(values[5003:], [5002])
    first.merge(second)
    np.testing.assert_array_equal(first.view(16)[0], counts)
    wide = lattice_of(values, [values.size])
    assert np.searchsorted(np.ldexp(np.arange(wide.base, wide.base + FINE + 1.0), wide.exponent), -5e-324) - 1 == \
        -wide.base - 1  # the tiny negative value sits in the bin below 0


def test_equal_values_make_one_bin_around_them_until_another_comes():
    lattice = lattice_of(np.full(7, 2.5, np.float32), [3, 4])
    counts, edges = lattice.view(16)
    assert counts.tolist() == [0] * 8 + [7] + [0] * 7 and edges[0] == 2.0 and edges[-1] == 3.0
    lattice.add_repeated(0.0, 3)
    lattice.add(np.array([2.5], np.float32), 2.5, 2.5)
    counts, edges = lattice.view(4)
    np.testing.assert_array_equal(counts, np.histogram([2.5] * 8 + [0.0] * 3, bins=edges)[0])
    assert Lattice().view(4)[0].tolist() == [0] * 4 and np.isnan(Lattice().view(4)[1]).all()


def test_chunks_are_float32_where_that_is_exact_and_float64_elsewhere():
    import ml_dtypes

    for dtype, wide in ((np.float32, np.float32), (np.float16, np.float32), (ml_dtypes.bfloat16, np.float32),
                        (np.int16, np.float32), (np.int64, np.float64), (np.float64, np.float64)):
        array = np.arange(12).reshape(3, 4).astype(dtype)
        (chunk,) = statistics.chunks(array)
        assert chunk.dtype == wide and chunk.tolist() == list(range(12))


def test_chunks_summed_in_parts_sized_to_the_cache_stay_exact(monkeypatch):
    """Float32Sums.add cuts a chunk into parts of in_cache() values (from the L2); parts of 64 here,
    so a chunk of 1000 is 16 parts, the last one short, each through the kept scratch memory."""
    monkeypatch.setattr(statistics, "in_cache", lambda: 64)
    values = wide_float32(np.random.default_rng(5), 3000)
    total, squares = gathered(values, 1000).sums.exact()
    assert (Fraction(total, 2**EXACT_SHIFT), Fraction(squares, 2**EXACT_SHIFT)) == exact(values)


def test_parts_are_a_power_of_two_fitting_the_l2_and_never_fewer_than_2_15_values(monkeypatch):
    from stepper.kernels import cpu_caches

    for l2, part in ((4 << 20, 1 << 16), (2 << 20, 1 << 15), (1 << 20, 1 << 15), (48 << 10, 1 << 15),
                     (1 << 30, statistics.CHUNK)):
        statistics.in_cache.cache_clear()
        monkeypatch.setattr(cpu_caches, "l2_bytes", lambda l2=l2: l2)
        assert statistics.in_cache() == part
    statistics.in_cache.cache_clear()


LARGEST = float(np.finfo(np.float64).max)


def exact_root(value: Fraction) -> float:
    """sqrt of a non-negative rational, from an integer square root with 200 bits to spare."""
    bits = 2 * (1200 + 200)
    return float(Fraction(math.isqrt(value.numerator * 2**bits // value.denominator), 2 ** (bits // 2)))


@pytest.mark.parametrize("values", [[1e300, -2e300, 3.0], [-LARGEST, LARGEST, -LARGEST, 2.5],
                                    [2.0**600, 1e-300, -(2.0**511)], [1e200] * 5 + [-1e154]])
def test_float64_values_near_the_largest_give_exact_figures(values):
    """Squares past float64's range (values above 2**512) are summed exactly too: the figures are
    the exact ones rounded once, the sum inf only where it is past float64's range."""
    st = Gather()
    st.add(np.array(values))
    got = st.stats()
    exact_values = [Fraction(v) for v in values]
    n, total = len(values), sum(exact_values)
    # each square rounded once to float64, as if float64 had no largest value
    squares = [Fraction(float(np.float64(v) ** 2)) if abs(v) < 2.0**511 else Fraction(v) ** 2 for v in values]
    assert got.mean == float(total / n)
    assert got.std == pytest.approx(exact_root(sum(squares) / n - (total / n) ** 2), rel=4e-16)
    assert got.sum == (float(total) if abs(total) <= Fraction(LARGEST) else math.copysign(math.inf, total))
    assert (got.min, got.max, got.finite) == (min(values), max(values), n)


def test_stats_of_parts_combine_without_overflow_near_the_largest():
    from stepper.views import summary

    whole = np.array([1e300, -2e300, LARGEST, 3.0])
    parts = [summary.stats(whole[:2]), summary.stats(whole[2:])]
    combined, direct = summary.combine(parts), summary.stats(whole)
    assert combined.mean == pytest.approx(direct.mean, rel=1e-15)
    assert combined.std == pytest.approx(direct.std, rel=1e-15)
    assert math.isfinite(combined.std) and combined.finite == 4


def test_a_lattice_past_the_largest_float_shows_infinite_edges():
    lattice = lattice_of(np.array([-LARGEST, 0.0, LARGEST]), [3])
    counts, edges = lattice.view(4)
    assert counts.sum() == 3 and edges[0] == -math.inf and edges[-1] == math.inf
    assert np.all(np.diff(edges) > 0)


def test_a_kept_lattice_holds_only_the_used_bins_and_views_and_merges_as_the_whole():
    rng = np.random.default_rng(5)
    values = np.concatenate([rng.standard_normal(50_000), [40.0]]).astype(np.float32)
    whole = lattice_of(values, [values.size])
    kept = whole.kept()
    used = statistics.lattice_index(whole.hi, whole.exponent) - whole.base + 1
    assert used < FINE and kept.counts.size == used and kept.counts.dtype == np.uint32
    for bins in (1, 16, 24, 1000):
        for got, want in zip(kept.view(bins), whole.view(bins)):
            assert np.array_equal(got, want)
    wider, wider_kept = lattice_of(np.float32([-1e3, 1e3]), [2]), lattice_of(np.float32([-1e3, 1e3]), [2])
    wider.merge(whole)
    wider_kept.merge(kept)
    assert np.array_equal(wider.counts, wider_kept.counts) and wider.counts.sum() == values.size + 2


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), min_size=0, max_size=40),
       st.integers(1, 40))
@example(values=[4.265776280947135e16], chunk=1)  # its square as pow() rounds it is an ulp above v * v
def test_any_float64_values_give_the_exact_figures_for_any_split(values, chunk):
    """Over float64's whole range, NaN and inf among them, split anyhow: the sum and the squares
    are the exact ones (each square rounded once as float64 rounds it, even past its largest), and
    a histogram counts every finite value."""
    array = np.array(values, dtype=np.float64)
    got = gathered(array, chunk)
    finite = [Fraction(v) for v in values if math.isfinite(v)]
    squares = [Fraction(v * v) if abs(v) < 2.0**511 else to_53_bits(Fraction(v) ** 2)  # v * v: rounded once (a power
               for v in values if math.isfinite(v)]  # np.float64(4.265776280947135e16) ** 2 is an ulp off)
    assert exact_totals(got) == (sum(finite, Fraction(0)), sum(squares, Fraction(0)))
    stats = got.stats()
    assert stats.finite == len(finite) and stats.nan + stats.inf == len(values) - len(finite)
    assert (stats.nan, got.pos_inf) == (sum(map(math.isnan, values)), values.count(math.inf))
    assert sum(got.bins.view(16)[0]) == len(finite)


def to_53_bits(value: Fraction) -> Fraction:
    """A positive rational rounded to 53 significant bits, half to even: float64's rounding, without
    its largest value."""
    exponent = value.numerator.bit_length() - value.denominator.bit_length()
    if Fraction(2) ** exponent > value:
        exponent -= 1
    unit = Fraction(2) ** (exponent - 52)
    return round(value / unit) * unit  # round() of a Fraction: half to even
