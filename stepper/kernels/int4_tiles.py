"""One INT4 weight's tiles decoded and multiplied, in one process: the work that
kernels.int4_matmul does itself, with threads, or shares out with the helper processes of
kernels.fp8_workers.

A tile is decoded in the order the packed bytes hold it: byte b of a row (in a little-endian
word) holds inputs 2b (its low nibble) and 2b + 1 (its high nibble), so the tile's first half
is the low nibbles of every byte, its second half the high ones: inputs 0, 2, 4, ... then 1, 3,
5, ... Taking a byte's nibbles apart is then two whole-array operations on bytes (`& 0xF`,
`>> 4`) with no interleaving; the inputs are put in the same order once per product, and the
product is the same sum in another order. Both halves of a row use its scales in the same
pattern, one scale for each 16 bytes (32 inputs), made once per tile.

Each value (nibble - 8) * scale is the stored weight exactly in float32 (int4.groups), so a tile
holds the weight's exact values.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from stepper import int4
from stepper.kernels.fp8_tiles import TALL_TILE_BYTES, kept_memory
from stepper.swap import bypasses
from stepper.weights.stored import Int4Matrix

TILE_ROWS = 32  # rows decoded at once: [32, 7168] float32 (0.9 MB) keeps its passes in the cache
MANY_TOKENS = 128  # past this, tiles are taller (BLAS repacks the inputs for every product)


def split_inputs(tokens: np.ndarray) -> np.ndarray:
    """The inputs in the tiles' order, even inputs then odd.  [N, in] -> [N, in]"""
    return np.concatenate((tokens[:, 0::2], tokens[:, 1::2]), axis=1)


def decode_tile(w: Int4Matrix, start: int, end: int, out: np.ndarray) -> np.ndarray:
    """Rows [start, end) of the weight as float32, in the tiles' order, into `out` [rows, in]."""
    rows, width = end - start, w.in_features // 2  # each half: one value per byte
    codes = w.packed[start:end].view(np.uint8)  # [rows, in / 2]: byte b = inputs 2b, 2b + 1
    nibbles = kept_memory("int4 nibbles", rows, width // 4).view(np.uint8)  # [rows, width] bytes
    for half, take in ((out[:, :width], np.bitwise_and), (out[:, width:], np.right_shift)):
        take(codes, 0xF if take is np.bitwise_and else 4, out=nibbles)  # low nibbles, then high ones: 0..15
        np.subtract(nibbles, int4.OFFSET, out=nibbles)  # mod 256: as int8, -8..7
        np.copyto(half, nibbles.view(np.int8))
    scales = kept_memory("int4 scales", rows, width)  # each group's scale over its group / 2 bytes
    np.copyto(scales.reshape(rows, -1, w.group // 2), w.scales[start:end, :, None])
    np.multiply(out.reshape(rows, 2, width), scales[:, None, :], out=out.reshape(rows, 2, width))
    return out


Decoder = Callable[[Int4Matrix, int, int, np.ndarray], object]  # (w, start, end, out [rows, in] in the tiles' order)


def row_tiles(w: Int4Matrix, width: int, many: bool) -> list[tuple[int, int]]:
    """[start, end) of each tile: TILE_ROWS rows, or with many tokens as many whole TILE_ROWS as
    TALL_TILE_BYTES of float32 hold."""
    height = TILE_ROWS * (max(1, TALL_TILE_BYTES // (4 * width * TILE_ROWS)) if many else 1)
    return [(r, min(r + height, w.shape[0])) for r in range(0, w.shape[0], height)]


def apply_tiles(split: np.ndarray, w: Int4Matrix, tiles: list[tuple[int, int]], rows: np.ndarray,
                decode: Decoder | None = None) -> None:
    """Decode and multiply each tile into its rows of `rows` [out, N]; this thread's buffer reused,
    a tall tile decoded TILE_ROWS rows at a time (decode_tile) or whole (a decoder given)."""
    buffer = kept_memory("int4 tile", max((end - start for start, end in tiles), default=0), split.shape[1])
    for start, end in tiles:
        tile = buffer[: end - start]
        if decode is None:
            for r in range(start, end, TILE_ROWS):
                decode_tile(w, r, min(r + TILE_ROWS, end), tile[r - start : r - start + TILE_ROWS])
        else:
            decode(w, start, end, tile)
        np.matmul(tile, split.T, out=rows[start:end])


def dequantize_via_reference(w: Int4Matrix, out: np.ndarray | None = None) -> np.ndarray:
    """The float32 weight through `int4.dequantize_int4`, whichever function that name runs now."""
    weight = w.dequantize()
    if out is None:
        return weight
    np.copyto(out, weight)
    return out


@bypasses("dequantize_int4", readable=dequantize_via_reference)
def int4_rows(w: Int4Matrix, out: np.ndarray | None = None) -> np.ndarray:
    """The float32 weight, equal bit for bit to `w.dequantize()` (both are exact), decoded a tile
    of rows at a time with the byte table (int4.unpack) straight into its rows; into `out` if
    given (C-contiguous).  -> [out, in]"""
    out = np.empty(w.shape, np.float32) if out is None else out
    for start in range(0, w.shape[0], TILE_ROWS):
        end = min(start + TILE_ROWS, w.shape[0])
        tile = out[start:end]
        int4.unpack(w.packed[start:end], tile)
        values = tile.reshape(end - start, -1, w.group)
        np.multiply(values, w.scales[start:end, :, None], out=values)
    return out
