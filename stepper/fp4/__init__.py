"""FP4 e2m1 and E8M0, the formats DeepSeek-V4 stores weights in: the 4-bit codes (`e2m1`), the
power-of-two scales (`e8m0`), two codes to a byte (`packed`), and a weight's group and block
scales (`blocks`)."""

from stepper.fp4 import e8m0
from stepper.fp4.blocks import (
    GROUP,
    check_shapes,
    dequantize_fp4,
    group_shape,
    packed_shape,
    quantize_fp4,
    quantize_fp8_e8m0,
)
from stepper.fp4.e2m1 import E2M1_TABLE, FP4_MAX, Fp4Fields, decode, decode_bits, encode, fields
from stepper.fp4.packed import PAIRS, as_bytes, nibbles, pack, unpack

__all__ = [
    "E2M1_TABLE", "FP4_MAX", "GROUP", "PAIRS", "Fp4Fields", "as_bytes", "check_shapes", "decode", "decode_bits",
    "dequantize_fp4", "e8m0", "encode", "fields", "group_shape", "nibbles", "pack", "packed_shape", "quantize_fp4",
    "quantize_fp8_e8m0", "unpack",
]
