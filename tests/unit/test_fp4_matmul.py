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
    reference = fp4.dequantize_fp4(w.packed, w.scales.view(ml_dtypes.float8_e8m0fnu))
    np.testing.assert_array_equal(w.dequantize(), reference)


@pytest.mark.parametrize("direct", [False, True])  # the BLAS's direct products: none, or OpenBLAS SkylakeX's
@pytest.mark.parametrize("tokens", [1, 3, 8, 11, 130, 260])
def test_tiled_product_equals_decode_then_matmul(tokens, direct, monkeypatch):
    from stepper.kernels import gemm, int4_tiles

    monkeypatch.setattr(gemm, "avx512_openblas", lambda: direct)
    monkeypatch.setattr(fp4_tiles, "TILE_VALUES", 512 * 5)  # many tokens' tiles of 5 rows: several, the last partial
    w = fp4_weight(150, 512, 1)  # a few tokens' planes [150, 64]: in direct blocks of 64 or 128 rows, the last partial
    assert (int4_tiles.block_rows(w, 11) > 0) == direct
    x = np.random.default_rng(2).standard_normal((tokens, 512)).astype(np.float32)
    expected = (x.astype(np.float64) @ w.dequantize().astype(np.float64).T)  # exact weights, float64 sums
    got = linear(x, w)
    assert got.shape == (tokens, 150) and got.dtype == np.float32
    bound = 1e-6 * (np.abs(x).astype(np.float64) @ np.abs(w.dequantize()).astype(np.float64).T)
    assert (np.abs(got - expected) <= bound).all()


@pytest.mark.parametrize("tokens", [3, 150])  # 2 x 150: many tokens, tall tiles shared between the threads
def test_several_weights_and_shared_threads(tokens, monkeypatch):
    monkeypatch.setattr(fp4_matmul, "SHARE_WORK", 1)  # every product shared out between threads
    monkeypatch.setattr(fp4_tiles, "TILE_VALUES", 128 * 8)
    w1, w3 = fp4_weight(64, 128, 3), fp4_weight(48, 128, 4)
    assert len(fp4_tiles.row_tiles(w1, 300, 2)) == 2 and len(fp4_tiles.row_tiles(w1)) == 8
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


def test_tiles_are_int4s_then_rows_then_tall_rows(monkeypatch):
    """A V4-Flash expert's w1 [2048, 4096]: up to PLANES_MOST_TOKENS the tiles are INT4's (its bytes
    lie as INT4's words), then rows as FEW_TILE_VALUES hold up to MANY_TOKENS, then as tall as
    TALL_TILE_BYTES hold or a share of the rows; decoding alone takes tile_rows(w) at a time."""
    from stepper.kernels import gemm, int4_tiles

    w = Fp4Matrix(np.zeros((2048, 2048), np.uint8), np.full((2048, 128), 127, np.uint8))
    assert (w.in_features, w.group) == (4096, 32) and fp4_tiles.PLANES_MOST_TOKENS == 64
    for direct in (False, True):
        monkeypatch.setattr(gemm, "avx512_openblas", lambda direct=direct: direct)
        for n in (1, 4, 11, 64):
            assert fp4_tiles.row_tiles(w, n) == list(int4_tiles.row_tiles(w, n))
    assert fp4_tiles.row_tiles(w, 65)[:2] == fp4_tiles.row_tiles(w, 256)[:2] == [(0, 256), (256, 512)]
    assert fp4_tiles.row_tiles(w, 257, 2) == [(0, 1024), (1024, 2048)] and fp4_tiles.row_tiles(w, 257) == [(0, 2048)]
    assert fp4_tiles.row_tiles(w)[:2] == [(0, 32), (32, 64)] and len(fp4_tiles.row_tiles(w)) == 64


