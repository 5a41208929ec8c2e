"""FP4 products shared with the helper processes (fp8_workers' FP4 bands): the helpers really
used, and the result that of the product made in this process alone, bit for bit, for one token,
a few and many (tall tiles, the result laid out [N, out])."""

import numpy as np
import pytest

from stepper.families.deepseek_v4_checkpoint import V4Checkpoint
from stepper.families.deepseek_v4_config import V4Config
from stepper.families.deepseek_v4_synth import synth_v4_checkpoint
from stepper.kernels import fp4_matmul, fp4_tiles, fp8_workers, parallel
from stepper.presets import V4_PRESETS
from stepper.weights.stored import Fp4Matrix

EXPERT = "model.layers.2.mlp.experts.5.down_proj.weight"  # [64, 32] in tiny-v4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    cfg = V4Config.from_hf(V4_PRESETS["tiny-v4"], "preset tiny-v4")
    return V4Checkpoint(synth_v4_checkpoint(cfg, tmp_path_factory.mktemp("ckpt") / "tiny-v4", seed=3))


@pytest.fixture
def helpers_ready():
    if parallel.cores() < 2:
        pytest.skip("helpers need two cores")
    fp8_workers.stop_helpers()
    yield
    fp8_workers.stop_helpers()


def alone(x: np.ndarray, w: Fp4Matrix, monkeypatch) -> np.ndarray:
    with monkeypatch.context() as m:
        m.setattr(fp4_matmul, "SHARE_WORK", 1 << 62)  # one thread, no helper
        return fp4_matmul.fp4_products(x, [w])[0]


@pytest.mark.parametrize("tokens", [1, 5, 300])
def test_a_shared_product_is_the_product_made_alone_bit_for_bit(checkpoint, helpers_ready, monkeypatch, tokens):
    monkeypatch.setattr(fp4_tiles, "TILE_VALUES", 32 * 7)  # tiles of 7 rows: several, the last one short
    w = checkpoint.matrix(EXPERT)
    assert isinstance(w, Fp4Matrix) and w.origin is not None and w.shape == (64, 32)
    x = np.random.default_rng(tokens).standard_normal((tokens, 32)).astype(np.float32)
    expected = alone(x, w, monkeypatch)
    monkeypatch.setattr(fp4_matmul, "SHARE_WORK", 0)
    shared = fp4_matmul.fp4_products(x, [w])[0]
    [helper] = fp8_workers.helpers()[:1]
    assert not fp8_workers._broken and helper.bands_done == 1 and helper.process.poll() is None
    np.testing.assert_array_equal(shared.view(np.uint32), expected.view(np.uint32))
    exact = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
    assert np.abs(shared - exact).max() <= 1e-5 * np.abs(exact).max()


def test_weights_in_memory_stay_with_the_threads(helpers_ready, monkeypatch):
    monkeypatch.setattr(fp4_matmul, "SHARE_WORK", 0)
    w = Fp4Matrix(np.arange(64 * 16, dtype=np.uint8).reshape(64, 16), np.ones((64, 1), np.float32))
    x = np.ones((2, 32), np.float32)
    np.testing.assert_array_equal(fp4_matmul.fp4_products(x, [w])[0], x @ w.dequantize().T)
    assert not fp8_workers.helpers.cache_info().currsize  # no helper was started


def test_a_helper_that_fails_leaves_the_products_here(checkpoint, helpers_ready, monkeypatch):
    monkeypatch.setattr(fp4_tiles, "TILE_VALUES", 32 * 8)  # two tiles or more: one is the helper's
    w = checkpoint.matrix(EXPERT)
    x = np.ones((2, 32), np.float32)
    expected = alone(x, w, monkeypatch)
    monkeypatch.setattr(fp4_matmul, "SHARE_WORK", 0)
    monkeypatch.setattr(fp8_workers, "send_fp4_band", lambda *a, **k: (_ for _ in ()).throw(OSError("gone")))
    np.testing.assert_array_equal(fp4_matmul.fp4_products(x, [w])[0], expected)
    assert fp8_workers._broken
