"""A whole-model pass streams: tensors in bands of rows, lm_head one band of vocabulary at a time."""

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from helpers.configs import config_with

from stepper.fixtures.read_hashes import ReadHashes
from stepper.kernels.linear import linear, linear_in_row_blocks
from stepper.kernels.weight_cache import CachedWeights
from stepper.model import Transformer
from stepper.model.transformer import lm_head
from stepper.presets import preset
from stepper.seams.trace import Emitter
from stepper.weights.checkpoint import Checkpoint
from stepper.weights.names import EMBED, LM_HEAD
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.source import ArrayWeights

FIXTURE_WEIGHTS = Path(__file__).resolve().parents[2] / "fixtures" / "weights" / "tiny-seed0"
FP8_WEIGHT = "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"  # [144, 320]: 2 x 3 blocks, the last rows ragged
NORM = "model.layers.1.input_layernorm.weight"


def joined(blocks) -> tuple[np.ndarray, np.ndarray | None]:
    """The blocks' stored data and scales, concatenated along the rows."""
    blocks = list(blocks)
    scales = None if blocks[0].scale_inv is None else np.concatenate([b.scale_inv for b in blocks])
    return np.concatenate([b.data for b in blocks]), scales


def assert_same_stored(blocks, whole) -> None:
    data, scales = joined(blocks)
    assert data.dtype == whole.data.dtype and np.array_equal(data.view(np.uint8), whole.data.view(np.uint8))
    assert (scales is None) == (whole.scale_inv is None)
    if scales is not None:
        assert np.array_equal(scales, whole.scale_inv)


@pytest.mark.parametrize("rows", [7, 128, 999, 1000, 4096])
def test_lm_head_in_row_bands_equals_the_whole_product(rows):
    weights = SyntheticWeights(preset("tiny"), seed=2)
    hidden = np.random.default_rng(0).standard_normal((2, 3, weights.config.hidden_size), dtype=np.float32)
    whole = linear(hidden, weights.get(LM_HEAD))  # [B, T, vocab]
    chunked = lm_head(hidden, weights, rows)  # 1000 % 7 and 1000 % 128: a ragged last block
    assert chunked.shape == whole.shape
    # BLAS may sum a narrow block's dot products in another order: equal to float32 round-off
    np.testing.assert_allclose(chunked, whole, rtol=0, atol=1e-6 * np.abs(whole).max())


def test_linear_in_row_blocks_is_each_blocks_product_side_by_side_bit_for_bit():
    """kernels.linear's row blocks against the readable line: concatenating each block's product."""
    rng = np.random.default_rng(3)
    x, weight = rng.standard_normal((2, 3, 16), dtype=np.float32), rng.standard_normal((50, 16), dtype=np.float32)
    blocks = [weight[start:start + 7] for start in range(0, 50, 7)]  # 7 rows a block, the last 1
    asked = []
    lazily = (asked.append(k) or block for k, block in enumerate(blocks))
    out = linear_in_row_blocks(x, lazily, 50)
    assert asked == list(range(8))
    np.testing.assert_array_equal(out, np.concatenate([linear(x, block) for block in blocks], axis=-1))
    np.testing.assert_allclose(out, linear(x, weight), rtol=0, atol=1e-6 * np.abs(out).max())


@pytest.mark.parametrize("name, rows", [(LM_HEAD, 7), (LM_HEAD, 1000), (EMBED, 333), (FP8_WEIGHT, 128), (NORM, 100)])
def test_synthetic_row_bands_are_the_whole_tensor_bit_for_bit(name, rows):
    weights = SyntheticWeights(preset("tiny"), seed=0)
    assert_same_stored(weights.row_bands(name, rows), weights.stored(name))


def test_row_bands_never_split_an_fp8_scale_block():
    with pytest.raises(ValueError, match="multiple of 128 rows"):
        next(SyntheticWeights(preset("tiny")).row_bands(FP8_WEIGHT, 100))


@pytest.mark.parametrize("name, rows", [(LM_HEAD, 7), (FP8_WEIGHT, 128), (EMBED, 999)])
def test_checkpoint_row_bands_are_the_stored_tensor(name, rows):
    checkpoint = Checkpoint(FIXTURE_WEIGHTS)
    assert_same_stored(checkpoint.row_bands(name, rows), checkpoint.stored(name))
    cached = CachedWeights(checkpoint, 2**20)
    assert_same_stored(cached.row_bands(name, rows), checkpoint.stored(name))


def test_lm_head_reads_a_checkpoint_and_arrays_as_the_synthetic_source():
    synthetic = SyntheticWeights(preset("tiny"), seed=0)  # the weights the fixture checkpoint holds
    hidden = np.random.default_rng(1).standard_normal((1, 2, synthetic.config.hidden_size), dtype=np.float32)
    expected = lm_head(hidden, synthetic, 64)
    arrays = ArrayWeights(synthetic.config, {LM_HEAD: synthetic.get(LM_HEAD)})
    assert np.array_equal(lm_head(hidden, Checkpoint(FIXTURE_WEIGHTS), 64), expected)
    # the synthetic source's and the checkpoint's lm_head are BF16, the arrays float32 (the same values): BF16
    # products pad the tokens to whole columns of BLAS, whose sums may differ in the last bits
    np.testing.assert_allclose(lm_head(hidden, arrays, 64), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name, rows", [(LM_HEAD, 7), (FP8_WEIGHT, 128)])
def test_read_hashes_of_row_bands_are_those_of_the_whole_tensor(name, rows):
    by_bands, whole = ReadHashes(SyntheticWeights(preset("tiny"))), ReadHashes(SyntheticWeights(preset("tiny")))
    for _ in by_bands.row_bands(name, rows):
        pass
    whole.stored(name)
    assert by_bands.read == whole.read


def test_the_logits_never_hold_all_of_lm_head():
    """A vocabulary whose lm_head alone is 84 MB in float32: the whole pass stays far below that."""
    cfg = config_with(vocab_size=65536)
    weights = SyntheticWeights(cfg, seed=0)
    weights.kept_limit = 0  # the layers' seeded weights, kept once made, are not what this measures
    model = Transformer(weights)
    whole_lm_head = cfg.vocab_size * cfg.hidden_size * 4
    tracemalloc.start()
    try:
        logits = model.forward(np.array([[1, 2, 3]]), np.arange(3), Emitter())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert logits.shape == (1, 3, cfg.vocab_size)
    assert peak < whole_lm_head / 4, f"peak {peak / 2**20:.0f} MiB"
