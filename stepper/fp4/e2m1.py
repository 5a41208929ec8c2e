"""FP4 e2m1, the 4-bit number format DeepSeek-V4 stores its routed experts in.

A code is 4 bits `s ee m`: sign = bit 3, exponent = bits 2..1 (bias 1), mantissa = bit 0.
Exponent 0 is subnormal (0 and 0.5), there is no infinity and no NaN, and the largest value is
±6. The sixteen values are 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives (code 8 is -0).
`decode_bits` and `fields` read one code the slow, explicit way (for learners and the UI);
`E2M1_TABLE` is the 16-entry table the fast paths look codes up in; `encode` rounds floats to the
nearest code.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepper import dtypes
from stepper.errors import StepperError

EXPONENT_BIAS = 1
FP4_MAX = 6.0  # 0b0111 = 2^(3-1) * (1 + 1/2)
CODES = 16


def decode_bits(code: int) -> float:
    """The value of one e2m1 code, read field by field.

    normal    (exponent 1..3): (-1)^sign * 2^(exponent - 1) * (1 + mantissa/2)
    subnormal (exponent 0):    (-1)^sign * 2^0 * (mantissa/2)      (0b0000 = +0, 0b1000 = -0)
    """
    if not 0 <= code < CODES:
        raise ValueError(f"an e2m1 code is 4 bits, 0..15; got {code}")
    sign, exponent, mantissa = (code >> 3) & 0b1, (code >> 1) & 0b11, code & 0b1
    signum = -1.0 if sign else 1.0
    if exponent == 0:
        return signum * 2.0 ** (1 - EXPONENT_BIAS) * (mantissa / 2)
    return signum * 2.0 ** (exponent - EXPONENT_BIAS) * (1 + mantissa / 2)


@dataclass(frozen=True)
class Fp4Fields:
    """One e2m1 code taken apart, for showing it bit by bit."""

    code: int
    sign: int  # bit 3
    exponent_bits: int  # bits 2..1, biased by 1
    mantissa_bits: int  # bit 0
    kind: str  # "zero", "subnormal" or "normal"
    value: float
    formula: str  # the arithmetic, e.g. "(-1)^1 * 2^(3-1) * (1 + 1/2) = -6.0"

    @property
    def bits(self) -> str:
        """The code as "s ee m", e.g. "1 11 1" for 0xF."""
        return f"{self.sign:01b} {self.exponent_bits:02b} {self.mantissa_bits:01b}"


def fields(code: int) -> Fp4Fields:
    """Split one code into sign, exponent and mantissa, and write out how its value is formed."""
    value = decode_bits(code)
    s, e, m = (code >> 3) & 0b1, (code >> 1) & 0b11, code & 0b1
    if e == 0:
        kind = "zero" if m == 0 else "subnormal"
        formula = f"(-1)^{s} * 2^(1-{EXPONENT_BIAS}) * ({m}/2) = {value!r}"
    else:
        kind = "normal"
        formula = f"(-1)^{s} * 2^({e}-{EXPONENT_BIAS}) * (1 + {m}/2) = {value!r}"
    return Fp4Fields(code, s, e, m, kind, value, formula)


E2M1_TABLE = np.array([decode_bits(c) for c in range(CODES)], dtype=np.float32)  # [16] code -> float32
MAGNITUDES = E2M1_TABLE[:8]  # [8] codes 0..7: 0, 0.5, 1, 1.5, 2, 3, 4, 6
MIDPOINTS = (MAGNITUDES[:-1] + MAGNITUDES[1:]) / 2  # [7] where rounding goes from one code to the next


def decode(codes: np.ndarray) -> np.ndarray:
    """e2m1 codes (uint8, 0..15) -> float32, looked up in E2M1_TABLE."""
    codes = np.asarray(codes)
    if codes.size and int(codes.max()) >= CODES:
        raise ValueError(f"e2m1 codes are 0..15; got {int(codes.max())}")
    return E2M1_TABLE[codes]


def encode(x: np.ndarray, name: str = "values") -> np.ndarray:
    """float32 -> e2m1 codes (uint8 0..15), rounding to nearest, ties to the even code (ml_dtypes'
    float4_e2m1fn does the rounding); beyond ±6 saturates to ±6 (there is no infinity); -0.0 is
    code 8. tests/unit/test_fp4_formats.py checks it against the rule written out: the nearest of
    MAGNITUDES, a value on a MIDPOINT going to the even code."""
    x = np.asarray(x, dtype=np.float32)
    if not np.isfinite(x).all():
        raise StepperError(f"{name}: cannot encode NaN or infinite values as e2m1")
    return np.clip(x, -FP4_MAX, FP4_MAX).astype(dtypes.ml("float4_e2m1fn")).view(np.uint8)
