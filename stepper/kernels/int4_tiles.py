"""One INT4 weight's tiles decoded and multiplied, in one process: the work that
kernels.int4_matmul does itself, with threads, or shares out with the helper processes of
kernels.fp8_workers.

A row's packed words hold its groups one after another, four words (32 inputs) a group, and byte
q of word k of group g (a little-endian word) holds inputs 32g + 8k + 2q (its low nibble) and
32g + 8k + 2q + 1 (its high nibble). A tile is decoded in an order where each pass is one long
run: the tile's words are first put word by word ([rows, groups, 4] -> [4, rows, groups], one
move for eight inputs), so its bytes lie as [word k][rows, group g, byte q]; taking the nibbles
apart is then two whole-array operations on bytes (`& 0xF`, `>> 4`), giving eight planes
[nibble, word k], each [rows, in/8], which the rows' scales (four times each, one per byte)
multiply as one operand, and the product is the eight planes' products summed (`tiles_order`
says which input each place holds). The inputs are put in the same order once per product; the
product is the same sum in another order.

Each value (nibble - 8) * scale is the stored weight exactly in float32 (int4.groups), so a tile
holds the weight's exact values.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import numpy as np

from stepper import int4
from stepper.kernels.fp8_tiles import TALL_TILE_BYTES, kept_memory
from stepper.swap import bypasses
from stepper.weights.stored import Int4Matrix

TILE_VALUES = 1 << 18  # values decoded at once, about: [32, 7168] or [128, 2048] float32, 1 MB, kept in the cache
MOST_TILE_ROWS = 128
MANY_TOKENS = 128  # past this, tiles are taller (BLAS repacks the inputs for every product)


@cache
def tiles_order(in_features: int, group: int) -> np.ndarray:
    """The input at each place of a tile's row: the places are [nibble (low, high), word k of the
    group][group g, byte q of the word] and hold input group*g + 8k + 2q + nibble.  -> [in] int"""
    order = np.arange(in_features).reshape(-1, group // int4.PER_WORD, 4, 2).transpose(3, 1, 0, 2).reshape(-1)
    order.flags.writeable = False
    return order


def split_inputs(tokens: np.ndarray, w: Int4Matrix) -> np.ndarray:
    """The inputs in the tiles' order (tiles_order).  [N, in] -> [N, in]"""
    return np.take(tokens, tiles_order(w.in_features, w.group), axis=1)


def planes(w: Int4Matrix) -> int:
    """The planes of a tile: one for each nibble (low, high) of each word of a group (8)."""
    return 2 * (w.group // int4.PER_WORD)


def tile_rows(w: Int4Matrix) -> int:
    """Rows decoded at once: as many whole 32s as TILE_VALUES hold, 32 to MOST_TILE_ROWS (a
    narrow weight in taller tiles: fewer NumPy calls for the same values)."""
    return min(MOST_TILE_ROWS, 32 * max(1, TILE_VALUES // (32 * w.in_features)))


def decode_tile(w: Int4Matrix, start: int, end: int, out: np.ndarray) -> np.ndarray:
    """Rows [start, end) of the weight as float32, in the tiles' order (tiles_order), into `out`
    [planes, rows, in/8] (each plane's rows contiguous): every value (nibble - 8) * its group's scale."""
    rows, groups, per_group = end - start, w.in_features // w.group, w.group // int4.PER_WORD
    words = kept_memory("int4 words", rows, w.in_features // int4.PER_WORD).view(np.int32)
    words = words.reshape(per_group, rows, groups)
    np.copyto(words, w.packed[start:end].reshape(rows, groups, per_group).transpose(2, 0, 1))
    codes = words.view(np.uint8).reshape(per_group, rows, groups * 4)  # [word k][row, (group g, byte q)]
    nibbles = kept_memory("int4 nibbles", rows, w.in_features // 4).view(np.uint8).reshape(2, *codes.shape)
    np.bitwise_and(codes, 0xF, out=nibbles[0])  # 0..15
    np.right_shift(codes, 4, out=nibbles[1])
    np.subtract(nibbles, int4.OFFSET, out=nibbles)  # mod 256: as int8, -8..7
    np.copyto(out, nibbles.view(np.int8).reshape(out.shape))
    np.multiply(out, scales_per_byte(w.scales[start:end]), out=out)  # the same [rows, in/8] scales for every plane
    return out


TWO_COPIES = np.uint64(0x1_0000_0001)  # b * (2^32 + 1) = b in both halves of 64 bits, for 32-bit b


def scales_per_byte(scales: np.ndarray) -> np.ndarray:
    """Each group scale four times, once for each byte of a word: two copies at once as the 64-bit
    product of its bits and 2^32 + 1, written twice.  float32 [rows, groups] -> [rows, groups * 4]"""
    rows, groups = scales.shape
    pairs = kept_memory("int4 scales", rows, groups * 4).view(np.uint64).reshape(rows, groups, 2)
    np.multiply(np.ascontiguousarray(scales).view(np.uint32), TWO_COPIES, out=pairs[:, :, 0], dtype=np.uint64)
    np.copyto(pairs[:, :, 1], pairs[:, :, 0])
    return pairs.view(np.float32).reshape(rows, groups * 4)


Decoder = Callable[[Int4Matrix, int, int, np.ndarray], object]  # (w, start, end, out [planes, rows, in/8], as decode_tile)


def row_tiles(w: Int4Matrix, many: bool) -> list[tuple[int, int]]:
    """[start, end) of each tile: tile_rows(w) rows, or with many tokens as many times that as
    TALL_TILE_BYTES of float32 hold."""
    rows = tile_rows(w)
    height = rows * (max(1, TALL_TILE_BYTES // (4 * w.in_features * rows)) if many else 1)
    return [(r, min(r + height, w.shape[0])) for r in range(0, w.shape[0], height)]


def apply_tiles(split: np.ndarray, w: Int4Matrix, tiles: list[tuple[int, int]], rows: np.ndarray,
                decode: Decoder | None = None, claim: Callable[[], int | None] | None = None) -> None:
    """Decode and multiply each tile into its rows of `rows` [out, N]: each plane times its inputs,
    the planes' products summed. This thread's buffers reused; a tall tile decoded tile_rows(w)
    rows at a time (decode_tile) or whole (a decoder given).

    With `claim`, only the tiles it hands out are done (by index, until it gives None): a product
    shared from both ends with a helper process (fp8_workers)."""
    n, count, width = split.shape[0], planes(w), w.in_features // planes(w)
    inputs = split.reshape(n, count, width).transpose(1, 2, 0)  # [planes, in/8, N]
    height = max((end - start for start, end in tiles), default=0)
    buffer = kept_memory("int4 tile", count * height, width).reshape(count, height, width)
    products = kept_memory("int4 products", count * height, n).reshape(count, height, n)
    step = tile_rows(w)
    for i in range(len(tiles)) if claim is None else iter(claim, None):
        start, end = tiles[i]
        tile = buffer[:, : end - start]
        if decode is None:
            for r in range(start, end, step):
                decode_tile(w, r, min(r + step, end), tile[:, r - start : r - start + step])
        else:
            decode(w, start, end, tile)
        np.matmul(tile, inputs, out=products[:, : end - start])
        np.sum(products[:, : end - start], axis=0, out=rows[start:end])


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
    for start, end in row_tiles(w, False):
        tile = out[start:end]
        int4.unpack(w.packed[start:end], tile)
        values = tile.reshape(end - start, -1, w.group)
        np.multiply(values, w.scales[start:end, :, None], out=values)
    return out
