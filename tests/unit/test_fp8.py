"""FP8 e4m3fn decoding and 128x128 block (de)quantization, against ml_dtypes and values derived by hand."""

import math
import tracemalloc

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepper.errors import StepperError
from stepper.fp8 import (
    BLOCK,
    E4M3_TABLE,
    FP8_MAX,
    decode,
    decode_bits,
    decode_table,
    dequantize,
    encode,
    fields,
    quantize,
    scale_grid,
    scale_rows,
)

E4M3 = ml_dtypes.float8_e4m3fn
ALL_CODES = np.arange(256, dtype=np.uint8)
REFERENCE = ALL_CODES.view(E4M3).astype(np.float32)  # ml_dtypes' own conversion, [256]


def bits(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


# ---------------------------------------------------------------------------------------------
# All 256 codes


@pytest.mark.parametrize(
    "convert",
    [
        pytest.param(lambda c: np.array([decode_bits(int(x)) for x in c], np.float32), id="decode_bits"),
        pytest.param(lambda c: E4M3_TABLE[c], id="E4M3_TABLE"),
        pytest.param(decode, id="decode"),
        pytest.param(lambda c: decode(c.view(E4M3)), id="decode-float8"),
        pytest.param(decode_table, id="decode_table"),
        pytest.param(lambda c: decode_table(c.view(E4M3)), id="decode_table-float8"),
    ],
)
def test_all_codes_equal_ml_dtypes_bit_for_bit(convert):
    got = convert(ALL_CODES)
    assert got.dtype == np.float32 and got.shape == (256,)
    np.testing.assert_array_equal(bits(got), bits(REFERENCE))  # NaN payloads, -0 and all
    assert np.flatnonzero(np.isnan(got)).tolist() == [0x7F, 0xFF]
    assert np.signbit(got[0x80]) and got[0x80] == 0


def test_decode_2d_and_strided_input():
    codes = np.random.default_rng(1).integers(0, 256, (37, 300), dtype=np.uint8)
    for view in (codes, codes[:, ::3], codes.T, codes.view(E4M3)[5:, 7:]):
        np.testing.assert_array_equal(bits(decode(view)), bits(view.view(E4M3).astype(np.float32)))


@pytest.mark.parametrize(
    "code, value",
    [
        (0x00, 0.0),
        (0x01, 2.0**-9),  # 0 0000 001: subnormal 2^-6 * 1/8, the smallest positive value
        (0x07, 7 * 2.0**-9),  # 0 0000 111: the largest subnormal, 2^-6 * 7/8
        (0x08, 2.0**-6),  # 0 0001 000: the smallest normal, 2^(1-7) * 1
        (0x38, 1.0),  # 0 0111 000: 2^(7-7) * 1
        (0x7E, 448.0),  # 0 1111 110: 2^(15-7) * (1 + 6/8) = 256 * 1.75
        (0xFE, -448.0),
        (0xCD, -6.5),  # 1 1001 101: -2^(9-7) * (1 + 5/8) = -4 * 1.625
    ],
)
def test_values_by_hand(code, value):
    assert decode_bits(code) == value
    assert E4M3_TABLE[code] == np.float32(value)


def test_special_codes_by_hand():
    assert decode_bits(0x80) == 0 and math.copysign(1, decode_bits(0x80)) == -1  # 1 0000 000 = -0
    assert math.isnan(decode_bits(0x7F)) and math.isnan(decode_bits(0xFF))
    # no infinities, and exponent 1111 is an ordinary exponent except with mantissa 111
    assert all(math.isfinite(decode_bits(c)) for c in range(256) if c not in (0x7F, 0xFF))
    assert decode_bits(0x78) == 256.0  # 0 1111 000
    assert FP8_MAX == max(decode_bits(c) for c in range(256) if c not in (0x7F, 0xFF))


@pytest.mark.parametrize("code", [-1, 256, 1000])
def test_decode_bits_rejects_non_bytes(code):
    with pytest.raises(ValueError, match=str(code)):
        decode_bits(code)


def test_fields_of_0xCD():
    f = fields(0xCD)  # 0xCD = 1100 1101 = 1 1001 101
    assert (f.code, f.sign, f.exponent_bits, f.mantissa_bits) == (0xCD, 1, 9, 5)
    assert f.kind == "normal" and f.value == -6.5
    assert f.bits == "1 1001 101"
    assert f.formula == "(-1)^1 * 2^(9-7) * (1 + 5/8) = -6.5"


def test_fields_kinds():
    assert fields(0x00).kind == "zero" and fields(0x80).kind == "zero" and fields(0x80).sign == 1
    assert fields(0x01).kind == "subnormal" and fields(0x01).formula == "(-1)^0 * 2^(1-7) * (1/8) = 0.001953125"
    assert fields(0x08).kind == "normal"
    assert fields(0x7F).kind == "nan" and fields(0xFF).kind == "nan" and math.isnan(fields(0xFF).value)
    assert [fields(c).kind for c in range(256)].count("subnormal") == 14  # 7 mantissas x 2 signs


def test_decode_into_out_buffer():
    codes = np.random.default_rng(2).integers(0, 256, (33, 130), dtype=np.uint8)
    buf = np.full(codes.shape, 123.0, np.float32)
    result = decode(codes, out=buf)
    assert result is buf
    np.testing.assert_array_equal(bits(buf), bits(E4M3_TABLE[codes]))
    with pytest.raises(ValueError, match="out"):
        decode(codes, out=np.empty((33, 129), np.float32))
    with pytest.raises(ValueError, match="out"):
        decode(codes, out=np.empty(codes.shape, np.float64))


def test_decode_rejects_other_dtypes():
    with pytest.raises(StepperError, match="float32"):
        decode(np.zeros(4, np.float32))


def test_encode_rounds_to_nearest_even_and_saturates():
    x = np.array([1.0625, 1.1875, 2.0**-10, 3 * 2.0**-11, 460.0, 1e6, -1e6, np.float32(np.finfo(np.float32).max)],
                 np.float32)
    # 1.0625 is halfway between 1 (mantissa 000) and 1.125 (001): to the even one, 1.0; 1.1875 to 1.25 (010);
    # 2^-10 is halfway between 0 and 2^-9: to 0; 1.5 * 2^-10 to 2^-9; beyond 448 stays 448, never NaN
    expected = [1.0, 1.25, 0.0, 2.0**-9, 448.0, 448.0, -448.0, 448.0]
    np.testing.assert_array_equal(encode(x).astype(np.float32), expected)
    assert encode(x).dtype == E4M3


# ---------------------------------------------------------------------------------------------
# Block dequantization


@pytest.mark.parametrize(
    "shape, grid",
    [((576, 7168), (5, 56)), ((320, 192), (3, 2)), ((16, 40), (1, 1)), ((129, 1), (2, 1)), ((128, 256), (1, 2))],
)
def test_scale_grid(shape, grid):
    assert scale_grid(shape) == grid


def random_case(shape, scale_dtype, seed):
    """Random codes (every byte, NaN codes included) and positive scales of the right grid."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 256, shape, dtype=np.uint8)
    scales = (2.0 ** rng.uniform(-12, 2, scale_grid(shape))).astype(scale_dtype)
    return codes, scales


def expected_at(codes, scales, i, j) -> np.float32:
    """One element the slow way: the byte decoded bit by bit, times its block's scale, in float64."""
    value = decode_bits(int(codes[i, j])) * float(scales[i // 128, j // 128])
    return np.float32(value)  # e4m3 (4 significant bits) x scale (<= 24 bits) is exact in float64


def assert_same(got, expected):
    """Equal values, NaN where NaN, and the same bits (so the sign of zero) everywhere else."""
    got, expected = np.asarray(got, np.float32), np.asarray(expected, np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    finite = ~np.isnan(expected)
    np.testing.assert_array_equal(bits(got)[finite], bits(expected)[finite])


SCALE_DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16]


@pytest.mark.parametrize("scale_dtype", SCALE_DTYPES, ids=["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape", [(320, 192), (16, 40), (129, 1)])
def test_dequantize_against_python_loops(shape, scale_dtype):
    codes, scales = random_case(shape, scale_dtype, seed=shape[0] * 1000 + shape[1])
    expected = np.empty(shape, np.float32)
    for i in range(shape[0]):
        for j in range(shape[1]):
            expected[i, j] = expected_at(codes, scales, i, j)
    assert_same(dequantize(codes, scales, name="w"), expected)
    assert_same(dequantize(codes.view(E4M3), scales, name="w"), expected)


@pytest.mark.parametrize("scale_dtype", SCALE_DTYPES, ids=["float32", "bfloat16", "float16"])
def test_dequantize_kv_a_proj_shape(scale_dtype):
    """[576, 7168] with scales [5, 56]: the last row block has 64 rows (576 = 4 * 128 + 64)."""
    codes, scales = random_case((576, 7168), scale_dtype, seed=576)
    got = dequantize(codes.view(E4M3), scales, name="kv_a_proj_with_mqa.weight")
    assert got.dtype == np.float32 and got.shape == (576, 7168)

    # every element, by index arithmetic in float64 with ml_dtypes as the decoder
    row_block = np.arange(576) // 128  # [out]
    col_block = np.arange(7168) // 128  # [in]
    block_scale = scales.astype(np.float64)[row_block[:, None], col_block[None, :]]  # [out, in]
    assert_same(got, (codes.view(E4M3).astype(np.float64) * block_scale).astype(np.float32))

    # and a sample, including the corners of the partial last row block, bit by bit in Python
    rng = np.random.default_rng(7)
    points = [(0, 0), (127, 127), (128, 128), (511, 7167), (512, 0), (575, 7167), (575, 7040)]
    points += zip(rng.integers(0, 576, 2000).tolist(), rng.integers(0, 7168, 2000).tolist())
    for i, j in points:
        assert_same(got[i, j], expected_at(codes, scales, i, j))


def test_dequantize_holds_one_float32_copy():
    codes, scales = random_case((576, 7168), np.float32, seed=1)
    tracemalloc.start()
    try:
        result = dequantize(codes, scales)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * result.nbytes  # the result, plus byte-sized masks and one row of scales


@pytest.mark.parametrize(
    "codes_shape, scales_shape",
    [((576, 7168), (4, 56)), ((576, 7168), (5, 57)), ((576, 7168), (56, 5)), ((576, 7168), (5, 56, 1)),
     ((576, 7168), (280,)), ((129, 1), (1, 1)), ((16, 40), (1, 2))],
)
def test_dequantize_rejects_wrong_scale_grid(codes_shape, scales_shape):
    codes = np.zeros(codes_shape, np.uint8)
    scales = np.ones(scales_shape, np.float32)
    with pytest.raises(StepperError) as info:
        dequantize(codes, scales, name="layers.0.self_attn.kv_a_proj_with_mqa.weight")
    message = str(info.value)
    assert "layers.0.self_attn.kv_a_proj_with_mqa.weight" in message
    assert str(list(codes_shape)) in message  # the weight's shape
    assert str(list(scale_grid(codes_shape))) in message  # the grid it needs
    assert str(list(scales_shape)) in message  # the grid it got


def test_dequantize_rejects_bad_inputs():
    with pytest.raises(StepperError, match=r"w: expected a 2-D weight \[out, in\], got shape \[2, 3, 4\]"):
        dequantize(np.zeros((2, 3, 4), np.uint8), np.ones((1, 1), np.float32), name="w")
    with pytest.raises(StepperError, match="w: expected dtype float8_e4m3fn .* got float32"):
        dequantize(np.zeros((2, 3), np.float32), np.ones((1, 1), np.float32), name="w")
    with pytest.raises(StepperError, match="w: scale_inv dtype .* got int64"):
        dequantize(np.zeros((2, 3), np.uint8), np.ones((1, 1), np.int64), name="w")


# ---------------------------------------------------------------------------------------------
# Block quantization round trip


def half_ulp(x: np.ndarray) -> np.ndarray:
    """Half the spacing of the e4m3 grid at magnitude x (float64): the most round-to-nearest can move x.

    In the binade [2^e, 2^(e+1)), e = -6..8, 3 mantissa bits space the values 2^(e-3) apart; below 2^-6
    the subnormals are 2^-9 apart, the same spacing as in the lowest binade. So half a spacing is
    2^(max(floor(log2 x), -6) - 4), at most 2^-4 * x for x >= 2^-6.
    """
    e = np.floor(np.log2(np.maximum(x, 2.0**-6)))
    return 2.0 ** (e - 4)


def assert_round_trip(w: np.ndarray):
    codes, scale_inv = quantize(w)
    out_dim, in_dim = w.shape
    assert codes.dtype == E4M3 and codes.shape == w.shape
    assert scale_inv.dtype == np.float32 and scale_inv.shape == scale_grid(w.shape)
    deq = dequantize(codes, scale_inv).astype(np.float64)
    assert not np.isnan(deq).any()

    s = scale_inv.astype(np.float64)[np.arange(out_dim)[:, None] // 128, np.arange(in_dim)[None, :] // 128]
    w64 = w.astype(np.float64)
    # |w/s - code| <= half_ulp(|w/s|) by round-to-nearest; times s, plus a few float32 roundings
    # (w / s and code * s are each rounded once, relative error 2^-24)
    bound = s * half_ulp(np.abs(w64) / s) + 2.0**-22 * (np.abs(w64) + np.abs(deq))
    assert (np.abs(w64 - deq) <= bound).all()

    for r0 in range(0, out_dim, BLOCK[0]):
        for c0 in range(0, in_dim, BLOCK[1]):
            block = w[r0:r0 + 128, c0:c0 + 128]
            scale = scale_inv[r0 // 128, c0 // 128]
            amax = np.abs(block).max()
            if amax == 0:
                assert scale == 1.0 and not codes[r0:r0 + 128, c0:c0 + 128].astype(np.float32).any()
                continue
            assert scale == np.float32(amax) / np.float32(FP8_MAX)
            i, j = np.unravel_index(np.argmax(np.abs(block)), block.shape)
            code = codes[r0 + i, c0 + j].astype(np.float32)
            assert code == math.copysign(FP8_MAX, block[i, j])
            assert deq[r0 + i, c0 + j] == np.float32(code) * scale


def test_round_trip_kv_a_proj_shape():
    w = np.random.default_rng(3).standard_normal((576, 7168)).astype(np.float32) * np.float32(0.02)
    w[:128, 128:256] = 0  # an all-zero block
    assert_round_trip(w)


def test_quantize_exact_e4m3_values_survive():
    # a block whose values already are e4m3 values with amax 448 quantizes with scale 1 and no loss
    w = E4M3_TABLE[np.random.default_rng(4).integers(0, 0x7F, (200, 150))].copy()
    w[0, 0], w[0, 128], w[128, 0], w[128, 128] = 448.0, -448.0, 448.0, 448.0
    codes, scale_inv = quantize(w)
    np.testing.assert_array_equal(scale_inv, np.ones((2, 2), np.float32))
    np.testing.assert_array_equal(codes.astype(np.float32), w)


def test_quantize_rejects_bad_inputs():
    with pytest.raises(StepperError, match="NaN"):
        quantize(np.array([[1.0, np.nan]], np.float32))
    with pytest.raises(StepperError, match=r"got shape \[3\]"):
        quantize(np.zeros(3, np.float32))


@settings(max_examples=40, deadline=None)
@given(
    out_dim=st.integers(1, 300),
    in_dim=st.integers(1, 300),
    scale=st.floats(1e-4, 1e3),
    spread=st.floats(0, 8),
    zero_first_block=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_round_trip_property(out_dim, in_dim, scale, spread, zero_first_block, seed):
    rng = np.random.default_rng(seed)
    # normal values times a log-uniform factor per element, so blocks mix large and tiny magnitudes
    w = rng.standard_normal((out_dim, in_dim)) * scale * np.exp2(rng.uniform(-spread, spread, (out_dim, in_dim)))
    w = w.astype(np.float32)
    if zero_first_block:
        w[:128, :128] = 0
    assert_round_trip(w)


def test_scale_rows_are_the_blocks_a_row_range_touches():
    assert scale_rows(0, 128, 128) == slice(0, 1)
    assert scale_rows(128, 300, 128) == slice(1, 3)  # rows 128..299: blocks 1 and 2
    assert scale_rows(127, 129, 128) == slice(0, 2)
