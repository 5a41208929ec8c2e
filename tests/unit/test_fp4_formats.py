"""FP4 e2m1 and E8M0 decoding, bit-exact against ml_dtypes over every code; the nibble order by a
hand-written case; the encoders (nearest e2m1 with ties to even, power-of-two scales) and the
FP4 / FP8-E8M0 weight round trips."""

import math

import ml_dtypes
import numpy as np
import pytest

from stepper import fp4, fp8
from stepper.errors import StepperError
from stepper.fp4 import e8m0


def same_bits(a: np.ndarray, b: np.ndarray) -> None:
    """Equal as float32 bit patterns (so -0.0 against +0.0 and NaN's sign count)."""
    np.testing.assert_array_equal(np.asarray(a, np.float32).view(np.uint32), np.asarray(b, np.float32).view(np.uint32))


def test_every_e2m1_code_decodes_as_ml_dtypes():
    codes = np.arange(16, dtype=np.uint8)
    reference = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)  # ml_dtypes keeps one code in each byte
    same_bits(fp4.E2M1_TABLE, reference)
    same_bits([fp4.decode_bits(c) for c in range(16)], reference)
    same_bits(fp4.decode(codes), reference)
    assert fp4.E2M1_TABLE[:8].tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6]  # by hand: subnormal 0, 0.5; normal 1..6


def test_every_e8m0_byte_decodes_as_ml_dtypes():
    raw = np.arange(256, dtype=np.uint8)
    reference = raw.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    same_bits(e8m0.decode(raw), reference)
    same_bits(e8m0.decode(raw.view(ml_dtypes.float8_e8m0fnu)), reference)
    normal = raw[1:255].reshape(2, 127)  # without 0x00 and 0xFF: the bytes moved into float32's exponent field
    same_bits(e8m0.decode(normal), reference[1:255].reshape(2, 127))
    same_bits(e8m0.decode(raw[:0]), reference[:0])
    assert [e8m0.value_of(b) for b in (0, 126, 127, 128, 254)] == [2.0**-127, 0.5, 1.0, 2.0, 2.0**127]
    assert math.isnan(e8m0.value_of(255))


def test_fields_write_out_a_code():
    six = fp4.fields(0b1111)
    assert (six.bits, six.kind, six.value) == ("1 11 1", "normal", -6.0)
    assert six.formula == "(-1)^1 * 2^(3-1) * (1 + 1/2) = -6.0"
    half = fp4.fields(0b0001)
    assert (half.bits, half.kind, half.value) == ("0 00 1", "subnormal", 0.5)
    assert fp4.fields(0b1000).kind == "zero" and math.copysign(1, fp4.fields(0b1000).value) == -1


def test_nibble_order_by_hand():
    # byte 0x2F: low nibble 0xF (-6) is input 0, high nibble 0x2 (+1) is input 1;
    # byte 0x97 (as I8: -105): low 0x7 (+6) is input 2, high 0x9 (-0.5) is input 3
    packed = np.array([[0x2F, 0x97]], dtype=np.uint8).view(np.int8)
    assert packed.tolist() == [[47, -105]]
    assert fp4.nibbles(0x2F) == (0xF, 0x2)
    assert fp4.unpack(packed).tolist() == [[0xF, 0x2, 0x7, 0x9]]
    assert fp4.PAIRS[0x97].tolist() == [6.0, -0.5]
    assert fp4.pack(np.array([[0xF, 0x2, 0x7, 0x9]])).view(np.uint8).tolist() == [[0x2F, 0x97]]
    # a whole group of 32 inputs with scale byte 128 (x2): the four values above doubled, then zeros
    row = np.zeros((1, 16), np.uint8)
    row[0, :2] = [0x2F, 0x97]
    weight = fp4.dequantize_fp4(row.view(np.int8), np.array([[128]], np.uint8).view(ml_dtypes.float8_e8m0fnu))
    assert weight[0, :4].tolist() == [-12.0, 2.0, 12.0, -1.0] and not weight[0, 4:].any()


def test_dequantize_every_code_with_every_scale_against_ml_dtypes():
    codes = np.tile(np.arange(16, dtype=np.uint8), (255, 2))  # [255, 32]: each row every code twice
    scales = np.arange(255, dtype=np.uint8)[:, None]  # [255, 1]: every scale but NaN's
    with np.errstate(over="ignore"):  # the largest scales times 6 are past float32 (inf both ways)
        weight = fp4.dequantize_fp4(fp4.pack(codes), scales)
        expected = (codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
                    * scales.view(ml_dtypes.float8_e8m0fnu).astype(np.float32))
    same_bits(weight, expected)


