"""FP8 e4m3fn, the number format DeepSeek-V3 / Kimi K2 store weights in: the byte bit by bit
(`e4m3`) and the 128x128 block scales of a weight (`blocks`)."""

from stepper.fp8.blocks import (
    BLOCK,
    block_starts,
    check_block_shapes,
    dequantize,
    per_tensor_grid,
    quantize,
    scale_grid,
    scale_rows,
    scales_as_f32,
)
from stepper.fp8.e4m3 import (
    E4M3_TABLE,
    EXPONENT_BIAS,
    FP8_MAX,
    KEEP_SIGN_EXPONENT_MANTISSA,
    REBIAS,
    Fp8Fields,
    as_codes,
    decode,
    decode_bits,
    decode_table,
    encode,
    fields,
)

__all__ = [
    "BLOCK", "E4M3_TABLE", "EXPONENT_BIAS", "FP8_MAX", "KEEP_SIGN_EXPONENT_MANTISSA", "REBIAS", "Fp8Fields",
    "as_codes", "block_starts", "check_block_shapes", "decode", "decode_bits", "decode_table", "dequantize",
    "encode", "fields", "per_tensor_grid", "quantize", "scale_grid", "scale_rows", "scales_as_f32",
]
