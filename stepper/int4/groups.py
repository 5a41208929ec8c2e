"""Group scales of INT4 weights: one scale per row and per group of 32 inputs.

A weight [out, in] stored as `weight_packed` (see int4.packed) comes with `weight_scale`
[out, ceil(in/32)], one BF16 scale for each run of 32 inputs of a row, and value[i, j] =
(nibble[i, j] - 8) * scale[i, j // 32]. The format is symmetric: no zero point, and the codes
-8..7 are used as they are. A row is a whole number of groups: compressed-tensors quantizes and
dequantizes only weights whose `in` is a multiple of the group size, and stepper refuses others
(the packer would pad a partial last word, but no such weight can be decompressed).

The product (nibble - 8) * scale is exact in float32: a 4-bit integer times a BF16 scale (8
significant bits) has at most 12 significant bits, so the float32 weight is the stored one
exactly, whatever order it is computed in.
"""

from __future__ import annotations

import numpy as np

from stepper import dtypes
from stepper.errors import StepperError
from stepper.int4.packed import OFFSET, as_words, pack, unpack_bits, words_for
from stepper.seams.swap import exercise

GROUP = 32  # inputs per scale, Kimi-K2-Thinking's group_size
LARGEST_SCALE = float(np.finfo(np.float32).max) / OFFSET  # |(-8) * scale| stays a finite float32
# The largest BF16 pattern whose value is at most LARGEST_SCALE (0x7DFF): a BF16 value is the high half of its float32
LARGEST_BF16 = int(np.array(LARGEST_SCALE, np.float32).view(np.uint32)) >> 16
SCALE_DTYPES = ("bfloat16", "float16", "float32")  # by name: ml_dtypes' are imported where met


