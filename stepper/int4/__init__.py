"""INT4 in compressed-tensors' `pack-quantized` format, as Kimi-K2-Thinking and Kimi-K2.5 store
their routed experts: codes packed eight to an int32 word (`packed`) with one BF16 scale per
group of 32 inputs (`groups`)."""

from stepper.int4.groups import (
    GROUP,
    LARGEST_BF16,
    LARGEST_SCALE,
    bf16_within,
    check_shapes,
    dequantize_int4,
    float32_scales,
    groups_for,
    kept_scales,
    quantize_int4,
    scales_as_f32,
)
from stepper.int4.packed import (
    BITS,
    OFFSET,
    PAIRS,
    PER_WORD,
    NibbleFields,
    as_words,
    fields,
    nibble,
    pack,
    unpack,
    unpack_bits,
    word_bits,
    words_for,
)

__all__ = [
    "BITS", "GROUP", "LARGEST_BF16", "LARGEST_SCALE", "OFFSET", "PAIRS", "PER_WORD", "NibbleFields", "as_words",
    "bf16_within", "check_shapes", "dequantize_int4", "fields", "float32_scales", "groups_for", "kept_scales", "nibble",
    "pack", "quantize_int4", "scales_as_f32", "unpack", "unpack_bits", "word_bits", "words_for",
]
