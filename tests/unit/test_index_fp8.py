"""DeepSeek's FP8 index scoring, piece by piece: the Walsh-Hadamard rotation against Sylvester's
matrix and hand-derived values, the e4m3 quantization with ue8m0 scales against hand-derived
codes and an independent float64 reference (ml_dtypes for the rounding), and the count of the
exactly chosen positions FP8 scoring keeps, on hand-checked cases."""

import math

import ml_dtypes
import numpy as np
import pytest

from stepper.cli.run import IndexAgreement
from stepper.model.index_fp8 import fp8_scores, hadamard, power_of_two_above, quantize
from stepper.model.indexer import kept_of_exact, mask_of
from stepper.seams.trace import Event


def sylvester(n: int) -> np.ndarray:
    """Sylvester's Hadamard matrix of order n (a power of two), float64: H_2m = [[H_m, H_m], [H_m, -H_m]]."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def test_hadamard_of_two_and_four_values_by_hand():
    np.testing.assert_allclose(hadamard(np.array([3.0, 1.0], np.float32)), [4 / math.sqrt(2), 2 / math.sqrt(2)],
                               rtol=1e-6)
    # H_4 rows (1 1 1 1), (1 -1 1 -1), (1 1 -1 -1), (1 -1 -1 1) on (1, 2, 3, 4): (10, -2, -4, 0), over sqrt(4)
    np.testing.assert_array_equal(hadamard(np.array([1, 2, 3, 4], np.float32)), [5, -1, -2, 0])


@pytest.mark.parametrize("n", [1, 8, 32, 128])
def test_hadamard_is_sylvesters_matrix_scaled_by_n_to_the_minus_half(n):
    x = np.random.default_rng(n).standard_normal((2, 3, 5, n)).astype(np.float32)
    got = hadamard(x)
    want = x.astype(np.float64) @ sylvester(n).T / math.sqrt(n)  # H is symmetric: x H^T = x H
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_hadamard_keeps_dot_products_and_is_its_own_inverse():
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 64)).astype(np.float32)
    np.testing.assert_allclose(hadamard(q) @ hadamard(k), q @ k, rtol=1e-5)
    np.testing.assert_allclose(hadamard(hadamard(q)), q, rtol=1e-5, atol=1e-6)


def test_hadamard_refuses_a_length_that_is_not_a_power_of_two():
    with pytest.raises(ValueError, match="power-of-two length, got 24"):
        hadamard(np.zeros((2, 24), np.float32))


def test_quantize_by_hand():
    # amax 3: 3 / 448 = 2^-7.22, so the scale is 2^-7 and x / scale = 128, -64, 384, 0, all e4m3 values
    codes, scale = quantize(np.array([1.0, -0.5, 3.0, 0.0], np.float32))
    assert scale == np.float32(2**-7) and codes.dtype == ml_dtypes.float8_e4m3fn
    np.testing.assert_array_equal(codes.astype(np.float32), [128, -64, 384, 0])
    # amax 1: the scale is 2^-8; 0.3 * 256 = 76.8 lies between the e4m3 values 72 and 80 (steps of 8 in [64, 128))
    codes, scale = quantize(np.array([1.0, 0.3], np.float32))
    assert scale == np.float32(2**-8)
    np.testing.assert_array_equal(codes.astype(np.float32), [256, 80])


def test_quantize_rounds_ties_to_even_and_an_exact_power_of_two_keeps_its_scale():
    # amax 14 = 448 * 2^-5: the scale is 2^-5 itself (not 2^-4), so 14 becomes 448, e4m3's largest
    # 68 / 32 and 76 / 32: x / scale = 68 (tie of 64 and 72 -> 64, mantissa 000) and 76 (72, 80 -> 80, mantissa 010)
    codes, scale = quantize(np.array([14.0, 68 / 32, 76 / 32], np.float32))
    assert scale == np.float32(2**-5)
    np.testing.assert_array_equal(codes.astype(np.float32), [448, 64, 80])


def test_an_all_zero_vector_gets_the_scale_of_the_least_amax():
    codes, scale = quantize(np.zeros((1, 16), np.float32))
    assert scale[0] == np.float32(2**-22)  # 1e-4 / 448 = 2^-22.09, up to 2^-22
    assert not codes.astype(np.float32).any()


def test_power_of_two_above_at_and_between_powers():
    x = np.array([2**-5, 2**-5 * 1.0000001, 0.75, 1.0, 3.0, 2**-130], np.float32)
    np.testing.assert_array_equal(power_of_two_above(x), np.array([2**-5, 2**-4, 1, 1, 4, 2**-130], np.float32))


def reference_quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """act_quant with scale_fmt ue8m0, one vector a block, in float64 from its definition."""
    codes, scales = np.empty(x.shape, ml_dtypes.float8_e4m3fn), np.empty(x.shape[:-1], np.float64)
    for i in np.ndindex(x.shape[:-1]):
        amax = max(float(np.abs(x[i].astype(np.float64)).max()), 1e-4)
        scales[i] = 2.0 ** math.ceil(math.log2(amax / 448))
        codes[i] = np.clip(x[i].astype(np.float64) / scales[i], -448, 448).astype(ml_dtypes.float8_e4m3fn)
    return codes, scales


@pytest.mark.parametrize("spread", [1e-3, 1.0, 1e3])
def test_quantize_equals_an_independent_reference_bit_for_bit(spread):
    x = (np.random.default_rng(7).standard_normal((3, 4, 128)) * spread).astype(np.float32)
    x[0, 0, 5] = 60 * spread  # an outlier
    codes, scale = quantize(x)
    want_codes, want_scale = reference_quantize(x)
    np.testing.assert_array_equal(scale, want_scale)
    np.testing.assert_array_equal(codes.view(np.uint8), want_codes.view(np.uint8))
    assert np.abs(codes.astype(np.float32)).max(axis=-1).min() > 224  # every vector's largest in (224, 448]


def test_fp8_scores_by_hand():
    # one head, two dims: q = (2, 1) with scale 1/4, keys (1, 1) and (-3, 1) with scales 2 and 1/2
    q = np.array([[[[2, 1]]]], np.float32)  # [B, Hi, T, Di]
    keys = np.array([[[1, 1], [-3, 1]]], np.float32)  # [B, S, Di]
    weights = np.array([[[0.5 * 0.25]]], np.float32)  # head weight 0.5 times q's scale 1/4
    scores = fp8_scores(q, keys, weights, np.array([[2.0, 0.5]], np.float32))
    # key 0: relu(2 + 1) * 0.125 * 2 = 0.75; key 1: relu(-6 + 1) = 0
    np.testing.assert_array_equal(scores, [[[0.75, 0.0]]])


def test_kept_of_exact_counts_positions_both_choose():
    exact = np.array([[[0, 2, -1], [3, 1, 0]]])  # query 0 keeps positions 0 and 2; query 1 keeps 3, 1, 0
    chosen = np.array([[[2, 1, -1], [0, 1, 3]]])  # query 0: 2 of them (1 is new); query 1: the same set
    kept = kept_of_exact(mask_of(chosen, 4), mask_of(exact, 4))
    np.testing.assert_array_equal(kept, [[1, 3]])
    assert kept.dtype == np.int64


def test_the_run_footer_adds_up_kept_and_chosen_positions():
    agreement = IndexAgreement()
    for layer, exact, kept in [(0, [[[0, -1], [1, 0]]], [[1, 1]]), (1, [[[0, -1], [0, 1]]], [[1, 2]])]:
        agreement(Event(f"layers.{layer}.self_attn.indexer.exact_topk_idx", "self_attn.indexer.exact_topk_idx",
                        np.array(exact), layer))
        agreement(Event(f"layers.{layer}.self_attn.indexer.kept_of_exact", "self_attn.indexer.kept_of_exact",
                        np.array(kept), layer))
    # chosen exactly: 1 + 2 + 1 + 2 = 6, kept 1 + 1 + 1 + 2 = 5; one query of four (layer 0's second) differs
    assert agreement.summary() == ("fp8 index scoring kept 5 of the 6 positions the exact scores keep (83.3%); "
                                   "1 of 4 queries (all layers and steps) chose differently")
