"""FP4 products (DeepSeek-V4's routed experts) shared with the helper processes (fp8_workers' FP4
bands): the same values as the dense product, bit for bit the product made here, the helpers
really used, whichever side takes the tiles."""

import numpy as np
import pytest
from helpers.claims import this_process_takes_all, this_process_takes_none
from helpers.v4_published import write_tiny_v4

from stepper.kernels import fp4_matmul, fp4_tiles, fp8_workers, int4_tiles, parallel
from stepper.kernels.linear import linear, linears
from stepper.weights.published import PublishedCheckpoint
from stepper.weights.stored import Fp4Matrix

EXPERT = "layers.1.ffn.experts.1.w{}.weight"  # w1, w3 [32, 64], w2 [64, 32]: tiles of 5 and 10 rows below


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("v4") / "tiny-v4"
    write_tiny_v4(folder)
    return PublishedCheckpoint(folder)


@pytest.fixture
def shared(monkeypatch):
    """Every FP4 product with a file behind it goes through the helpers, in tiles of 10 rows (up to
    64 tokens INT4's tiles, which FP4's take), many tokens' of 5 (tiny's products are below the size
    and one tile each)."""
    if parallel.cores() < 2:
        pytest.skip("helpers need two cores")
    monkeypatch.setattr(fp4_matmul, "SHARE_WORK", 0)
    monkeypatch.setattr(fp4_tiles, "TILE_VALUES", 5 * 64)
    monkeypatch.setattr(int4_tiles, "tile_height", lambda w, n: 10)
    monkeypatch.setattr(fp4_tiles, "FEW_TILE_VALUES", 10 * 64)
    fp8_workers.stop_helpers()
    yield
    fp8_workers.stop_helpers()


def exact_product(x: np.ndarray, w: Fp4Matrix) -> np.ndarray:
    return x.astype(np.float64) @ w.dequantize().astype(np.float64).T


@pytest.mark.parametrize("tokens", [1, 5, 11, 100])
def test_shared_product_is_the_product_made_here_bit_for_bit(checkpoint, shared, tokens):
    """A few tokens' tiles, taken from both ends by this process and the helper, are cut as this
    process tells the helper, so each row is the one this process's threads make."""
    w = checkpoint.matrix(EXPERT.format(2))
    assert isinstance(w, Fp4Matrix) and w.origin is not None and len(fp4_tiles.row_tiles(w, tokens)) > 2
    x = np.random.default_rng(tokens).standard_normal((tokens, w.shape[1])).astype(np.float32)
    y = linear(x, w)
    helper = fp8_workers.helpers()[0]
    assert not fp8_workers._broken and helper.bands_done == 1 and helper.process.poll() is None
    exact = exact_product(x, w)
    assert np.abs(y - exact).max() <= 2e-6 * np.abs(exact).max()
    here = linear(x, Fp4Matrix(w.packed, w.scales, w.name))  # no file behind it: this process's threads
    np.testing.assert_array_equal(y, here)


@pytest.mark.parametrize("tokens", [129, 300])  # rows of a few tokens' height, and tall ones
def test_many_tokens_stay_with_this_process_threads(checkpoint, shared, tokens):
    w = checkpoint.matrix(EXPERT.format(2))
    x = np.random.default_rng(3).standard_normal((tokens, w.shape[1])).astype(np.float32)
    y = linear(x, w)
    assert fp8_workers.helpers.cache_info().currsize == 0  # no helper was even started
    exact = exact_product(x, w)
    assert np.abs(y - exact).max() <= 2e-6 * np.abs(exact).max()


def test_with_two_helpers_each_takes_a_band_of_whole_tiles(checkpoint, shared, monkeypatch):
    monkeypatch.setattr(parallel, "cores", lambda: 3)  # two helpers: a band each, and one here
    w = checkpoint.matrix(EXPERT.format(2))
    x = np.random.default_rng(4).standard_normal((6, w.shape[1])).astype(np.float32)
    y = linear(x, w)
    assert not fp8_workers._broken and [h.bands_done for h in fp8_workers.helpers()] == [1, 1]
    np.testing.assert_array_equal(y, linear(x, Fp4Matrix(w.packed, w.scales, w.name)))


def test_several_weights_of_one_input_each_shared(checkpoint, shared):
    ws = [checkpoint.matrix(EXPERT.format(i)) for i in (1, 3)]
    x = np.random.default_rng(7).standard_normal((2, 3, ws[0].shape[1])).astype(np.float32)
    for y, w in zip(linears(x, ws), ws):
        exact = exact_product(x, w)
        assert y.shape == (2, 3, w.shape[0]) and np.abs(y - exact).max() <= 2e-6 * np.abs(exact).max()
    assert fp8_workers.helpers()[0].bands_done == 2


@pytest.mark.parametrize("front", [this_process_takes_none, this_process_takes_all])
def test_tiles_from_both_ends_give_every_row_whichever_side_takes_them(checkpoint, shared, monkeypatch, front):
    w = checkpoint.matrix(EXPERT.format(1))
    x = np.random.default_rng(2).standard_normal((3, w.shape[1])).astype(np.float32)
    monkeypatch.setattr(fp8_workers, "from_the_front", front)
    y = linear(x, w)
    assert not fp8_workers._broken and fp8_workers.helpers()[0].bands_done == 1
    exact = exact_product(x, w)
    assert np.abs(y - exact).max() <= 2e-6 * np.abs(exact).max()


def test_a_helper_that_fails_leaves_the_products_here(checkpoint, shared, monkeypatch):
    w = checkpoint.matrix(EXPERT.format(1))
    x = np.ones((2, w.shape[1]), np.float32)
    monkeypatch.setattr(fp8_workers, "send_fp4_band", lambda *a, **k: (_ for _ in ()).throw(OSError("gone")))
    y = linear(x, w)
    assert fp8_workers._broken
    exact = exact_product(x, w)
    assert np.abs(y - exact).max() <= 2e-6 * np.abs(exact).max()
