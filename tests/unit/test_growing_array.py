"""kernels.growing: GrowingArray.concatenate is np.concatenate bit for bit, along any axis, and
never writes positions an earlier call returned (model.cache's appends rest on both)."""

import numpy as np
import pytest

from stepper.kernels.growing import ROOM_LEAST, GrowingArray


@pytest.mark.parametrize("axis", [1, 2])
def test_concatenate_equals_np_concatenate_along_the_axis(axis):
    rng = np.random.default_rng(axis)
    grower, held = GrowingArray(axis), None
    for t in (5, 1, 1, 70, 3, 200, 1):
        shape = [2, 3, 4]
        shape[axis] = t
        new = rng.standard_normal(shape, dtype=np.float32)
        expected = new if held is None else np.concatenate([held, new], axis=axis)
        held = grower.concatenate(held, new)
        np.testing.assert_array_equal(held, expected)
        assert held.dtype == expected.dtype and held.shape == expected.shape


def test_appends_fit_in_the_room_and_earlier_views_are_never_written():
    grower = GrowingArray(1)
    first = np.arange(10, dtype=np.float32).reshape(1, 10)
    held = grower.concatenate(first, np.full((1, 1), 10.0, np.float32))  # now in an array with room
    own = grower.own
    assert own.shape[1] == 11 + ROOM_LEAST
    earlier, before = held, held.copy()
    cut = held[:, :6]  # a view of the first 6 positions, as LayerCache.first(6) holds
    held = grower.concatenate(held, np.full((1, 2), 11.0, np.float32))
    assert grower.own is own and np.shares_memory(held, own)  # no copy: written into the room
    np.testing.assert_array_equal(earlier, before)
    np.testing.assert_array_equal(held, np.concatenate([before, np.full((1, 2), 11.0, np.float32)], axis=1))
    other = GrowingArray(1)  # the cut view's own grower (a first(n) cache's) never writes into own
    grown_cut = other.concatenate(cut, np.full((1, 3), -1.0, np.float32))
    np.testing.assert_array_equal(held[:, :13], np.concatenate([before, np.full((1, 2), 11.0, np.float32)], axis=1))
    assert not np.shares_memory(grown_cut, own)


def test_an_array_not_returned_by_the_last_call_is_copied_not_written():
    grower = GrowingArray(0)
    held = grower.concatenate(np.zeros(3, np.float32), np.ones(1, np.float32))
    replaced = held.copy()  # a field set from outside
    grown = grower.concatenate(replaced, np.full(2, 5.0, np.float32))
    np.testing.assert_array_equal(grown, [0, 0, 0, 1, 5, 5])
    np.testing.assert_array_equal(held, [0, 0, 0, 1])
    assert not np.shares_memory(grown, replaced)
