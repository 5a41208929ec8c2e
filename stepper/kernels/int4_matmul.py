"""x @ W^T for INT4 weights, decoded a tile of rows at a time inside the product (kernels.int4_tiles),
never held whole in float32; large products are shared out, with the helper processes
(kernels.fp8_workers) when the words are a file's, else with threads.

Only the order of the sums differs from the readable product x @ dequantize(W)^T: the tiles hold
the weight's exact values. The readable path for a learner's `dequantize_int4` takes the same
tiles and the same order, so stepper's own function gives the same bits.
"""

from __future__ import annotations

import numpy as np

from stepper import int4
from stepper.errors import StepperError
from stepper.kernels import int4_tiles, parallel
from stepper.kernels.fp8_matmul import GEMM_COLUMNS, padded_to_columns
from stepper.kernels.fp8_tiles import result_arrays
from stepper.kernels.fp8_workers import int4_bands
from stepper.kernels.int4_tiles import MANY_TOKENS, Decoder, apply_tiles, row_tiles, split_inputs, tiles_order
from stepper.seams.swap import bypasses
from stepper.weights.stored import Int4Matrix

SHARE_WORK = 1 << 22  # weights x tokens below which a product stays on one thread


def tiled_int4_products(x: np.ndarray, ws: list[Int4Matrix], decode: Decoder | None = None) -> list[np.ndarray]:
    """x @ W^T for each of several INT4 weights [out_i, in] of the same input, which is put in
    the tiles' order once (and padded to whole columns of BLAS where the products are packed:
    padded_tokens); each tile decoded by decode(w, start, end, out) (by default decode_tile,
    large products shared with the helper processes, or else between threads).  [..., in] -> [[..., out_i]]"""
    tokens = x.reshape(-1, ws[0].shape[1]).astype(np.float32, copy=False)  # [N, in]
    split = split_inputs(padded_tokens(tokens, ws[0]), ws[0])  # [N', in]
    many = split.shape[0] > MANY_TOKENS
    outs = []
    for w in ws:
        _, rows = result_arrays(w.shape[0], split.shape[0], many)  # rows: [out, N']
        tiles = row_tiles(w, split.shape[0])
        large = w.packed.size * 8 * split.shape[0] >= SHARE_WORK
        if not (large and decode is None and int4_bands(split, w, rows)):
            sharing = parallel.cores() if large and decode is None else 1
            parallel.split(tiles, lambda share, w=w, rows=rows: apply_tiles(split, w, share, rows, decode), sharing)
        outs.append(rows[:, : tokens.shape[0]].T.reshape(*x.shape[:-1], w.shape[0]))  # [..., out]
    return outs


def padded_tokens(tokens: np.ndarray, w: Int4Matrix) -> np.ndarray:
    """The tokens padded to whole columns of BLAS (padded_to_columns) when there are more than a
    column's worth and the planes' products are packed (no int4_tiles.block_rows): 11 tokens as 16
    took 0.73-0.95x the time in packed products, about the same in direct ones.  [N, in] -> [N', in]"""
    n = tokens.shape[0]
    if n > MANY_TOKENS or (n > GEMM_COLUMNS and not int4_tiles.block_rows(w, n)):
        return padded_to_columns(tokens)
    return tokens


def decode_via_dequantize(w: Int4Matrix, start: int, end: int, out: np.ndarray) -> None:
    """Rows [start, end) through `int4.dequantize_int4`, whichever function that name runs now,
    put in the tiles' order: the same values as decode_tile (both exact), so the same products."""
    tile = np.asarray(int4.dequantize_int4(w.packed[start:end], w.scales[start:end], w.in_features, w.group,
                                           name=w.name), np.float32)
    if tile.shape != (end - start, w.in_features):
        raise StepperError(f"dequantize_int4 gave shape {list(tile.shape)} for rows {start}..{end - 1} of '{w.name}', "
                           f"expected {[end - start, w.in_features]}")
    ordered = np.take(tile, tiles_order(w.in_features, w.group), axis=1)  # [rows, in]
    np.copyto(out, ordered.reshape(end - start, out.shape[0], -1).transpose(1, 0, 2))


def int4_products_via_dequantize(x: np.ndarray, ws: list[Int4Matrix]) -> list[np.ndarray]:
    """The same products with each tile through `int4.dequantize_int4` (a learner's, in a lesson):
    the tiles, the order of the inputs and the products are those of `tiled_int4_products`, so
    stepper's own function gives the same bits.  [..., in] -> [[..., out_i]]"""
    return tiled_int4_products(x, ws, decode_via_dequantize)


int4_products = bypasses(int4.dequantize_int4, readable=int4_products_via_dequantize)(tiled_int4_products)



