"""128x128 block scaling of FP8 weights.

A weight `X.weight` [out, in] of e4m3 codes comes with `X.weight_scale_inv`
[ceil(out/128), ceil(in/128)], and value[i, j] = code[i, j] * scale_inv[i // 128, j // 128].
The last row and column blocks may be partial (e.g. [576, 7168] has scales [5, 56]).
"""

from __future__ import annotations

import numpy as np

from stepper import dtypes
from stepper.errors import StepperError
from stepper.fp8.e4m3 import FP8_MAX, as_codes, decode, encode
from stepper.seams.swap import exercise

BLOCK = (128, 128)  # rows (out) x cols (in) sharing one scale


def scale_grid(shape: tuple[int, int], block: tuple[int, int] = BLOCK) -> tuple[int, int]:
    """The shape of a weight's scale_inv: one scale per block, partial blocks included."""
    out_dim, in_dim = shape
    return -(-out_dim // block[0]), -(-in_dim // block[1])


def scale_rows(start: int, end: int, block_rows: int) -> slice:
    """The rows of scale_inv that weight rows [start, end) use (start on a block edge, or not)."""
    return slice(start // block_rows, -(-end // block_rows))


def block_starts(size: int, block: int) -> range:
    return range(0, size, block)


def check_block_shapes(codes: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int], name: str) -> None:
    if codes.ndim != 2:
        raise StepperError(f"{name}: expected a 2-D weight [out, in], got shape {list(codes.shape)}")
    expected = scale_grid(codes.shape, block)
    if scale_inv.shape != expected:
        raise StepperError(
            f"{name}: weight {list(codes.shape)} in {block[0]}x{block[1]} blocks needs scale_inv of shape "
            f"{list(expected)}, got {list(scale_inv.shape)}"
        )


def per_tensor_grid(shape: tuple[int, int], scale: float, block: tuple[int, int] = BLOCK) -> np.ndarray:
    """One scale for a whole weight, as the block grid holding it in every block: the same values
    (code x scale everywhere), so the block-scaled paths and their fast kernels read it unchanged."""
    return np.full(scale_grid(shape, block), scale, dtype=np.float32)  # [ceil(out/128), ceil(in/128)]


SCALE_DTYPES = ("float32", "bfloat16", "float16", "float8_e8m0fnu")  # by name: ml_dtypes' are imported where met


def scales_as_f32(scale_inv: np.ndarray, name: str) -> np.ndarray:
    """scale_inv as float32; it is stored as float32, bfloat16, float16 or float8_e8m0fnu (powers
    of two 2^(e - 127)): all convert exactly."""
    scale_inv = np.asarray(scale_inv)
    if scale_inv.dtype.name not in SCALE_DTYPES:
        raise StepperError(f"{name}: scale_inv dtype must be float32, bfloat16, float16 or float8_e8m0fnu, "
                           f"got {scale_inv.dtype}")
    return scale_inv.astype(np.float32, copy=False)


@exercise
def dequantize(codes: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int] = BLOCK, *,
               name: str = "weight") -> np.ndarray:
    """value[i, j] = decode(code[i, j]) * scale_inv[i // 128, j // 128].  [out, in] -> float32 [out, in]

    Decodes into the output buffer, then scales it in place one row block at a time, so the only
    full-size array is the result (the scales of one row block are repeated along `in`: [in]).
    name: the weight's name, used in error messages.
    """
    codes = as_codes(codes, name)
    check_block_shapes(codes, np.asarray(scale_inv), block, name)
    scale_inv = scales_as_f32(scale_inv, name)  # [out/128, in/128]
    rows, cols = block
    in_dim = codes.shape[1]
    w = decode(codes)  # [out, in]
    for r, r0 in enumerate(block_starts(codes.shape[0], rows)):
        w[r0:r0 + rows] *= np.repeat(scale_inv[r], cols)[:in_dim]  # [rows, in] * [in]
    return w


def quantize(w: np.ndarray, block: tuple[int, int] = BLOCK, *, name: str = "weight") -> tuple[np.ndarray, np.ndarray]:
    """float32 [out, in] -> (e4m3 codes [out, in], scale_inv float32 [ceil(out/128), ceil(in/128)]).

    Each block gets scale_inv = amax(|block|) / 448, so its largest element becomes exactly ±448
    and the rest round to nearest even on the e4m3 grid. An all-zero block gets scale_inv 1.0
    (its codes are all 0, which dequantize back to 0 under any scale), and so does a block so
    tiny (amax < 448 * 2^-149) that amax / 448 underflows to 0. w must be finite.
    """
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise StepperError(f"{name}: expected a 2-D weight [out, in], got shape {list(w.shape)}")
    if not np.isfinite(w).all():
        raise StepperError(f"{name}: cannot quantize NaN or infinite values")
    rows, cols = block
    in_dim = w.shape[1]
    col_starts = np.arange(0, in_dim, cols)
    codes = np.empty(w.shape, dtype=dtypes.ml("float8_e4m3fn"))
    scale_inv = np.empty(scale_grid(w.shape, block), dtype=np.float32)
    for r, r0 in enumerate(block_starts(w.shape[0], rows)):
        rows_w = w[r0:r0 + rows]  # [rows, in]
        amax = np.maximum.reduceat(np.abs(rows_w).max(axis=0), col_starts) if in_dim else np.zeros(0, np.float32)
        scale = amax / np.float32(FP8_MAX)  # [in/128]
        scale_inv[r] = np.where(scale > 0, scale, np.float32(1))
        codes[r0:r0 + rows] = encode(rows_w / np.repeat(scale_inv[r], cols)[:in_dim])
    return codes, scale_inv
