"""Lesson 3 (fp8): decode e4m3fn bytes, then dequantize a weight stored in 128x128 blocks.

Write `decode` and `dequantize` below, then:

    stepper lesson check fp8           all 256 codes, partial blocks, and the run's real weights
    stepper run --use stepper-lessons/fp8.py
                                       every FP8 weight of the run decoded by your functions

Keep the names and the signatures: the interpreter calls decode(codes) and
dequantize(codes, scale_inv, block, name=...).
"""

import numpy as np

from stepper.fp8 import BLOCK


def decode(codes: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """e4m3fn bytes -> float32 values, elementwise.  uint8 [...] -> float32 [...]

    A byte is s eeee mmm: sign bit 7, exponent bits 6..3 (bias 7), mantissa bits 2..0.
      exponent 1..15: (-1)^s * 2^(e - 7) * (1 + m/8)
      exponent 0:     (-1)^s * 2^(1 - 7) * (m/8)          (0x00 is +0, 0x80 is -0)
      0x7F and 0xFF:  NaN (e4m3fn has no infinities)
    out: an optional float32 array to write into; the interpreter never passes it.
    """
    raise NotImplementedError("take each byte apart into sign, exponent and mantissa")


def dequantize(codes: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int] = BLOCK, *,
               name: str = "weight") -> np.ndarray:
    """value[i, j] = decode(code[i, j]) * scale_inv[i // block[0], j // block[1]].  [out, in] -> float32 [out, in]

    codes: [out, in] bytes (uint8) or float8_e4m3fn values; as_codes(codes) gives the bytes either way.
    scale_inv: float32 [ceil(out / block[0]), ceil(in / block[1])]; the last row and column of blocks may be partial.
    name: the weight's name, for error messages; you may ignore it.
    """
    raise NotImplementedError("decode the codes, then multiply each block by its scale")
