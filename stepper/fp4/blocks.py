"""FP4 weights with their group scales, and FP8 weights with E8M0 block scales, as DeepSeek-V4
stores them.

An FP4 weight [out, in] is `X.weight`, I8 [out, in/2] (packed.py), with `X.scale`, F8_E8M0
[out, in/32]: one power-of-two scale per row and per group of 32 inputs, and
value[i, j] = e2m1(code[i, j]) * 2^(scale[i, j // 32] - 127). A value has at most two significant
bits, so the product is exact in float32 (2^-128, the smallest, is a float32 subnormal); only a
scale byte past 0xFC times ±6 overflows float32's range.

An FP8 weight is F8_E4M3 [out, in] with `X.scale`, F8_E8M0 [ceil(out/128), ceil(in/128)]: the
same grid as DeepSeek-V3's F32 `weight_scale_inv`, each scale now a power of two, so stepper.fp8
decodes it (a byte converts to float32 exactly); `quantize_fp8_e8m0` writes such a weight.
"""

from __future__ import annotations

import numpy as np

from stepper import dtypes, fp8
from stepper.errors import StepperError
from stepper.fp4 import e8m0
from stepper.fp4.e2m1 import E2M1_TABLE, FP4_MAX, encode
from stepper.fp4.packed import as_bytes, pack, unpack

GROUP = 32  # inputs per FP4 scale


def packed_shape(shape: tuple[int, int]) -> tuple[int, int]:
    """The I8 bytes of an FP4 weight [out, in]: [out, in/2]."""
    return shape[0], shape[1] // 2


def group_shape(shape: tuple[int, int], group: int = GROUP) -> tuple[int, int]:
    """The scales of an FP4 weight [out, in]: [out, in/32]."""
    return shape[0], shape[1] // group


def check_shapes(packed: np.ndarray, scales: np.ndarray, shape: tuple[int, int], name: str, group: int = GROUP) -> None:
    """The packed bytes, the scales and the weight's shape [out, in] agree, in whole groups."""
    out_dim, in_dim = shape
    if in_dim % group:
        raise StepperError(f"{name}: {in_dim} inputs are not a whole number of FP4 groups of {group}")
    if packed.shape != packed_shape(shape):
        raise StepperError(f"{name}: a [{out_dim}, {in_dim}] FP4 weight needs packed bytes of shape "
                           f"{list(packed_shape(shape))} (two codes a byte), got {list(packed.shape)}")
    if scales.shape != group_shape(shape, group):
        raise StepperError(f"{name}: a [{out_dim}, {in_dim}] FP4 weight in groups of {group} needs scales of shape "
                           f"{list(group_shape(shape, group))}, got {list(scales.shape)}")


def dequantize_fp4(packed: np.ndarray, scales: np.ndarray, group: int = GROUP, *, name: str = "weight") -> np.ndarray:
    """value[i, j] = e2m1(code[i, j]) * 2^(scale[i, j // 32] - 127).  bytes [out, in/2] -> float32 [out, in]

    name: the weight's name, used in error messages."""
    packed = as_bytes(packed, name)
    scale_bytes = e8m0.as_bytes(scales, f"{name} scales")
    shape = (packed.shape[0], 2 * packed.shape[1])
    check_shapes(packed, scale_bytes, shape, name, group)
    values = E2M1_TABLE[unpack(packed)]  # [out, in]
    return values * np.repeat(e8m0.decode(scale_bytes), group, axis=1)  # [out, in] * [out, in]


def quantize_fp4(w: np.ndarray, group: int = GROUP, *, name: str = "weight") -> tuple[np.ndarray, np.ndarray]:
    """float32 [out, in] -> (I8 bytes [out, in/2], F8_E8M0 scales [out, in/32]).

    Each group's scale is the smallest power of two bringing its largest |w| within ±6, and each
    weight rounds to the nearest e2m1 value of w / scale (ties to even). w must be finite."""
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise StepperError(f"{name}: expected a 2-D weight [out, in], got shape {list(w.shape)}")
    if not np.isfinite(w).all():
        raise StepperError(f"{name}: cannot quantize NaN or infinite values")
    out_dim, in_dim = w.shape
    if in_dim % group:
        raise StepperError(f"{name}: {in_dim} inputs are not a whole number of FP4 groups of {group}")
    grouped = w.reshape(out_dim, -1, group)  # [out, groups, group]
    scale_bytes = e8m0.scales_for(np.abs(grouped).max(axis=2, initial=0), FP4_MAX)  # [out, groups]
    codes = encode(grouped / e8m0.decode(scale_bytes)[:, :, None], name)  # [out, groups, group]
    return pack(codes.reshape(out_dim, in_dim)), scale_bytes.view(dtypes.ml("float8_e8m0fnu"))


def quantize_fp8_e8m0(w: np.ndarray, block: tuple[int, int] = fp8.BLOCK, *,
                      name: str = "weight") -> tuple[np.ndarray, np.ndarray]:
    """float32 [out, in] -> (e4m3 codes [out, in], F8_E8M0 scales [ceil(out/128), ceil(in/128)]).

    Each block's scale is the smallest power of two bringing its largest |w| within ±448 (DeepSeek's
    `scale_fmt: ue8m0`), and each weight rounds to the nearest e4m3 value of w / scale. w must be finite."""
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise StepperError(f"{name}: expected a 2-D weight [out, in], got shape {list(w.shape)}")
    if not np.isfinite(w).all():
        raise StepperError(f"{name}: cannot quantize NaN or infinite values")
    rows, cols = block
    grid = fp8.scale_grid(w.shape, block)
    padded = np.zeros((grid[0] * rows, grid[1] * cols), np.float32)
    padded[: w.shape[0], : w.shape[1]] = np.abs(w)
    amax = padded.reshape(grid[0], rows, grid[1], cols).max(axis=(1, 3))  # [out/128, in/128]
    scale_bytes = e8m0.scales_for(amax, fp8.FP8_MAX)
    spread = np.repeat(np.repeat(e8m0.decode(scale_bytes), rows, axis=0), cols, axis=1)[: w.shape[0], : w.shape[1]]
    return fp8.encode(w / spread), scale_bytes.view(dtypes.ml("float8_e8m0fnu"))
