"""FP8 weights applied to activations without ever holding the weight in float32.

`Fp8Matrix` is an e4m3 weight [out, in] with its block scales. `x @ W^T` runs one tile of rows
at a time: the tile's codes are decoded straight into a float32 buffer one block of scale rows
high, multiplied, and the buffer is reused for the next tile. A large product is shared out in
bands of rows with helper processes, one per further core (`fp8_workers`).

Decoding is `fp8.decode`'s bit trick without its last pass: the tile holds each code's value
times 2^-120 (the bits moved into place, not yet rebiased). Neither the 2^120 nor the block
scales touch the weight. A tile never crosses a block of scale rows, so for its rows the scale
depends only on the input column: it goes onto the inputs instead, with a power of two 2^k,

    y[i] = sum_j d[i, j] * s[b, j] * x[j] = 2^(120 - k) * sum_j (d[i, j] * 2^-120) * (x[j] * s[b, j] * 2^k)

which costs N x in multiplications per scale row instead of rows x in per tile. k is chosen
per product so that the largest scaled input is about 2^64: then every product and every sum
stays far inside float32's range whatever the magnitudes of x and s (`input_rebias`), and the
powers of two are exact. The result equals dequantizing with `fp8.dequantize` and multiplying,
which stays as the readable reference, to float32 rounding: each weight-times-input is rounded
once either way, at a different place.
"""

from __future__ import annotations

import math

import numpy as np

from stepper import fp8
from stepper.errors import StepperError
from stepper.kernels import gemm
from stepper.kernels.fp8_tiles import (
    SCALED_INPUT_EXPONENT,
    Decoder,
    NanCheck,
    apply_tiles,
    column_scales,
    many_tokens,
    result_arrays,
    row_tiles,
    times_power_of_two,
)
from stepper.kernels.fp8_workers import linear_bands
from stepper.seams.swap import bypasses
from stepper.weights.stored import Fp8Matrix

GEMM_COLUMNS = 8  # BLAS's fast multiple of tokens
REBIAS_EXPONENT = 120  # fp8.REBIAS = 2^120
SMALLEST_INPUT = 2.0**-60  # below this the scales times 2^k could overflow: the dense path is used


def linear_fp8(x: np.ndarray, w: Fp8Matrix) -> np.ndarray:
    """x @ W^T for an FP8 weight.  [..., in] -> [..., out], float32."""
    return products(x, [w])[0]


def product(x: np.ndarray, w: Fp8Matrix, decode: Decoder | None = None) -> np.ndarray:
    """x @ W^T, each tile decoded by decode(codes, out) into its values times 2^-120 (by default
    the bit trick here, with large products shared out across the cores)."""
    return tiled_products(x, [w], decode)[0]


def products_via_dequantize(x: np.ndarray, ws: list[Fp8Matrix]) -> list[np.ndarray]:
    """The same products with each tile through `fp8.dequantize` (and so `fp8.decode`), whichever
    functions those names run now: the tiles, padding, scaling and products are those of
    `tiled_products`, so stepper's own functions give the same bits.  [..., in] -> [[..., out_i]]"""
    return [product(x, w, dequantizing_decoder(w)) for w in ws]


def dequantizing_decoder(w: Fp8Matrix) -> Decoder:
    """A tile decoder calling `fp8.dequantize` with unit scales times 2^-120 (exact)."""

    def decode(codes: np.ndarray, out: np.ndarray) -> None:
        unbias = np.full(fp8.scale_grid(codes.shape, w.block), 1 / fp8.REBIAS, dtype=np.float32)
        out[...] = fp8.dequantize(codes, unbias, w.block, name=w.name)

    return decode


def tiled_products(x: np.ndarray, ws: list[Fp8Matrix], decode: Decoder | None = None) -> list[np.ndarray]:
    """x @ W^T for each of several weights [out_i, in] of the same input, which is looked over
    and padded once (unless the BLAS is faster without: gemm.unpadded); shared with helpers, the
    weights' rows one after another are cut into bands as one weight's would be (a SwiGLU's gate
    and up on two cores: one weight each, one message and one wait for the two).
    [..., in] -> [[..., out_i]]"""
    tokens = x.reshape(-1, ws[0].shape[1]).astype(np.float32, copy=False)  # [N, in]
    x_max = input_magnitude(tokens)
    ks = [input_rebias(tokens, w, x_max) for w in ws]
    # inf / NaN / all-tiny inputs or scales (no k): the readable path gives their exact semantics
    outs = [np.matmul(x, w.dequantize().T) if k is None else None for w, k in zip(ws, ks)]
    tiled = [i for i, k in enumerate(ks) if k is not None]
    if not tiled:
        return outs
    padded = ready_columns(tokens)  # [N', in]
    arrays = [result_arrays(ws[i].shape[0], padded.shape[0], many_tokens(padded.shape[0], ws[i])) for i in tiled]
    if decode is not None or not linear_bands(padded, [ws[i] for i in tiled], [ks[i] for i in tiled],
                                              [rows for _, rows in arrays]):  # large: shared with helpers
        for i, (_, rows) in zip(tiled, arrays):
            apply_tiles(padded, ws[i], ks[i], rows, decode)
    for i, (result, rows) in zip(tiled, arrays):
        times_power_of_two(result, REBIAS_EXPONENT - ks[i], out=result)
        outs[i] = rows[:, : tokens.shape[0]].T.reshape(*x.shape[:-1], ws[i].shape[0])  # [..., out]
    return outs