def plane_values(w: Fp4Matrix) -> np.ndarray:
    """The whole weight through decode_planes, put back in the inputs' order.  -> [out, in]"""
    from stepper.kernels import int4_tiles

    out_dim, in_dim = w.shape
    places = np.empty((int4_tiles.planes(w), out_dim, in_dim // 8), np.float32)
    fp4_tiles.decode_planes(w, 0, out_dim, places)
    values = np.empty(w.shape, np.float32)
    values[:, int4_tiles.tiles_order(in_dim, w.group)] = places.transpose(1, 0, 2).reshape(out_dim, in_dim)
    return values


@pytest.mark.parametrize("normalized", [False, True])  # where this CPU multiplies subnormals slowly (Intel's)
@pytest.mark.parametrize("scale_bytes", [(0, 8), (100, 129), (120, 200), (0, 255), (250, 256)])
def test_planes_hold_the_readable_values_bit_for_bit(scale_bytes, normalized, monkeypatch):
    """Every code (both signs of zero, the subnormal 0.5) with E8M0 scales from 2^-127 (itself
    subnormal in float32) up: a scale of 2^2 (2^3 normalized) or more is not folded with 2^126
    (2^125) (that would be infinite) and takes the other branch; products past float32's range are
    infinite in both. Bytes 0x00 and 0xFF (NaN) are no float32 exponent field and come from the
    table."""
    monkeypatch.setattr(fp4_tiles, "subnormals_slow", lambda: normalized)
    rng = np.random.default_rng(scale_bytes[1])
    packed = rng.integers(0, 256, (70, 128), dtype=np.uint8)
    packed[:2] = np.arange(256, dtype=np.uint8).reshape(2, 128)  # every byte, so every code as low and as high nibble
    scales = rng.integers(*scale_bytes, (70, 8), dtype=np.uint8)
    w = Fp4Matrix.of(packed, scales)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(plane_values(w).view(np.uint32), w.dequantize().view(np.uint32))


def test_normalized_nibbles_are_their_values_times_2_to_the_minus_125_none_subnormal():
    """Each e2m1 code of both signs, as plane_part's bits hold it (the value times 2^-126, 0.5 a
    float32 subnormal), made the value times 2^-125: every value normal or zero."""
    codes = np.arange(16, dtype=np.int32)  # s e e m
    bits = ((codes & 8) << 28) | ((codes & 7) << 22)
    assert np.array_equal(bits.view(np.float32), fp4.e2m1.E2M1_TABLE[codes] * np.float32(2.0**-126))  # (0.5: subnormal)
    fp4_tiles.normalized(bits, np.empty_like(bits))
    values = bits.view(np.float32)
    assert np.array_equal(values, fp4.e2m1.E2M1_TABLE[codes] * np.float32(2.0**-125))
    assert np.array_equal(np.signbit(values), codes >= 8)  # -0 stays -0
    assert (np.abs(values[values != 0]) >= np.finfo(np.float32).tiny).all()


def test_the_subnormal_probe_compares_the_same_multiplication_of_subnormal_and_normal_values(monkeypatch):
    """Slow where subnormals took SUBNORMAL_PENALTY times the normal values' time or more; the probe
    times the same multiplication of each (2^-127, FP4's 0.5 decoded, and 2^-125)."""
    assert fp4_tiles.slow_subnormals(fp4_tiles.SUBNORMAL_PENALTY, 1.0)
    assert not fp4_tiles.slow_subnormals(0.97 * fp4_tiles.SUBNORMAL_PENALTY, 1.0)
    probe_of_clock, timed = fp4_tiles.multiply_seconds, {}
    monkeypatch.setattr(fp4_tiles, "multiply_seconds", lambda value: timed.setdefault(value, 1.0 + (value < 2.0**-126)))
    fp4_tiles.subnormals_slow.cache_clear()
    try:
        assert fp4_tiles.subnormals_slow() is False and set(timed) == {2.0**-127, 2.0**-125}  # 2x: not slow
    finally:
        fp4_tiles.subnormals_slow.cache_clear()

    class Clock:  # each multiplication "takes" the next of these seconds: the probe keeps the least
        ticks = iter([0.0, 3.0, 3.0, 4.0, 4.0, 6.0, 6.0, 6.5, 6.5, 8.5])

        @staticmethod
        def perf_counter():
            return next(Clock.ticks)

    monkeypatch.setattr(fp4_tiles, "time", Clock)
    assert fp4_tiles.PROBE_ROUNDS == 5 and probe_of_clock(2.0**-127) == 0.5


@pytest.mark.parametrize("tokens", [1, 4, 11, 17, 57, 64, 65, 129, 257])
def test_a_few_tokens_product_is_made_from_planes(tokens, monkeypatch):
    """Up to PLANES_MOST_TOKENS tokens (57 padded to 64 among them) the tiles are planes summed
    (gemm.planes_matmul, as INT4's), past them whole rows (padded to 8s up to MANY_TOKENS) in one
    GEMM each; either way the product of the exact weights, the tiles shared between the threads
    in either order."""
    from stepper.kernels import gemm, int4_tiles

    monkeypatch.setattr(int4_tiles, "block_rows", lambda w, n: 0)  # no direct blocks: the planes' tokens padded too
    made = {"planes": [], "rows": []}
    real_planes, real_matmul = gemm.planes_matmul, gemm.matmul
    monkeypatch.setattr(gemm, "planes_matmul", lambda *a: made["planes"].append(a[1].shape[2]) or real_planes(*a))
    monkeypatch.setattr(gemm, "matmul", lambda *a: made["rows"].append(a[1].shape[1]) or real_matmul(*a))
    w = fp4_weight(300, 2048, 8)
    x = np.random.default_rng(tokens).standard_normal((tokens, 2048)).astype(np.float32)
    exact = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
    product = linear(x, w)
    bound = 1e-6 * (np.abs(x).astype(np.float64) @ np.abs(w.dequantize()).astype(np.float64).T)
    assert product.shape == (tokens, 300) and (np.abs(product - exact) <= bound).all()
    columns = tokens if tokens in (1, 4, 257) else -(-tokens // 8) * 8  # padded to 8s, but one and many tokens
    planes = tokens <= fp4_tiles.PLANES_MOST_TOKENS
    expected = ({columns}, set()) if planes else (set(), {columns})
    assert (set(made["planes"]), set(made["rows"])) == expected
