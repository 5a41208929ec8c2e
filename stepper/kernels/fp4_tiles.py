"""One FP4 weight's tiles (DeepSeek-V4's routed experts) decoded and multiplied, in one process:
the work kernels.fp4_matmul does itself, with threads, or shares out with the helper processes of
kernels.fp8_workers.

A tile's bytes are looked up in `fp4.PAIRS` (each byte's two values, low nibble first) straight
into a float32 buffer [rows, in/2, 2], which is the rows' values in input order; each group of 32
is multiplied by its power-of-two scale (exact), and the tile is multiplied by the inputs. The
buffer is this thread's and is kept from one tile (and product) to the next. With many tokens a
tile is taller, decoded a cache-sized block of rows at a time, for fewer, larger GEMMs, and the
result is laid out [N, out] (fp8_tiles.result_arrays). With a few, a tile is as tall as the BLAS
multiplies directly (gemm.direct_limit), else taller, multiplied in parts the BLAS makes directly
(gemm.direct_parts) or, where it has none, its tokens padded to whole columns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from stepper import fp4
from stepper.kernels import gemm
from stepper.kernels.fp8_tiles import kept_memory, multiply_tile, tall_rows
from stepper.weights.stored import Fp4Matrix

TILE_VALUES = 1 << 17  # values decoded at once, about: [32, 4096] float32 (0.5 MB) stays in the cache
FEW_TILE_VALUES = 1 << 20  # a few tokens' tile (packed or in parts), about [256, 4096], decoded TILE_VALUES at a time
MANY_TOKENS = 128  # past this, tiles are taller (row_tiles)
# past this, a tile's parts of 16 rows were as slow as the whole tile packed, or slower: 1.00-1.14x at 56 and 61
# tokens, 0.91-1.01x at 40 and 48, 0.78-0.99x at 8-32 (V4-Flash's w1 and w2, one core of an AMD EPYC Zen 4)
PARTS_MOST_TOKENS = 48


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


def row_tiles(w: Fp4Matrix, tokens: int = 0, shares: int = 1) -> list[tuple[int, int]]:
    """[start, end) of each tile of a product with `tokens` tokens (tile_height), or of decoding
    alone (0) or a matrix-vector product (1, multiplied while the cache holds it): tile_rows(w) rows."""
    height = tile_height(w, tokens, shares) if tokens > 1 else tile_rows(w)
    return [(r, min(r + height, w.shape[0])) for r in range(0, w.shape[0], height)]


def tile_height(w: Fp4Matrix, tokens: int, shares: int = 1) -> int:
    """Rows of a tile (decoded tile_rows(w) at a time): with a few tokens as many as the BLAS
    multiplies directly (gemm.direct_rows), else as FEW_TILE_VALUES hold (at 11 tokens, padded to
    16, [256, 4096] tiles ran 1.38x faster than [32, 4096] ones); with many, as TALL_TILE_BYTES of
    float32 hold (BLAS repacks the inputs for every product), but at most a share of the rows
    among `shares` threads."""
    rows, (out_dim, in_dim) = tile_rows(w), w.shape
    if tokens > MANY_TOKENS:
        return min(tall_rows(rows, in_dim), rows * -(-out_dim // (rows * shares)))
    few = rows * max(1, FEW_TILE_VALUES // (rows * in_dim))
    return min(gemm.direct_rows(rows, in_dim, tokens), few) or few


def direct_parts(w: Fp4Matrix, tokens: int) -> tuple[int, int] | None:
    """The parts (gemm.direct_parts) in which a tile by `tokens` columns is multiplied, where a
    few tokens (up to PARTS_MOST_TOKENS) are too many for the whole tile to be multiplied
    directly; else None. One V4-Flash w1 [2048, 4096] on one core: 9.0 ms against 10.5 packed
    (padded to 16) at 11 tokens, 9.9 against 12.2 at 17 (AMD EPYC Zen 4, docs/performance.md)."""
    in_dim = w.shape[1]
    if tokens > PARTS_MOST_TOKENS or gemm.direct_rows(tile_rows(w), in_dim, tokens):
        return None
    return gemm.direct_parts(in_dim, tokens)


def apply_tiles(tokens_t: np.ndarray, w: Fp4Matrix, tiles: Sequence[tuple[int, int]], rows: np.ndarray,
                claim: Callable[[], int | None] | None = None) -> None:
    """Decode each tile, tile_rows(w) rows at a time, and multiply it into its rows of `rows`
    [out, N]; tokens_t: the inputs [in, N]. With `claim`, only the tiles it hands out are done (by
    index, until it gives None): a product shared from both ends with a helper process (fp8_workers)."""
    height, step = max((end - start for start, end in tiles), default=0), tile_rows(w)
    buffer = kept_memory("fp4 tile", height, w.shape[1])
    parts = direct_parts(w, tokens_t.shape[1])
    for i in range(len(tiles)) if claim is None else iter(claim, None):
        start, end = tiles[i]
        tile = buffer[: end - start]  # [rows, in]
        for r in range(0, end - start, step):
            decode_rows(w, start + r, min(start + r + step, end), tile[r : r + step])
        multiply_tile(tile, tokens_t, rows[start:end], parts)