# The name the kernels call: the tiled products, or their readable version while a learner's
# `decode` or `dequantize` is swapped in (they never call those functions themselves).
products = bypasses(fp8.decode, fp8.dequantize, readable=products_via_dequantize)(tiled_products)


def dequantize_via_reference(w: Fp8Matrix, out: np.ndarray | None = None) -> np.ndarray:
    """An FP8 weight as float32 through `fp8.dequantize`, whichever function that name runs now;
    into `out` if given.  -> [out, in]"""
    weight = w.dequantize()
    if out is None:
        return weight
    if np.shape(weight) != w.shape:
        raise StepperError(f"dequantize gave shape {list(np.shape(weight))} for '{w.name}', expected {list(w.shape)}")
    np.copyto(out, weight)
    return out


@bypasses(fp8.decode, fp8.dequantize, readable=dequantize_via_reference)
def dequantize_rows(w: Fp8Matrix, out: np.ndarray | None = None) -> np.ndarray:
    """The float32 weight, equal bit for bit to `w.dequantize()` (fp8.dequantize), decoded one block of
    rows at a time with the bit trick: each value d * 2^-120 times s * 2^120 is the exact d * s,
    rounded once, as dequantize rounds it; into `out` if given.  -> [out, in]"""
    if not float(np.abs(w.scale_inv).max(initial=0)) < 2.0 ** (127 - REBIAS_EXPONENT):  # s * 2^120 would overflow
        if out is None:
            return w.dequantize()
        np.copyto(out, w.dequantize())
        return out
    out = np.empty(w.shape, np.float32) if out is None else out
    scales = column_scales(w, REBIAS_EXPONENT)
    nan_check = NanCheck(w)
    for r, start, end in row_tiles(w):
        block = out[start:end]
        nan_check.decode(w.codes[start:end], block)
        np.multiply(block, scales[r], out=block)
    nan_check.done()
    return out


def ready_columns(tokens: np.ndarray) -> np.ndarray:
    """The tokens as tiled_products multiplies them: as they are where the BLAS is faster so
    (gemm.unpadded), else padded_to_columns.  [N, in] -> [N', in] (padded_columns)"""
    return tokens if gemm.unpadded(*tokens.shape) else padded_to_columns(tokens)


def padded_to_columns(tokens: np.ndarray) -> np.ndarray:
    """Several tokens padded with zero rows to a multiple of GEMM_COLUMNS.  [N, in] -> [N', in]

    OpenBLAS multiplies 8 columns at a time, so 8 tokens take less time than 5 (times in
    docs/design-notes.md). One token stays one (a matrix-vector product)."""
    n = tokens.shape[0]
    if whole_columns(n) == n:
        return tokens
    padded = np.zeros((whole_columns(n), tokens.shape[1]), dtype=np.float32)
    padded[:n] = tokens
    return padded


def whole_columns(n: int) -> int:
    """n tokens as padded_to_columns pads them: one stays one, more to a multiple of GEMM_COLUMNS."""
    return n if n <= 1 else -(-n // GEMM_COLUMNS) * GEMM_COLUMNS


def padded_columns(n: int, inputs: int) -> int:
    """The columns tiled_products multiplies for n tokens of `inputs` inputs: as they are where the
    BLAS is faster so (gemm.unpadded), else whole_columns(n)."""
    return n if gemm.unpadded(n, inputs) else whole_columns(n)


def input_magnitude(tokens: np.ndarray) -> float:
    """The largest |x| (NaN if any x is), without an |x| array."""
    return max(float(tokens.max(initial=0)), -float(tokens.min(initial=0)))


def input_rebias(tokens: np.ndarray, w: Fp8Matrix, x_max: float | None = None) -> int | None:
    """k making the largest |x * s * 2^k| about 2^64; None if there is no safe k. (x_max: the
    inputs' input_magnitude, when already known.)"""
    x_max = input_magnitude(tokens) if x_max is None else x_max
    s_max = float(np.abs(w.scale_inv).max(initial=0))
    largest = x_max * s_max
    if not (math.isfinite(largest) and x_max >= SMALLEST_INPUT and s_max > 0):
        return None
    return SCALED_INPUT_EXPONENT - math.frexp(largest)[1]
