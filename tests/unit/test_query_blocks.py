"""kernels.query_blocks: an array made a block of query rows at a time, the blocks shared out
across threads, is the array made whole, each row made once."""

import threading

import numpy as np

from stepper.kernels import parallel, query_blocks
from stepper.kernels.query_blocks import by_query_blocks
from stepper.model.ops import softmax


def test_blocks_of_rows_on_two_threads_are_the_whole_array(monkeypatch):
    monkeypatch.setattr(query_blocks, "BLOCK_VALUES", 3 * 4 * 7 * 5)  # 5 of the 37 rows a block
    monkeypatch.setattr(parallel, "cores", lambda: 2)
    x = np.random.default_rng(0).standard_normal((3, 4, 37, 7)).astype(np.float32) * 10
    asked, threads = [], set()

    def make(t: slice) -> np.ndarray:
        asked.append((t.start, t.stop))
        threads.add(threading.get_ident())
        return softmax(x[:, :, t])

    made = by_query_blocks(x.shape, make)
    assert made.dtype == np.float32 and made.shape == x.shape
    np.testing.assert_array_equal(made, softmax(x))
    assert sorted(asked) == [(s, min(s + 5, 37)) for s in range(0, 37, 5)]  # every row once, in blocks of 5
    assert len(threads) == 2


def test_a_single_row_is_one_block_made_here():
    x = np.arange(2 * 3 * 1 * 4, dtype=np.float32).reshape(2, 3, 1, 4)
    asked = []
    made = by_query_blocks(x.shape, lambda t: asked.append((t, threading.get_ident())) or x[:, :, t] * 2)
    np.testing.assert_array_equal(made, x * 2)
    assert asked == [(slice(0, 1), threading.get_ident())]  # a decode step: no thread handed work
