"""kernels.topk.best_first against the readable line it stands for: the first k of a stable
argsort of the negated scores, ties and infinities included."""

import numpy as np
import pytest

from stepper.kernels.topk import best_first


def readable(scores: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-scores, axis=-1, kind="stable")[..., :k]


@pytest.mark.parametrize("k", [1, 3, 17, 64, 200])
def test_equals_the_stable_sort_with_ties_and_infinities(k):
    rng = np.random.default_rng(k)
    scores = rng.integers(0, 6, (2, 9, 150)).astype(np.float32)  # many ties
    scores[0, :, 100:] = -np.inf  # entries not yet visible
    scores[1, 3] = 2.0  # a row all equal
    np.testing.assert_array_equal(best_first(scores, k), readable(scores, k))
    smooth = rng.standard_normal((3, 1000)).astype(np.float32)
    np.testing.assert_array_equal(best_first(smooth, k), readable(smooth, k))


def test_a_row_with_a_nan_is_sorted_as_the_readable_line_sorts_it():
    scores = np.array([[3.0, np.nan, 5.0, 1.0, 5.0]], np.float32)
    np.testing.assert_array_equal(best_first(scores, 2), readable(scores, 2))
    np.testing.assert_array_equal(best_first(scores, 2), [[2, 4]])


def test_by_hand():
    scores = np.array([[0.5, 2.0, 2.0, -1.0, 2.0, 7.0]], np.float32)
    assert best_first(scores, 3).tolist() == [[5, 1, 2]]  # 7, then the first two of the three 2.0s
    assert best_first(scores, 3).dtype == np.int64
