"""x @ W^T for FP4 weights (DeepSeek-V4's routed experts), decoded a tile of rows at a time inside
the product (kernels.fp4_tiles), never held whole in float32.

Reference: `Fp4Matrix.dequantize` (e2m1 values times their group's scale, the whole weight) and a
plain matmul; tests/unit/test_fp4_matmul.py checks the two agree, and that the decoded rows are
the reference's bit for bit. With many tokens the result is laid out [N, out]
(fp8_tiles.result_arrays). Large products are shared out by tiles across the cores: with the helper
processes (kernels.fp8_workers) when the bytes are a file's, as FP8 and INT4 products are, else
with threads; either way each tile is decoded and multiplied as here, so the result is the same
bit for bit.
"""

from __future__ import annotations

import numpy as np

from stepper.kernels import parallel
from stepper.kernels.fp4_tiles import MANY_TOKENS, apply_tiles, decode_rows, row_tiles
from stepper.kernels.fp8_tiles import result_arrays
from stepper.kernels.fp8_workers import fp4_bands
from stepper.weights.stored import Fp4Matrix

SHARE_WORK = 1 << 22  # weights x tokens below which a product stays on one thread


def fp4_products(x: np.ndarray, ws: list[Fp4Matrix]) -> list[np.ndarray]:
    """x @ W^T for each of several FP4 weights [out_i, in] of the same input, large ones shared out
    by tiles between the cores (helper processes for a file's bytes, else threads).  [..., in] -> [[..., out_i]]"""
    tokens = x.reshape(-1, ws[0].shape[1]).astype(np.float32, copy=False)  # [N, in]
    tokens_t = np.ascontiguousarray(tokens.T)  # [in, N]
    many = tokens.shape[0] > MANY_TOKENS
    outs = []
    for w in ws:
        _, rows = result_arrays(w.shape[0], tokens.shape[0], many)  # [out, N], a view of [N, out] with many tokens
        sharing = parallel.cores() if w.packed.size * 2 * tokens.shape[0] >= SHARE_WORK else 1
        tiles = row_tiles(w, many, sharing)
        if sharing == 1 or not fp4_bands(tokens_t, w, tiles, rows, many):
            parallel.split(tiles, lambda share, w=w, rows=rows: apply_tiles(tokens_t, w, share, rows), sharing)
        outs.append(rows.T.reshape(*x.shape[:-1], w.shape[0]))  # [..., out]
    return outs


def fp4_rows(w: Fp4Matrix, out: np.ndarray | None = None) -> np.ndarray:
    """The float32 weight, equal bit for bit to `w.dequantize()`, decoded a tile of rows at a time
    into its rows; into `out` if given (C-contiguous).  -> [out, in]"""
    out = np.empty(w.shape, np.float32) if out is None else out
    for start, end in row_tiles(w):
        decode_rows(w, start, end, out[start:end])
    return out

