"""INT4 products shared with the helper processes (fp8_workers' INT4 bands): the same values as
the dense product, the helpers really used, and the bands cut in whole tiles."""

import itertools
from dataclasses import replace

import numpy as np
import pytest
from helpers.claims import this_process_takes_all, this_process_takes_none

from stepper.kernels import fp8_workers, int4_matmul, parallel
from stepper.kernels.linear import linear
from stepper.presets import preset
from stepper.weights.checkpoint import Checkpoint
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.stored import Int4Matrix
from stepper.weights.synth_checkpoint import requantized, synth_checkpoint

EXPERT = "model.layers.1.mlp.experts.3.down_proj.weight"  # [320, 96]: tiles of 128, 128 and 64 rows


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    source = SyntheticWeights(requantized(preset("tiny"), "int4"), 4)
    return Checkpoint(synth_checkpoint(source, tmp_path_factory.mktemp("ckpt") / "tiny-int4"))


@pytest.fixture
def shared(monkeypatch):
    """Every INT4 product with a file behind it goes through the helpers (tiny's are below the size)."""
    if parallel.cores() < 2:
        pytest.skip("helpers need two cores")
    monkeypatch.setattr(int4_matmul, "SHARE_WORK", 0)
    fp8_workers.stop_helpers()
    yield
    fp8_workers.stop_helpers()


@pytest.mark.parametrize("tokens", [1, 5, 300])
def test_shared_product_equals_the_dense_product(checkpoint, shared, tokens):
    w = checkpoint.matrix(EXPERT)
    assert isinstance(w, Int4Matrix) and w.origin is not None
    x = np.random.default_rng(tokens).standard_normal((tokens, w.shape[1])).astype(np.float32)
    y = linear(x, w)
    helper = fp8_workers.helpers()[0]
    assert not fp8_workers._broken and helper.bands_done >= 1 and helper.process.poll() is None
    exact = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
    assert np.abs(y - exact).max() <= 2e-6 * np.abs(exact).max()


def test_a_helper_that_fails_leaves_the_products_here(checkpoint, shared, monkeypatch):
    w = checkpoint.matrix(EXPERT)
    x = np.ones((2, w.shape[1]), np.float32)
    monkeypatch.setattr(fp8_workers, "send_int4_band", lambda *a, **k: (_ for _ in ()).throw(OSError("gone")))
    y = linear(x, w)
    assert fp8_workers._broken
    np.testing.assert_allclose(y, x @ w.dequantize().T, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tokens", [1, 11, 64])
def test_a_shared_product_is_the_product_made_here_bit_for_bit(checkpoint, shared, tokens):
    """A few tokens' tiles, taken from both ends by this process and the helper as each gets to
    them, are cut as this process tells the helper (its BLAS might choose others), so no row's sum
    depends on which process made it. (Many tokens' bands are cut once per machine, in parts.)"""
    w = checkpoint.matrix(EXPERT)
    x = np.random.default_rng(tokens).standard_normal((tokens, w.shape[1])).astype(np.float32)
    here = linear(x, replace(w, origin=None))  # no file behind it: never sent to a helper
    np.testing.assert_array_equal(linear(x, w), here)
    assert fp8_workers.helpers()[0].bands_done >= 1


@pytest.mark.parametrize("height", [32, 96])
def test_bands_are_whole_tiles_covering_the_rows(height):
    w = Int4Matrix.of(np.zeros((1000, 32), np.int32), np.ones((1000, 8), np.float32), 256)
    for parts in (1, 2, 3, 40):
        bands = fp8_workers.int4_shares(w, parts, height)
        assert len(bands) == parts and bands[0].start == 0 and bands[-1].end == 1000
        assert all(a.end == b.start and a.end % height in (0, 1000 % height) for a, b in itertools.pairwise(bands))


@pytest.mark.parametrize("front", [this_process_takes_none, this_process_takes_all])
def test_tiles_from_both_ends_give_every_row_whichever_side_takes_them(checkpoint, shared, monkeypatch, front):
    w = checkpoint.matrix(EXPERT)
    x = np.random.default_rng(2).standard_normal((3, w.shape[1])).astype(np.float32)
    monkeypatch.setattr(fp8_workers, "from_the_front", front)
    y = linear(x, w)
    assert not fp8_workers._broken and fp8_workers.helpers()[0].bands_done == 1
    exact = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
    assert np.abs(y - exact).max() <= 2e-6 * np.abs(exact).max()


@pytest.mark.parametrize("held", ["file", "bf16 copy", "float32"])
@pytest.mark.parametrize("tokens", [1, 6, 300])
def test_scales_read_by_the_helper_from_the_file_or_the_scratch_give_the_products_made_here(
        checkpoint, shared, monkeypatch, tokens, held):
    w = checkpoint.matrix(EXPERT)
    assert w.scales.dtype.name == "bfloat16"  # kept as the checkpoint stores them
    shard = checkpoint.shard_of(EXPERT.replace(".weight", ".weight_scale"))
    assert fp8_workers.scales_in_file(w) == shard.data_range(EXPERT.replace(".weight", ".weight_scale"))[0]
    if held != "file":  # the same values held in memory: sent through the scratch
        w = replace(w, scales=w.scales.copy() if held == "bf16 copy" else w.scales.astype(np.float32))
        assert fp8_workers.scales_in_file(w) is None
    x = np.random.default_rng(tokens).standard_normal((tokens, w.shape[1])).astype(np.float32)
    monkeypatch.setattr(fp8_workers, "from_the_front", this_process_takes_none)  # few tokens: every tile the helper's
    y = linear(x, w)
    assert not fp8_workers._broken and fp8_workers.helpers()[0].bands_done == 1
    here = replace(w, scales=w.scales.astype(np.float32), origin=None)  # no file: this process's threads
    made_here = linear(x, here)  # equal up to the order BLAS sums in: bit for bit with some BLAS, not all
    exact = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
    for product in (y, made_here):
        assert np.abs(product - exact).max() <= 2e-6 * np.abs(exact).max()