def nearest_even_codes(x: np.ndarray) -> np.ndarray:
    """The rounding rule written out: the nearest of the eight magnitudes (6 beyond 6), a value on a
    midpoint between two going to the even code, the sign bit on top (-0.0 too)."""
    magnitude = np.minimum(np.abs(x), 6)
    below = np.searchsorted(fp4.e2m1.MIDPOINTS, magnitude, side="left")  # the code under a tie
    above = np.searchsorted(fp4.e2m1.MIDPOINTS, magnitude, side="right")  # over it (the same off a tie)
    return np.where(below % 2 == 0, below, above).astype(np.uint8) | (np.signbit(x).astype(np.uint8) << 3)


def test_encode_rounds_to_nearest_even():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(20000) * 3, np.arange(-64, 65) / 8, [0.0, -0.0, 1e30, -1e30, 5.0, -5.0]])
    x = x.astype(np.float32)
    np.testing.assert_array_equal(fp4.encode(x), nearest_even_codes(x))
    assert fp4.e2m1.MIDPOINTS.tolist() == [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    assert fp4.encode(np.array([0.25, 0.75, 2.5, 5.0, 7.0], np.float32)).tolist() == [0, 2, 4, 6, 7]  # ties to even
    with pytest.raises(StepperError, match="NaN"):
        fp4.encode(np.array([np.nan], np.float32))


def test_e8m0_scales_are_the_smallest_power_of_two_that_fits():
    amax = np.array([6.0, 6.000001, 3.0, 0.0, 12.0, 1e-45, 1e38], np.float32)
    scales = e8m0.scales_for(amax, 6.0)
    assert e8m0.decode(scales).tolist()[:5] == [1.0, 2.0, 0.5, 1.0, 2.0]
    assert scales[5] == 0 and scales[6] == 127 + 124  # 1e38 / 6 is between 2^123 and 2^124; 1e-45 clamped to 2^-127
    assert e8m0.scales_for(np.array([3e38], np.float32), 1.0)[0] == 254  # 2^128 would be needed: clamped to 2^127
    ratios = amax[:5] / e8m0.decode(scales)[:5]
    assert (ratios <= 6).all() and ((ratios > 3) | (amax[:5] == 0)).all()


def test_fp4_weight_round_trip():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((8, 64)).astype(np.float32) * np.array([1e-3, 1, 50, 1e4] * 16, np.float32)
    packed, scales = fp4.quantize_fp4(w)
    assert packed.dtype == np.int8 and packed.shape == (8, 32)
    assert scales.dtype == ml_dtypes.float8_e8m0fnu and scales.shape == (8, 2)
    back = fp4.dequantize_fp4(packed, scales)
    # the reference: each group divided by its scale, rounded by ml_dtypes, multiplied back
    s = np.repeat(scales.astype(np.float32), 32, axis=1)
    same_bits(back, (w / s).astype(ml_dtypes.float4_e2m1fn).astype(np.float32) * s)
    assert (np.abs(w / s) <= 6).all()


def test_fp8_weight_with_e8m0_block_scales():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((200, 300)).astype(np.float32) * 0.02
    codes, scales = fp4.quantize_fp8_e8m0(w)
    assert scales.shape == (2, 3) and scales.dtype == ml_dtypes.float8_e8m0fnu
    back = fp8.dequantize(codes, scales)  # stepper.fp8 reads the E8M0 grid as any other scale
    s = np.repeat(np.repeat(scales.astype(np.float32), 128, 0), 128, 1)[:200, :300]
    same_bits(back, codes.astype(np.float32) * s)
    same_bits(codes, (w / s).astype(ml_dtypes.float8_e4m3fn))
    assert np.abs(back - w).max() <= np.abs(w).max() / 8  # e4m3's 3 mantissa bits
    assert (np.abs(w) / s <= 448).all()


@pytest.mark.parametrize("packed, scales, expected", [
    ((4, 16), (4, 2), "needs scales of shape [4, 1], got [4, 2]"),
    ((4, 15), (4, 1), "30 inputs are not a whole number of FP4 groups of 32"),
])
def test_shape_checks(packed, scales, expected):
    with pytest.raises(StepperError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        fp4.dequantize_fp4(np.zeros(packed, np.int8), np.zeros(scales, np.uint8), name="w")
    with pytest.raises(StepperError, match="expected E8M0 scales"):
        fp4.dequantize_fp4(np.zeros((4, 16), np.int8), np.zeros((4, 1), np.float32))
