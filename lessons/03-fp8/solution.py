"""Lesson 3 (fp8): decode e4m3fn bytes, then dequantize a weight stored in 128x128 blocks."""

import numpy as np

from stepper.fp8 import BLOCK, as_codes

F32 = np.float32


def decode(codes: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """e4m3fn bytes -> float32 values, elementwise.  uint8 [...] -> float32 [...]"""
    codes = as_codes(codes)
    sign = np.where(codes >> 7 == 1, F32(-1), F32(1))
    exponent = ((codes >> 3) & 0b1111).astype(np.int32)
    mantissa = (codes & 0b111).astype(F32)
    normal = np.ldexp(F32(1) + mantissa / F32(8), exponent - 7)  # 2^(e-7) * (1 + m/8)
    subnormal = np.ldexp(mantissa / F32(8), -6)  # 2^-6 * (m/8)
    values = (sign * np.where(exponent == 0, subnormal, normal)).astype(F32)
    values[(codes & 0x7F) == 0x7F] = np.nan  # 0x7F and 0xFF
    if out is not None:
        out[...] = values
        return out
    return values


def dequantize(codes: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int] = BLOCK, *,
               name: str = "weight") -> np.ndarray:
    """value[i, j] = decode(code[i, j]) * scale_inv[i // block[0], j // block[1]].  [out, in] -> float32 [out, in]"""
    codes = as_codes(codes, name)
    out_dim, in_dim = codes.shape
    scales = np.asarray(scale_inv, dtype=F32)  # [ceil(out/128), ceil(in/128)]
    full = np.repeat(np.repeat(scales, block[0], axis=0), block[1], axis=1)[:out_dim, :in_dim]  # [out, in]
    return decode(codes) * full