def groups_for(in_features: int, group: int = GROUP) -> int:
    """The scales a row of `in_features` inputs has: ceil(in / group) (whole groups: in / group)."""
    return -(-in_features // group)


def check_shapes(packed: np.ndarray, scales: np.ndarray, shape: tuple[int, int], name: str, group: int = GROUP) -> None:
    """The packed words, the scales and the weight's shape [out, in] agree, in whole groups."""
    out_dim, in_dim = shape
    if in_dim % group:
        raise StepperError(f"{name}: {in_dim} inputs are not a whole number of groups of {group} "
                           f"(pack-quantized weights have no partial groups)")
    if packed.ndim != 2 or packed.shape != (out_dim, words_for(in_dim)):
        raise StepperError(f"{name}: a [{out_dim}, {in_dim}] INT4 weight needs packed words of shape "
                           f"[{out_dim}, {words_for(in_dim)}], got {list(packed.shape)}")
    if scales.shape != (out_dim, groups_for(in_dim, group)):
        raise StepperError(f"{name}: a [{out_dim}, {in_dim}] INT4 weight in groups of {group} needs scales of shape "
                           f"[{out_dim}, {groups_for(in_dim, group)}], got {list(scales.shape)}")


def scales_as_f32(scales: np.ndarray, name: str) -> np.ndarray:
    """The group scales as float32 (BF16, F16 and F32 all convert exactly), each finite and small
    enough that -8 times it is a finite float32."""
    scales = np.asarray(scales)
    if scales.dtype.name not in SCALE_DTYPES:
        raise StepperError(f"{name}: group scale dtype must be bfloat16, float16 or float32, got {scales.dtype}")
    scales = float32_scales(scales)
    if scales.size == 0 or max(scales.max(), -scales.min()) <= LARGEST_SCALE:  # False for a NaN
        return scales
    bad = ~(np.abs(scales) <= LARGEST_SCALE)  # NaN too
    where = [int(i) for i in np.argwhere(bad)[0]]
    raise StepperError(f"{name}: {int(bad.sum())} group scale(s) are not finite (or too large for float32), "
                       f"first {scales[tuple(where)]} at {where}")


def kept_scales(scales: np.ndarray, name: str) -> np.ndarray:
    """The group scales as an INT4 weight keeps them, checked as scales_as_f32 checks them: BF16
    ones as they are (the tile decoder widens a tile's at a time, int4_tiles), F16 and F32 ones as
    float32. BF16 scales that are all at least zero are checked on their bits, without a copy."""
    scales = np.asarray(scales)
    if scales.dtype.name != "bfloat16":
        return scales_as_f32(scales, name)
    if not bf16_within(scales, 0):
        scales_as_f32(scales, name)  # names the first bad scale; negative ones are allowed here
    return scales


def bf16_within(scales: np.ndarray, lowest: int) -> bool:
    """Whether every BF16 scale's pattern, read as a signed 16-bit integer, lies in lowest..LARGEST_BF16:
    from 0 (or 1, leaving out +0) that is each one finite, not negative and at most LARGEST_SCALE
    (a negative one, -0 included, has its sign bit set: below 0 as an int16; infinity and NaN are
    above LARGEST_BF16). Two passes over the 16-bit patterns, no float32 copy."""
    bits = scales.view(np.int16)
    return bits.size == 0 or (int(bits.min()) >= lowest and int(bits.max()) <= LARGEST_BF16)


def float32_scales(scales: np.ndarray) -> np.ndarray:
    """Scales of any float dtype as float32, exactly. A BF16 pattern shifted 16 bits up is its
    float32: one integer pass, where ml_dtypes' cast from bfloat16 runs about 2x slower (an INT4
    expert's three weights have 1.4 M scales, converted at every use)."""
    if scales.dtype.name != "bfloat16":
        return np.asarray(scales, dtype=np.float32)
    out = np.empty(scales.shape, np.float32)
    np.left_shift(scales.view(np.uint16), 16, out=out.view(np.uint32), dtype=np.uint32)
    return out


@exercise
def dequantize_int4(packed: np.ndarray, scales: np.ndarray, in_features: int, group: int = GROUP, *,
                    name: str = "weight") -> np.ndarray:
    """value[i, j] = (nibble[i, j] - 8) * scale[i, j // group].  words [out, in/8] -> float32 [out, in]

    name: the weight's name, used in error messages."""
    packed = as_words(packed, name)
    check_shapes(packed, np.asarray(scales), (packed.shape[0], in_features), name, group)
    scales = scales_as_f32(scales, name)  # [out, in/group]
    values = unpack_bits(packed, in_features).astype(np.float32)  # [out, in]
    return values * np.repeat(scales, group, axis=1)


def quantize_int4(w: np.ndarray, group: int = GROUP, *, name: str = "weight") -> tuple[np.ndarray, np.ndarray]:
    """float32 [out, in] -> (int32 words [out, ceil(in/8)], BF16 scales [out, ceil(in/group)]).

    Symmetric, as compressed-tensors quantizes: each group's scale is its largest |w| / 7.5 (half
    the 15 steps from -8 to 7), rounded to BF16, and each weight rounds to the nearest code
    w / scale, clamped to -8..7. An all-zero group gets scale 1 (its codes are 0, value 0)."""
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise StepperError(f"{name}: expected a 2-D weight [out, in], got shape {list(w.shape)}")
    if not np.isfinite(w).all():
        raise StepperError(f"{name}: cannot quantize NaN or infinite values")
    out_dim, in_dim = w.shape
    if in_dim % group:
        raise StepperError(f"{name}: {in_dim} inputs are not a whole number of groups of {group}: "
                           f"pack-quantized INT4 cannot store this weight")
    grouped = w.reshape(out_dim, -1, group)  # [out, groups, group]
    amax = np.abs(grouped).max(axis=2, initial=0)  # [out, groups]
    scales = np.where(amax > 0, amax / np.float32(OFFSET - 0.5), 1).astype(dtypes.ml("bfloat16"))
    scales[scales.astype(np.float32) == 0] = 1  # amax so tiny that / 7.5 underflows in BF16
    codes = np.clip(np.rint(grouped / scales.astype(np.float32)[:, :, None]), -OFFSET, OFFSET - 1)
    return pack(codes.reshape(out_dim, in_dim).astype(np.int8)), scales
