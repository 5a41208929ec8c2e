"""x @ W^T for FP4 weights (DeepSeek-V4's routed experts), decoded a tile of rows at a time inside
the product (kernels.fp4_tiles), never held whole in float32; large products are shared out, a few
tokens' with the helper processes (kernels.fp8_workers) when the bytes are a file's, else with threads.

Reference: `Fp4Matrix.dequantize` (e2m1 values times their group's scale, the whole weight) and a
plain matmul; tests/unit/test_fp4_matmul.py checks the two agree, and that the decoded rows are
the reference's bit for bit.
"""

from __future__ import annotations

import numpy as np

from stepper import fp4
from stepper.kernels import parallel
from stepper.kernels.fp4_tiles import MANY_TOKENS, PLANES_MOST_TOKENS, apply_tiles, decode_rows, row_tiles
from stepper.kernels.fp8_matmul import padded_to_columns
from stepper.kernels.fp8_tiles import result_arrays
from stepper.kernels.fp8_workers import fp4_bands
from stepper.kernels.int4_matmul import padded_tokens
from stepper.weights.stored import Fp4Matrix

SHARE_WORK = 1 << 22  # weights x tokens below which a product stays on one thread


def fp4_products(x: np.ndarray, ws: list[Fp4Matrix]) -> list[np.ndarray]:
    """x @ W^T for each of several FP4 weights [out_i, in] of the same input, large ones shared out:
    a few tokens' with the helper processes (fp8_workers.fp4_bands), else by tiles between threads.
    [..., in] -> [[..., out_i]]"""
    tokens = x.reshape(-1, ws[0].shape[1]).astype(np.float32, copy=False)  # [N, in]
    n = tokens.shape[0]
    many = n > MANY_TOKENS
    padded = tokens if many else padded_inputs(tokens, ws[0])  # [N', in]
    tokens_t = np.ascontiguousarray(padded.T)  # [in, N']
    outs = []
    for w in ws:
        _, rows = result_arrays(w.shape[0], tokens_t.shape[1], many)  # [out, N'], a view of [N', out] with many
        large = w.packed.size * 2 * n >= SHARE_WORK
        if not (large and fp4_bands(padded, tokens_t, w, rows)):
            sharing = parallel.cores() if large else 1
            tiles = row_tiles(w, tokens_t.shape[1], sharing)
            parallel.split(tiles, lambda share, w=w, rows=rows: apply_tiles(tokens_t, w, share, rows), sharing)
        outs.append(rows[:, :n].T.reshape(*x.shape[:-1], w.shape[0]))  # [..., out]
    return outs


def padded_inputs(tokens: np.ndarray, w: Fp4Matrix) -> np.ndarray:
    """A few tokens' inputs as their tiles take them: up to PLANES_MOST_TOKENS as INT4's planes do
    (int4_matmul.padded_tokens), past that padded to whole columns of BLAS for packed products.
    [N, in] -> [N', in]"""
    return padded_tokens(tokens, w) if tokens.shape[0] <= PLANES_MOST_TOKENS else padded_to_columns(tokens)


def fp4_rows(w: Fp4Matrix, out: np.ndarray | None = None) -> np.ndarray:
    """The float32 weight, equal bit for bit to `w.dequantize()`, decoded a tile of rows at a time
    into its rows; into `out` if given (C-contiguous).  -> [out, in]"""
    out = np.empty(w.shape, np.float32) if out is None else out
    scales = fp4.e8m0.decode(w.scales)  # [out, in/32] float32
    for start, end in row_tiles(w):
        decode_rows(w, start, end, out[start:end], scales[start:end])
    return out

