"""FP4 tiles (DeepSeek-V4's routed experts): rows of an FP4 weight decoded into float32 a tile at
a time, and a tile multiplied by the inputs, for the products of kernels.fp4_matmul in this
process and in the helper processes (kernels.fp8_workers).

A tile's bytes are looked up in `fp4.PAIRS` (each byte's two values, low nibble first) straight
into a float32 buffer [rows, in/2, 2], which is the rows' values in input order; each group of 32
is multiplied by its power-of-two scale (exact), and the tile is multiplied by the inputs. The
buffer is this thread's and is kept from one tile (and product) to the next. With many tokens a
tile is taller, decoded a cache-sized block of rows at a time, for fewer, larger GEMMs.
"""

from __future__ import annotations

import numpy as np

from stepper import fp4
from stepper.kernels.fp8_tiles import TALL_TILE_BYTES, kept_memory
from stepper.weights.stored import Fp4Matrix

TILE_VALUES = 1 << 17  # values decoded at once, about: [32, 4096] float32 (0.5 MB) stays in the cache
MANY_TOKENS = 128  # past this, tiles are taller (row_tiles)


def decode_rows(w: Fp4Matrix, start: int, end: int, out: np.ndarray) -> np.ndarray:
    """Rows [start, end) of the weight as float32 into `out` [rows, in] (C-contiguous): every
    value e2m1(code) * its group's scale, exactly as w.dequantize() gives it."""
    rows, in_dim = end - start, w.shape[1]
    # mode="wrap": a byte indexes 256 rows, so no index is out of range, and NumPy's wrapping take skips
    # the bounds check that made the default ("raise") take twice as long
    pairs = out.reshape(rows, in_dim // 2, 2)  # [rows, in/2, 2]: each byte's two values, low nibble first
    np.take(fp4.PAIRS, w.packed[start:end], axis=0, out=pairs, mode="wrap")
    groups = out.reshape(rows, -1, fp4.GROUP)  # [rows, in/32, 32]
    np.multiply(groups, w.scales[start:end, :, None], out=groups)
    return out


def tile_rows(w: Fp4Matrix) -> int:
    """Rows decoded at once: as many as TILE_VALUES hold (at least one)."""
    return max(1, TILE_VALUES // w.shape[1])


def row_tiles(w: Fp4Matrix, many: bool = False, shares: int = 1) -> list[tuple[int, int]]:
    """[start, end) of each tile: tile_rows(w) rows, or with many tokens as many times that as
    TALL_TILE_BYTES of float32 hold (BLAS repacks the inputs for every product, so taller tiles
    run faster), but no taller than a share of the rows among `shares` threads."""
    out_dim, rows = w.shape[0], tile_rows(w)
    height = rows
    if many:
        tall = rows * max(1, TALL_TILE_BYTES // (4 * w.shape[1] * rows))
        height = min(tall, rows * -(-out_dim // (rows * shares)))
    return [(r, min(r + height, out_dim)) for r in range(0, out_dim, height)]


def apply_tiles(tokens_t: np.ndarray, w: Fp4Matrix, tiles: list[tuple[int, int]], rows: np.ndarray) -> None:
    """Decode each tile, tile_rows(w) rows at a time, and multiply it into its rows of `rows`
    [out, N]; tokens_t: the inputs [in, N]."""
    height, step = max((end - start for start, end in tiles), default=0), tile_rows(w)
    buffer = kept_memory("fp4 tile", height, w.shape[1])
    for start, end in tiles:
        tile = buffer[: end - start]  # [rows, in]
        for r in range(0, end - start, step):
            decode_rows(w, start + r, min(start + r + step, end), tile[r : r + step])
        np.matmul(tile, tokens_t, out=rows[start:end])
