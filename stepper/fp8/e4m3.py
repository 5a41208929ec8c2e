"""FP8 e4m3fn, the byte format DeepSeek-V3 / Kimi K2 store weights in, and its decoding.

e4m3fn bytes: sign = bit 7, exponent = bits 6..3 (bias 7), mantissa = bits 2..0. Exponent 0 is
subnormal, there are no infinities, NaN only at 0x7F and 0xFF, and the largest value is ±448.
`value_of` and `fields` read one byte the slow, explicit way (for learners and the UI); `decode`
does the same for whole arrays with a bit trick; `E4M3_TABLE` is the 256-entry table.

Every decoded value is float32. Codes may be given as uint8 or as `ml_dtypes.float8_e4m3fn`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from stepper import dtypes
from stepper.errors import StepperError
from stepper.seams.swap import exercise

FP8_MAX = 448.0  # 0x7E = 0 1111 110 = 2^(15-7) * (1 + 6/8)
EXPONENT_BIAS = 7


def decode_bits(code: int) -> float:
    """The value of one e4m3fn byte, read field by field.

    normal    (exponent 1..15): (-1)^sign * 2^(exponent - 7) * (1 + mantissa/8)
    subnormal (exponent 0):     (-1)^sign * 2^-6 * (mantissa/8)      (0x00 = +0, 0x80 = -0)
    NaN:      0x7F and 0xFF only (exponent 15 with mantissa 7); there is no infinity.
    """
    if not 0 <= code <= 255:
        raise ValueError(f"an e4m3fn code is one byte, 0..255; got {code}")
    sign = (code >> 7) & 0b1
    exponent = (code >> 3) & 0b1111
    mantissa = code & 0b111
    signum = -1.0 if sign else 1.0
    if exponent == 0b1111 and mantissa == 0b111:
        return math.copysign(math.nan, signum)
    if exponent == 0:
        return signum * 2.0 ** (1 - EXPONENT_BIAS) * (mantissa / 8)
    return signum * 2.0 ** (exponent - EXPONENT_BIAS) * (1 + mantissa / 8)


@dataclass(frozen=True)
class Fp8Fields:
    """One e4m3fn byte taken apart, for showing it bit by bit."""

    code: int
    sign: int  # bit 7
    exponent_bits: int  # bits 6..3, biased by 7
    mantissa_bits: int  # bits 2..0
    kind: str  # "zero", "subnormal", "normal" or "nan"
    value: float
    formula: str  # the arithmetic, e.g. "(-1)^1 * 2^(9-7) * (1 + 5/8) = -6.5"

    @property
    def bits(self) -> str:
        """The byte as "s eeee mmm", e.g. "1 1001 101" for 0xCD."""
        return f"{self.sign:01b} {self.exponent_bits:04b} {self.mantissa_bits:03b}"


def fields(code: int) -> Fp8Fields:
    """Split one byte into sign, exponent and mantissa, and write out how its value is formed."""
    value = decode_bits(code)
    s, e, m = (code >> 7) & 0b1, (code >> 3) & 0b1111, code & 0b111
    if math.isnan(value):
        kind, formula = "nan", f"exponent {e:04b} with mantissa {m:03b} = NaN"
    elif e == 0:
        kind = "zero" if m == 0 else "subnormal"
        formula = f"(-1)^{s} * 2^(1-{EXPONENT_BIAS}) * ({m}/8) = {value!r}"
    else:
        kind = "normal"
        formula = f"(-1)^{s} * 2^({e}-{EXPONENT_BIAS}) * (1 + {m}/8) = {value!r}"
    return Fp8Fields(code, s, e, m, kind, value, formula)


E4M3_TABLE = np.array([decode_bits(c) for c in range(256)], dtype=np.float32)  # [256] code -> float32


def as_codes(codes: np.ndarray, name: str = "fp8 codes") -> np.ndarray:
    """The raw bytes of an array of e4m3 codes as uint8 (a view, never a copy)."""
    codes = np.asarray(codes)
    if codes.dtype.name == "float8_e4m3fn":
        return codes.view(np.uint8)
    if codes.dtype != np.uint8:
        raise StepperError(f"{name}: expected dtype float8_e4m3fn (or its bytes as uint8), got {codes.dtype}")
    return codes


def decode_table(codes: np.ndarray) -> np.ndarray:
    """e4m3 codes -> float32 by looking each byte up in E4M3_TABLE."""
    return E4M3_TABLE[as_codes(codes)]


# float32's exponent bias is 127, e4m3's is 7: a float32 holding e4m3's bits is 2^-120 too small.
REBIAS = np.float32(2.0**120)
KEEP_SIGN_EXPONENT_MANTISSA = np.uint32(0b1000_0111_1111 << 20)  # bit 31 and bits 26..20


@exercise
def decode(codes: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """e4m3 codes -> float32, by moving the bits into place instead of looking them up.

    An e4m3 byte `s eeee mmm` becomes the float32 `s 0000eeee mmm00000000000000000000`: the sign
    goes to bit 31, and the 7 bits eeee mmm, shifted left by 20, land in the low 4 bits of
    float32's exponent and the top 3 of its mantissa. Read as float32 that is (1 + m/8) * 2^(e-127),
    or for e = 0 the float32 subnormal (m/8) * 2^-126; multiplying by 2^120 turns the bias 127
    into 7 and both cases into e4m3's values, exactly. Last, 0x7F and 0xFF (which came out as
    ±480) become NaN.

    Everything happens inside the float32 result, without temporaries of its size: the byte is
    sign-extended to 32 bits (bits 31..7 are all the sign), shifted left by 20 (the sign now fills
    bits 31..27), and bits 30..27 are cleared, leaving the sign only in bit 31.

    out: an optional float32 buffer of the same shape to decode into (it is also returned).
    """
    codes = as_codes(codes)
    if out is None:
        out = np.empty(codes.shape, dtype=np.float32)
    elif out.dtype != np.float32 or out.shape != codes.shape or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous float32 array of shape {codes.shape}, "
                         f"got {out.dtype} {out.shape}")
    bits = out.view(np.uint32)
    np.copyto(out.view(np.int32), codes.view(np.int8))  # s eeee mmm -> s...s s eeee mmm (sign-extended)
    np.left_shift(bits, 20, out=bits)  # -> sssss eeee mmm 0...0  (20 zeros)
    np.bitwise_and(bits, KEEP_SIGN_EXPONENT_MANTISSA, out=bits)  # -> s 0000 eeee mmm 0...0
    np.multiply(out, REBIAS, out=out)  # 2^(e-127) -> 2^(e-7)
    if codes.view(np.int8).max(initial=0) == 0x7F:  # two quick scans spare the masks when (as usual) there is no NaN
        out[codes == 0x7F] = E4M3_TABLE[0x7F]  # +NaN
    if codes.max(initial=0) == 0xFF:
        out[codes == 0xFF] = E4M3_TABLE[0xFF]  # -NaN, with its sign bit, as ml_dtypes gives it
    return out


def encode(x: np.ndarray) -> np.ndarray:
    """float32 -> e4m3 codes, rounding to nearest even; beyond ±448 saturates to ±448 (not NaN)."""
    return np.clip(x, -FP8_MAX, FP8_MAX).astype(dtypes.ml("float8_e4m3fn"))
