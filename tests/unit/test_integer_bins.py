"""An integer tensor's histogram (views.summary over statistics.IntegerLattice): a bin per value
where the range has at most as many values as bins, else equal runs of whole integers; edges that
are integers; the same bins for any split of the values in any order; its figures and corners
written as integers on a tensor's row."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from stepper.tensors.statistics import Gather, chunks
from stepper.views import sinks, summary


def test_a_bin_per_value_where_the_range_fits_the_bins():
    counts, lo, hi = summary.histogram(np.array([[3, 0, 3], [7, 1, 3], [0, 3, 0]], np.int64))
    assert counts == [3, 1, 0, 4, 0, 0, 0, 1]  # the values 0, 1, ..., 7
    assert (lo, hi) == (0, 8) and type(lo) is int and type(hi) is int


def test_a_wider_range_gets_equal_runs_of_whole_integers_none_past_the_max():
    counts, edges = summary.look(np.arange(-5, 35))[1].view(16)  # 40 values: runs of 3, 14 bins
    assert edges.tolist() == list(range(-5, 38, 3))
    assert counts.tolist() == [3] * 13 + [1]


def test_one_value_is_one_bin_of_it():
    counts, edges = summary.look(np.full((2, 3), -4, np.int32))[1].view(16)
    assert counts.tolist() == [6] and edges.tolist() == [-4, -3]


def test_a_range_past_the_fine_bins_gets_runs_of_their_whole_integer_width():
    values = np.array([0, 5000, 9999, 10000, 123, 4], np.int32)  # 10,001 values: fine bins 4 wide
    counts, edges = summary.look(values)[1].view(16)
    assert edges.dtype.kind == "i" and np.all(np.diff(edges) == 628)  # runs of 157 fine bins of 4
    assert edges[0] == 0 and edges[-1] > 10000 >= edges[-2]
    assert counts.tolist() == np.histogram(values, edges)[0].tolist()


def test_booleans_are_binned_as_the_integers_0_and_1():
    counts, lo, hi = summary.histogram(np.array([True, False, True, True]))
    assert (counts, lo, hi) == ([1, 3], 0, 2)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.integers(-40, 40), st.integers(-10**6, 10**6)), min_size=1, max_size=200), st.data())
def test_any_split_in_any_order_gives_the_whole_tensors_bins(values, data):
    """Parts added in any order, some to a second gather merged in, the repeated ones (a chunked
    prefill's padding) counted without being made: the bins of the whole array, exactly."""
    whole = np.array(values, np.int64)
    cuts = sorted(data.draw(st.lists(st.integers(0, whole.size), max_size=6)))
    parts = np.split(whole, cuts)
    repeated = data.draw(st.tuples(st.integers(-50, 50), st.integers(0, 5)))
    gathered, other = Gather(integers=True), Gather(integers=True)
    for i in data.draw(st.permutations(range(len(parts)))):
        for batch in chunks(parts[i]):
            (other if i % 2 else gathered).add(batch)
    gathered.add_repeated(float(repeated[0]), repeated[1])
    gathered.merge(other)
    everything = np.concatenate([whole, np.full(repeated[1], repeated[0])])
    for bins in (16, 24):
        counts, edges = gathered.bins.kept().view(bins)
        want_counts, want_edges = summary.look(everything)[1].view(bins)
        assert edges.tolist() == want_edges.tolist() and counts.tolist() == want_counts.tolist()
        assert edges.dtype.kind == "i" and edges[0] <= everything.min() and everything.max() < edges[-1]
        assert counts.tolist() == np.histogram(everything, edges)[0].tolist()
        if everything.max() - everything.min() < bins:
            assert np.all(np.diff(edges) == 1)  # a bin per value


def test_a_row_writes_an_integer_tensors_figures_and_corners_exactly():
    """Not 1.235e+05: a chosen position of a long prompt is an exact integer; the mean and std are
    not integers and are written as any tensor's."""
    values = np.array([[123456, 7, 7, 20001], [3, 99999, 123455, 100000]], np.int64)
    stats = sinks.stats_line(values, None).plain.split()
    assert stats[:12] == ["min", "3", "max", "123456", "mean", "5.837e+04", "std", "5.435e+04",
                          "absmax", "123456", "sum", "466928"]
    assert sinks.corners_line(values, None).plain.split() == ["corners", "123456", "7", "7", "…", "99999", "123455",
                                                              "100000"]
