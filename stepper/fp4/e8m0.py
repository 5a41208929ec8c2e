"""E8M0, the scale format of DeepSeek-V4's checkpoints (safetensors dtype F8_E8M0): one byte, all
exponent. A byte b stands for 2^(b - 127): 0x00 is 2^-127, 0x7F is 1, 0xFE is 2^127, and 0xFF is
NaN. There is no sign, no zero and no infinity.

`value_of` reads one byte; `decode` a whole array through the 256-entry table; `scales_for`
picks, for a block whose largest |value| is amax, the smallest power of two that brings amax
within a format's largest value (how DeepSeek's `ue8m0` scales are chosen), as bytes.
"""

from __future__ import annotations

import math

import numpy as np

from stepper.errors import StepperError

EXPONENT_BIAS = 127
NAN_BYTE = 0xFF
FRACTION_BITS = 23  # float32's: its exponent field starts above them
SMALLEST_EXPONENT, LARGEST_EXPONENT = -127, 127  # bytes 0x00 and 0xFE


def value_of(byte: int) -> float:
    """2^(byte - 127), NaN for 0xFF."""
    if not 0 <= byte <= 255:
        raise ValueError(f"an E8M0 scale is one byte, 0..255; got {byte}")
    return math.nan if byte == NAN_BYTE else 2.0 ** (byte - EXPONENT_BIAS)


E8M0_TABLE = np.array([value_of(b) for b in range(256)], dtype=np.float32)  # [256] byte -> float32 (2^-127: subnormal)


def as_bytes(scales: np.ndarray, name: str = "scales") -> np.ndarray:
    """The raw bytes of E8M0 scales as uint8 (a view): given as ml_dtypes' float8_e8m0fnu or as uint8."""
    scales = np.asarray(scales)
    if scales.dtype.name == "float8_e8m0fnu":
        return scales.view(np.uint8)
    if scales.dtype != np.uint8:
        raise StepperError(f"{name}: expected E8M0 scales (F8_E8M0, or their bytes as uint8), got dtype {scales.dtype}")
    return scales


def decode(scales: np.ndarray) -> np.ndarray:
    """E8M0 bytes -> float32 powers of two (NaN for 0xFF): bytes 1-254 are the float32 exponent
    field itself, mantissa 0 (a shift, 3x faster than the table); arrays holding 0x00 (2^-127, a
    float32 subnormal) or 0xFF through the 256-entry table. (A few tokens' FP4 tiles put the bytes
    in place themselves: kernels.int4_tiles.scales_per_byte.)"""
    raw = as_bytes(scales)
    if raw.size and (raw.min() == 0 or raw.max() == NAN_BYTE):
        return np.take(E8M0_TABLE, raw, mode="wrap")  # "wrap": a byte is never out of range, so no bounds check
    bits = raw.astype(np.uint32)
    np.left_shift(bits, FRACTION_BITS, out=bits)
    return bits.view(np.float32)


def scales_for(amax: np.ndarray, largest: float) -> np.ndarray:
    """The E8M0 byte of 2^ceil(log2(amax / largest)) for each block's largest magnitude: the smallest
    power of two s with amax / s <= largest, clamped to 2^-127 .. 2^127. A block of zeros gets 1
    (byte 127): its codes are all 0 whatever the scale.  float32 [...] -> uint8 [...]"""
    ratio = np.asarray(amax, dtype=np.float64) / largest  # float64: no rounding before the ceiling
    mantissa, exponent = np.frexp(ratio)  # ratio = m * 2^e, m in [0.5, 1)
    power = np.where(mantissa == 0.5, exponent - 1, exponent)  # ceil(log2(ratio)); exact powers stay
    power = np.where(ratio > 0, np.clip(power, SMALLEST_EXPONENT, LARGEST_EXPONENT), 0)
    return (power + EXPONENT_BIAS).astype(np.uint8)
