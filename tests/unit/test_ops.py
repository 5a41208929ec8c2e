"""The single ops against values derived by hand."""

import math

import numpy as np
import pytest

from stepper.config import Yarn
from stepper.model.ops import causal_mask, rms_norm, silu, softmax
from stepper.model.rope import apply_rope, rope_inv_freq, rope_tables, yarn_correction_range, yarn_mscale

KIMI_YARN = Yarn(factor=32.0, original_max_position_embeddings=4096, beta_fast=1.0, beta_slow=1.0,
                 mscale=1.0, mscale_all_dim=1.0)
DEEPSEEK_YARN = Yarn(factor=40.0, original_max_position_embeddings=4096, beta_fast=32.0, beta_slow=1.0,
                     mscale=1.0, mscale_all_dim=1.0)


def test_rms_norm_by_hand():
    # mean(3^2, 4^2) = 12.5, so x / sqrt(12.5) = [0.8485281, 1.1313708]; weights [1, 2]
    out = rms_norm(np.array([3.0, 4.0], np.float32), np.array([1.0, 2.0], np.float32), eps=1e-6)
    np.testing.assert_allclose(out, [3 / math.sqrt(12.5 + 1e-6), 8 / math.sqrt(12.5 + 1e-6)], rtol=1e-6)
    assert out.dtype == np.float32


def test_rms_norm_eps_matters_for_tiny_inputs():
    # x = 1e-4 everywhere: mean(x^2) = 1e-8, so rsqrt(1e-8 + 1e-6) = 1/sqrt(1.01e-6) -> x * 995.037
    out = rms_norm(np.full(4, 1e-4, np.float32), np.ones(4, np.float32), eps=1e-6)
    np.testing.assert_allclose(out, 1e-4 / math.sqrt(1.01e-6), rtol=1e-5)


def test_softmax_by_hand_and_masked_entries():
    out = softmax(np.array([0.0, math.log(2.0), -np.inf], np.float32))
    np.testing.assert_allclose(out, [1 / 3, 2 / 3, 0.0], rtol=1e-6)
    assert out[2] == 0.0


def test_softmax_is_shift_invariant_for_large_scores():
    out = softmax(np.array([1000.0, 1001.0], np.float32))  # exp(1000) overflows unless shifted
    np.testing.assert_allclose(out, [1 / (1 + math.e), math.e / (1 + math.e)], rtol=1e-6)


def test_silu_by_hand():
    x = np.array([0.0, 1.0, -1.0, -1000.0], np.float32)
    with np.errstate(all="raise"):
        out = silu(x)
    np.testing.assert_allclose(out[:3], [0.0, 1 / (1 + math.exp(-1)), -1 / (1 + math.exp(1))], rtol=1e-6)
    assert out[3] == 0.0


def test_causal_mask_with_cached_positions():
    # 2 new queries over 4 positions: the first new query is position 2 and sees 0..2
    np.testing.assert_array_equal(causal_mask(2, 4), [[1, 1, 1, 0], [1, 1, 1, 1]])
    np.testing.assert_array_equal(causal_mask(3, 3), np.tril(np.ones((3, 3), bool)))


def test_yarn_mscale_by_hand():
    assert yarn_mscale(32.0, 1.0) == pytest.approx(0.1 * math.log(32) + 1)  # 1.3465736
    assert yarn_mscale(32.0, 1.0) ** 2 == pytest.approx(1.8132606, rel=1e-7)
    assert yarn_mscale(1.0, 1.0) == 1.0


def test_yarn_correction_range_by_hand():
    # Kimi K2: 64 * ln(4096 / 2pi) / (2 ln 50000) = 19.16 for both betas -> floor 19, ceil 20
    assert yarn_correction_range(64, 50000.0, KIMI_YARN) == (19, 20)
    # DeepSeek-V3: beta_fast 32 -> 10.47 (floor 10); beta_slow 1 -> 22.51 (ceil 23)
    assert yarn_correction_range(64, 10000.0, DEEPSEEK_YARN) == (10, 23)


def exact_inv_freq(i: int, dim: int, theta: float) -> float:
    return theta ** (-2 * i / dim)


def test_yarn_inv_freq_kimi_k2_keeps_then_interpolates():
    inv = rope_inv_freq(64, 50000.0, KIMI_YARN)
    assert inv.dtype == np.float32 and inv.shape == (32,)
    for i in range(32):
        expected = exact_inv_freq(i, 64, 50000.0) / (1.0 if i <= 19 else 32.0)  # ramp is 0 up to low=19
        assert inv[i] == pytest.approx(expected, rel=2e-7), i
    assert inv[0] == 1.0


def test_yarn_inv_freq_deepseek_blends_linearly_between_bounds():
    inv = rope_inv_freq(64, 10000.0, DEEPSEEK_YARN)
    for i in (0, 9, 10, 16, 22, 23, 31):
        ramp = min(max((i - 10) / 13, 0.0), 1.0)
        f = exact_inv_freq(i, 64, 10000.0)
        assert inv[i] == pytest.approx(f * ramp / 40.0 + f * (1 - ramp), rel=1e-6), i


def test_rope_without_scaling_is_plain_rope():
    inv = rope_inv_freq(8, 10000.0, None)
    np.testing.assert_allclose(inv, [1.0, 0.1, 0.01, 0.001], rtol=1e-7)


def test_apply_rope_rotates_interleaved_pairs_into_reference_layout():
    # pairs (1, 0) and (0, 1), rotated by pi/2 and pi: (0, 1) and (0, -1); output [evens | odds]
    x = np.array([1.0, 0.0, 0.0, 1.0], np.float32)
    angles = np.array([math.pi / 2, math.pi])
    out = apply_rope(x[None, :], np.cos(angles)[None, :].astype(np.float32), np.sin(angles)[None, :].astype(np.float32))
    np.testing.assert_allclose(out[0], [0.0, 0.0, 1.0, -1.0], atol=1e-7)


def test_rope_scores_depend_only_on_relative_position():
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 1, 16)).astype(np.float32)
    inv = rope_inv_freq(16, 10000.0, None)

    def score(pq: int, pk: int) -> float:
        cq, sq = rope_tables(np.array([pq]), inv, 1.0)
        ck, sk = rope_tables(np.array([pk]), inv, 1.0)
        return (apply_rope(q, cq, sq) @ apply_rope(k, ck, sk).T).item()

    assert score(7, 3) == pytest.approx(score(107, 103), rel=1e-4)
    assert score(7, 3) != pytest.approx(score(7, 4), rel=1e-4)


def test_rope_tables_apply_the_mscale():
    inv = rope_inv_freq(4, 10000.0, None)
    cos, sin = rope_tables(np.array([0, 1]), inv, 1.5)
    np.testing.assert_allclose(cos[0], [1.5, 1.5])
    np.testing.assert_allclose(sin[1], [1.5 * math.sin(1.0), 1.5 * math.sin(0.01)], rtol=1e-6)
