"""FP4 weights inside the products: the tiled kernel (kernels.fp4_matmul) against decode-then-matmul
(Fp4Matrix.dequantize, itself checked against fp4.dequantize_fp4 and ml_dtypes), and FP8 weights
with E8M0 block scales through the existing FP8 kernels."""

import ml_dtypes
import numpy as np
import pytest

from stepper import fp4, fp8
from stepper.errors import StepperError
from stepper.kernels import fp4_matmul, fp4_tiles
from stepper.kernels.linear import float32_weight, linear, linears
from stepper.weights.stored import Fp4Matrix, Fp8Matrix


def fp4_weight(out_dim: int, in_dim: int, seed: int) -> Fp4Matrix:
    w = np.random.default_rng(seed).standard_normal((out_dim, in_dim)).astype(np.float32)
    w *= np.geomspace(1e-3, 1e3, in_dim // 32).repeat(32).astype(np.float32)  # groups of very different scales
    packed, scales = fp4.quantize_fp4(w)
    return Fp4Matrix.of(packed, scales, name="layers.3.ffn.experts.0.w1.weight")


def test_dequantize_is_the_formats_own():
    w = fp4_weight(40, 96, 0)
    reference = fp4.dequantize_fp4(w.packed, w.scales.astype(ml_dtypes.float8_e8m0fnu))
    np.testing.assert_array_equal(w.dequantize(), reference)


@pytest.mark.parametrize("direct", [0, 10**6])  # the BLAS's direct products: none, or OpenBLAS SkylakeX's
@pytest.mark.parametrize("tokens", [1, 3, 8, 11, 130])
def test_tiled_product_equals_decode_then_matmul(tokens, direct, monkeypatch):
    from stepper.kernels import gemm

    monkeypatch.setattr(gemm, "direct_limit", lambda: direct)
    monkeypatch.setattr(fp4_tiles, "TILE_VALUES", 64 * 5)  # tiles of 5 rows: several, the last partial
    monkeypatch.setattr(fp4_tiles, "FEW_TILE_VALUES", 64 * 15)  # a few tokens' packed tiles: 3 of 5 rows
    w = fp4_weight(37, 64, 1)
    x = np.random.default_rng(2).standard_normal((tokens, 64)).astype(np.float32)
    expected = (x.astype(np.float64) @ w.dequantize().astype(np.float64).T)  # exact weights, float64 sums
    got = linear(x, w)
    assert got.shape == (tokens, 37) and got.dtype == np.float32
    bound = 1e-6 * (np.abs(x).astype(np.float64) @ np.abs(w.dequantize()).astype(np.float64).T)
    assert (np.abs(got - expected) <= bound).all()


@pytest.mark.parametrize("tokens", [3, 100])  # 2 x 100: many tokens, tall tiles shared between the threads
def test_several_weights_and_shared_threads(tokens, monkeypatch):
    monkeypatch.setattr(fp4_matmul, "SHARE_WORK", 1)  # every product shared out between threads
    monkeypatch.setattr(fp4_tiles, "TILE_VALUES", 128 * 8)
    w1, w3 = fp4_weight(64, 128, 3), fp4_weight(48, 128, 4)
    assert len(fp4_tiles.row_tiles(w1, 200, 2)) == 2 and len(fp4_tiles.row_tiles(w1)) == 8
    x = np.random.default_rng(5).standard_normal((2, tokens, 128)).astype(np.float32)
    y1, y3 = linears(x, (w1, w3))
    assert y1.shape == (2, tokens, 64) and y3.shape == (2, tokens, 48)
    for y, w in ((y1, w1), (y3, w3)):  # float32 sums of exact weights, whichever BLAS (kernels.gemm) made them
        exact = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
        assert (np.abs(y - exact) <= 1e-6 * (np.abs(x).astype(np.float64) @ np.abs(w.dequantize()).T)).all()


def test_rows_decoded_for_the_cache_are_the_readable_ones_bit_for_bit(monkeypatch):
    monkeypatch.setattr(fp4_tiles, "TILE_VALUES", 96 * 7)
    w = fp4_weight(30, 96, 6)
    np.testing.assert_array_equal(float32_weight(w).view(np.uint32), w.dequantize().view(np.uint32))


def test_matrix_refuses_disagreeing_shapes():
    with pytest.raises(StepperError, match=r"w: a \[4, 64\] FP4 weight in groups of 32 needs scales of shape \[4, 2\]"):
        Fp4Matrix.of(np.zeros((4, 32), np.int8), np.zeros((4, 3), np.uint8), name="w")


def test_fp8_with_e8m0_scales_through_the_fp8_kernels():
    w = np.random.default_rng(7).standard_normal((300, 260)).astype(np.float32) * 0.05
    codes, scales = fp4.quantize_fp8_e8m0(w)
    matrix = Fp8Matrix.of(codes, scales, name="layers.0.attn.wq_a.weight")
    reference = fp8.dequantize(codes, scales)
    np.testing.assert_array_equal(matrix.dequantize(), reference)
    np.testing.assert_array_equal(float32_weight(matrix), reference)  # the FP8 row decoder, bit for bit
    for tokens in (1, 9, 200):
        x = np.random.default_rng(tokens).standard_normal((tokens, 260)).astype(np.float32)
        np.testing.assert_allclose(linear(x, matrix), x @ reference.T, rtol=1e-5, atol=1e-5 * np.abs(x).max())


def test_a_few_tokens_tiles_follow_the_blas(monkeypatch):
    """A V4-Flash expert's w1 [2048, 4096], decoded 32 rows at a time: with direct products
    (OpenBLAS's SkylakeX kernels, up to 10^6 multiply-adds) up to 7 tokens take tiles as tall as
    that allows; more, or no direct products, take tiles of 2^20 values, their tokens padded to 8s;
    one token's product, 32-row tiles that the cache holds."""
    from stepper.kernels import gemm

    w = Fp4Matrix(np.zeros((2048, 2048), np.uint8), np.ones((2048, 128), np.float32))
    monkeypatch.setattr(gemm, "direct_limit", lambda: 10**6)
    assert [fp4_tiles.tile_height(w, n) for n in (1, 4, 7, 8, 11, 200)] == [224, 32, 32, 256, 256, 2048]
    assert fp4_tiles.row_tiles(w)[0] == fp4_tiles.row_tiles(w, 1)[0] == (0, 32)  # decoding; one token in the cache
    assert len(fp4_tiles.row_tiles(w, 11)) == 8
    monkeypatch.setattr(gemm, "direct_limit", lambda: 0)
    assert [fp4_tiles.tile_height(w, n) for n in (1, 4, 11)] == [256, 256, 256]


@pytest.mark.parametrize("tokens", [4, 11, 17, 48, 49])
def test_a_few_tokens_product_in_direct_parts_is_the_product(tokens, monkeypatch):
    """Where OpenBLAS's AVX-512 kernels multiply small products directly (forced here, on any
    machine), tiles too tall for that are multiplied in direct parts (gemm.direct_parts) from 8
    to PARTS_MOST_TOKENS tokens, unpadded; fewer tokens take tiles multiplied whole and directly,
    more are padded to 8s for a packed product. The last tile (44 rows) is shorter than a part;
    the tiles are shared between the threads, in either order."""
    from stepper.kernels import gemm

    monkeypatch.setattr(gemm, "direct_limit", lambda: 10**6)
    monkeypatch.setattr(gemm, "full_size_on_avx512_openblas", lambda inputs: True)
    monkeypatch.setattr(fp4_tiles, "FEW_TILE_VALUES", 2048 * 128)  # tiles of 128 rows (2 x 64 decoded)
    parts, whole = [], []
    real_parts, real_matmul = gemm.parts_matmul, gemm.matmul
    monkeypatch.setattr(gemm, "parts_matmul", lambda a, b, out, p, scratch: parts.append((a.shape, b.shape, p))
                        or real_parts(a, b, out, p, scratch))
    monkeypatch.setattr(gemm, "matmul", lambda a, b, out: whole.append((a.shape, b.shape)) or real_matmul(a, b, out))
    w = fp4_weight(300, 2048, 8)
    x = np.random.default_rng(tokens).standard_normal((tokens, 2048)).astype(np.float32)
    exact = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
    made = linear(x, w)
    bound = 1e-6 * (np.abs(x).astype(np.float64) @ np.abs(w.dequantize()).astype(np.float64).T)
    assert made.shape == (tokens, 300) and (np.abs(made - exact) <= bound).all()
    if tokens == 4:  # [64, 2048] by 4 tokens is a direct product: tiles of 64 rows, whole
        assert parts == [] and sorted(whole) == [((44, 2048), (2048, 4))] + [((64, 2048), (2048, 4))] * 4
    elif tokens <= fp4_tiles.PARTS_MOST_TOKENS:
        p = gemm.direct_parts(2048, tokens)
        assert p == ((64 if tokens == 11 else 32 if tokens == 17 else 16), 1024)
        tiles = [((44, 2048), (2048, tokens), p)] + [((128, 2048), (2048, tokens), p)] * 2
        assert whole == [] and sorted(parts) == tiles
    else:  # 49 tokens padded to 56, each tile one packed product
        assert parts == [] and sorted(whole) == [((44, 2048), (2048, 56))] + [((128, 2048), (2048, 56))] * 2
