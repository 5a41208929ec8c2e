"""One INT4 weight's tiles decoded and multiplied, in one process: the work that
kernels.int4_matmul does itself, with threads, or shares out with the helper processes of
kernels.fp8_workers. An FP4 weight's bytes lie as INT4's words do, and a few tokens' FP4 products
take these tiles with their own decoder (kernels.fp4_tiles.decode_planes).

A row's packed words hold its groups one after another, four words (32 inputs) a group, and byte
q of word k of group g (a little-endian word) holds inputs 32g + 8k + 2q (its low nibble) and
32g + 8k + 2q + 1 (its high nibble). A tile is decoded in an order where each pass is one long
run: the tile's words are first put word by word ([rows, groups, 4] -> [4, rows, groups], one
move for eight inputs), so its bytes lie as [word k][rows, group g, byte q]. Taking the nibbles
apart is then three whole-array operations on bytes, giving eight planes [nibble, word k], each
[rows, in/8], which the rows' scales (four times each, one per byte) multiply as one operand
(`tiles_order` says which input each place holds). Flipping each nibble's top bit (`^ 0x88`) makes
its four bits, read as a signed number, the nibble minus 8; a nibble in a byte's top four bits
(`& 0xF0` for the high one, `* 16` for the low one) is then, as an int8, 16 (nibble - 8), and the
scales carry the 1/16 (exact for any BF16 or F16 scale, and a float32 one checked). With few tokens the
planes lie one after another and the product is theirs summed; with many, side by side in each
row, for one GEMM (apply_tiles). The inputs are put in the same order once per product; the
product is the same sum in another order.

Each value (nibble - 8) * scale is the stored weight exactly in float32 (int4.groups), so a tile
holds the weight's exact values.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

from stepper import int4
from stepper.kernels import cpu_caches, gemm
from stepper.kernels.fp8_tiles import decode_in_parts, kept_memory, tall_rows
from stepper.seams.swap import bypasses
from stepper.weights.stored import Fp4Matrix, Int4Matrix

Nibbles = Int4Matrix | Fp4Matrix  # weights whose bytes lie alike, so they share these tiles (kernels.fp4_tiles)

TILE_SHARE = 16  # a tile's float32 values take 1/16 of the L2 in bytes (a quarter): its words, nibbles and products
# take room too. A 2 MiB L2: 2^17 values, [32, 7168] or [64, 2048]
FEWEST_TILE_VALUES = 1 << 18  # but no fewer: a tile's dozen NumPy calls cost about 20 us whatever its size, and
# [32, 2048] (2^16) spent a quarter of its decoding there (docs/performance.md, AMD EPYC 2026-12-03)
MOST_TILE_ROWS = 128
MANY_TOKENS = 128  # past this, tiles are taller (BLAS repacks the inputs for every product)
PRODUCT_VALUES = 1 << 21  # a few tokens' tall tile holds at least these float32 values (8 MiB): over [256, 7168]
# the planes' products ran 1.8x faster than over [32, 7168] at 64 and 128 tokens (1.15x with OpenBLAS's Haswell kernels)
DECODED_VALUES = 1 << 20  # at most these decoded at once where whole tiles decode faster (decode_rows)
PART_PRODUCT_TOKENS = 16  # up to this many tokens each part is multiplied as soon as it is decoded, in the cache
# (one token, or in direct blocks): a [2048, 7168] weight by 5 / 16 tokens 0.88x / 0.97x whole tiles' time (Intel)
SHARED_TILES = 16  # a few tokens' tiles of a weight: at least this many, each of at least cached_rows
MKL_ROWS_TOKENS = 24  # with MKL, past this many an INT4 tile's tokens multiply its rows (26-128: 0.90-0.98x planes')


@cache
def tiles_order(in_features: int, group: int) -> np.ndarray:
    """The input at each place of a tile's row: the places are [nibble (low, high), word k of the
    group][group g, byte q of the word] and hold input group*g + 8k + 2q + nibble.  -> [in] int"""
    order = np.arange(in_features).reshape(-1, group // int4.PER_WORD, 4, 2).transpose(3, 1, 0, 2).reshape(-1)
    order.flags.writeable = False
    return order


def split_inputs(tokens: np.ndarray, w: Nibbles) -> np.ndarray:
    """The inputs in the tiles' order (tiles_order).  [N, in] -> [N, in]"""
    return np.take(tokens, tiles_order(w.in_features, w.group), axis=1)


def planes(w: Nibbles) -> int:
    """The planes of a tile: one for each nibble (low, high) of each word of a group (8)."""
    return 2 * (w.group // int4.PER_WORD)


def cached_rows(w: Nibbles) -> int:
    """Rows whose float32 fit the L2's share: as many whole 32s as tile_values() hold, 32 to
    MOST_TILE_ROWS (a narrow weight in taller tiles: fewer NumPy calls for the same values)."""
    return min(MOST_TILE_ROWS, 32 * max(1, tile_values() // (32 * w.in_features)))


def decode_rows(w: Nibbles, height: int) -> int:
    """Rows of a few tokens' tile decoded at once: cached_rows(w), or where whole FP8 blocks decode
    faster than parts (fp8_tiles.decode_in_parts) at most whole_rows(w)."""
    return cached_rows(w) if decode_in_parts() else min(height, whole_rows(w))


def whole_rows(w: Nibbles) -> int:
    """cached_rows(w) as many times as DECODED_VALUES hold, at least once: rows decoded at once where
    whole tiles decode faster (an INT4 [128, 7168] at once ran 1.15x faster than in 32-row parts
    on an AMD EPYC Zen 5)."""
    rows = cached_rows(w)
    return rows * max(1, DECODED_VALUES // (rows * w.in_features))


def tile_values() -> int:
    """Values decoded at once, from the L2 the machine reports (cpu_caches), at least FEWEST_TILE_VALUES."""
    return max(cpu_caches.l2_bytes() // TILE_SHARE, FEWEST_TILE_VALUES)


@dataclass(frozen=True)
class TileMemory:
    """This thread's memory for decoding tiles of one height and width, with its views made once
    (a view to another dtype costs microseconds, and a tile is decoded in tens)."""

    words: np.ndarray  # int32 [words of a group, rows, groups]: the tile's words, word by word
    codes: np.ndarray  # the same bytes, uint8 [words of a group, rows, in/8]
    nibbles: np.ndarray  # uint8 [2, words of a group, rows, in/8]: low nibbles, then high ones
    values: np.ndarray  # the same bytes, int8 [planes, rows, in/8]
    widened: np.ndarray  # uint64 [rows, groups]: each scale's bits, then two copies of them
    pairs: np.ndarray  # uint64 [rows, groups, 2]: two copies of a scale's bits in each
    scales: np.ndarray  # the same bytes, float32 [rows, in/8]: each group's scale once per byte


KEPT_SHAPES = 64  # tile shapes whose memory a thread keeps (a model has a handful)
_memory = threading.local()


def tile_memory(rows: int, w: Nibbles) -> TileMemory:
    """This thread's TileMemory for `rows` rows of w, kept from one tile (and product) to the next."""
    kept = getattr(_memory, "kept", None)
    if kept is None or len(kept) >= KEPT_SHAPES:
        kept = _memory.kept = {}
    key = (rows, w.in_features, w.group)
    if key not in kept:
        per_group, groups, width = w.group // int4.PER_WORD, w.in_features // w.group, w.in_features // 8
        words = np.empty((per_group, rows, groups), np.int32)
        nibbles = np.empty((2, per_group, rows, width), np.uint8)
        pairs = np.empty((rows, groups, 2), np.uint64)
        kept[key] = TileMemory(words, words.view(np.uint8).reshape(per_group, rows, width), nibbles,
                               nibbles.view(np.int8).reshape(2 * per_group, rows, width),
                               np.empty((rows, groups), np.uint64), pairs, pairs.view(np.float32).reshape(rows, width))
    return kept[key]


def decode_tile(w: Int4Matrix, start: int, end: int, out: np.ndarray) -> np.ndarray:
    """Rows [start, end) of the weight as float32, in the tiles' order (tiles_order), into `out`
    [planes, rows, in/8] (a view: the planes one after another, or side by side in each row): every
    value (nibble - 8) * its group's scale."""
    memory = tile_memory(end - start, w)
    put_words(w.packed[start:end], memory)
    np.bitwise_xor(memory.codes, FLIP_TOP_BITS, out=memory.codes)
    nibbles_up(memory)
    np.copyto(out, memory.values)  # 16 (nibble - 8)
    scales = scales_per_byte(w.scales[start:end], memory)
    np.multiply(scales, SIXTEENTH, out=scales)
    if not sixteenths_exact(w.scales[start:end], scales):  # a float32 scale below 2^-122
        np.multiply(out, SIXTEENTH, out=out)
        scales = scales_per_byte(w.scales[start:end], memory)
    np.multiply(out, scales, out=out)  # the same [rows, in/8] for every plane
    return out


def put_words(words: np.ndarray, memory: TileMemory) -> None:
    """A tile's words [rows, in/8] into memory.words word by word ([rows, groups, words of a group]
    -> [words of a group, rows, groups]): one move for eight inputs."""
    per_group, rows, groups = memory.words.shape
    np.copyto(memory.words, words.reshape(rows, groups, per_group).transpose(2, 0, 1))


def nibbles_up(memory: TileMemory) -> None:
    """Each byte's two nibbles (memory.codes) into bytes of their own, at the top (memory.nibbles):
    the low nibble times 16 (mod 256), the high one with the low bits cleared."""
    np.multiply(memory.codes, SIXTEEN, out=memory.nibbles[0])
    np.bitwise_and(memory.codes, HIGH_NIBBLE, out=memory.nibbles[1])


FLIP_TOP_BITS = np.uint8(0x88)
SIXTEEN = np.uint8(16)
HIGH_NIBBLE = np.uint8(0xF0)
SIXTEENTH = np.float32(1 / 16)


def sixteenths_exact(scales: np.ndarray, sixteenths: np.ndarray) -> bool:
    """Whether every scale / 16 is exact. It always is for a BF16 scale (its lowest bit is 2^-133 at
    the least, 2^-137 once divided: above float32's 2^-149); a float32 one is looked at.
    [rows, groups], [rows, groups * 4]"""
    if scales.dtype != np.float32:
        return True
    return bool(np.array_equal(sixteenths[:, ::4] * np.float32(16), scales))


TWO_COPIES = np.uint64(0x1_0000_0001)  # b * (2^32 + 1) = b in both halves of 64 bits, for 32-bit b
TWO_WIDENED = np.uint64(0x1_0000_0001 << 16)  # h * (2^48 + 2^16) = h << 16 in both halves, for 16-bit h
TWO_EXPONENTS = np.uint64(0x1_0000_0001 << 23)  # e * (2^55 + 2^23) = e << 23 in both halves, for 8-bit e
SCALE_BITS = {4: (np.uint32, TWO_COPIES), 2: (np.uint16, TWO_WIDENED), 1: (np.uint8, TWO_EXPONENTS)}


def scales_per_byte(scales: np.ndarray, memory: TileMemory, exponent_added: int = 0) -> np.ndarray:
    """Each group scale four times, once for each byte of a word: two copies at once as the 64-bit
    product of its bits and 2^32 + 1, written twice. A BF16 scale's 16 bits are the high half of
    its float32's, so they are widened in the same product (by 2^48 + 2^16); an E8M0 scale's byte
    (FP4's, 1 to 254) is its float32's exponent field, put there the same way (by 2^55 + 2^23),
    `exponent_added` to it first: the tile's scales, never the weight's, become float32. The bits
    are widened to 64 first and multiplied in place (1.35x faster than a product that casts as it
    goes).  float32, BF16 or E8M0 bytes [rows, groups] -> float32 [rows, groups * 4]"""
    bits, times = SCALE_BITS[scales.dtype.itemsize]
    np.copyto(memory.widened, np.ascontiguousarray(scales).view(bits))
    if exponent_added:
        np.add(memory.widened, np.uint64(exponent_added), out=memory.widened)
    np.multiply(memory.widened, times, out=memory.widened)
    np.copyto(memory.pairs[:, :, 0], memory.widened)
    np.copyto(memory.pairs[:, :, 1], memory.widened)
    return memory.scales


# (w, start, end, out [planes, rows, in/8] as decode_tile's)
Decoder = Callable[[Nibbles, int, int, np.ndarray], object]


def row_tiles(w: Nibbles, n: int) -> tuple[tuple[int, int], ...]:
    """[start, end) of each tile for n tokens, tile_height(w, n) rows each."""
    return spans(w.shape[0], tile_height(w, n))


def tile_height(w: Nibbles, n: int) -> int:
    """Rows of a tile for n tokens: where its planes are multiplied in direct blocks (block_rows)
    as many as are decoded at once where whole tiles decode faster (whole_rows), else a tall tile
    (product_rows); either at most a SHARED_TILES-th of the weight (shared from both ends by two
    processes, the first done waits for the other's last tile: 7 tiles ran one token's products
    1.17x slower than 64). With many tokens, cached_rows(w) as many times as TALL_TILE_BYTES of
    float32 hold. Sent to a helper that shares the product (a row's sum must not depend on who
    makes it)."""
    rows = cached_rows(w)
    if n > MANY_TOKENS:
        return tall_rows(rows, w.in_features)
    height = whole_rows(w) if block_rows(w, n) else product_rows(w)
    return min(height, max(rows, w.shape[0] // SHARED_TILES // rows * rows))


def block_rows(w: Nibbles, n: int) -> int:
    """Rows of the blocks of a tile's planes multiplied by n tokens (2 or more) at once, where NumPy's
    OpenBLAS multiplies them directly (gemm.direct_part_rows); else 0, and each plane is multiplied
    whole. At 11 tokens an expert's down_proj ([7168, 2048], planes [rows, 256]) took 9-10 ms in
    [64, 256] blocks against 13 in whole [256, 256] planes (one core, AMD EPYC Zen 4)."""
    return gemm.direct_part_rows(w.in_features // planes(w), n) if gemm.avx512_openblas() else 0


def products_by_parts(n: int, blocks: int) -> bool:
    """Whether a tile's planes are multiplied by n tokens a part at a time, each part as soon as it
    is decoded: where tiles are decoded in parts (decode_in_parts), at most PART_PRODUCT_TOKENS
    tokens, one or in direct blocks of rows (blocks, from block_rows)."""
    return n <= PART_PRODUCT_TOKENS and (n == 1 or blocks > 0) and decode_in_parts()


def rows_product(n: int, w: Nibbles) -> bool:
    """Whether a tile's product by n tokens is one GEMM of its rows [rows, in] (the planes side by
    side in each row): past MANY_TOKENS, or an INT4 weight's past MKL_ROWS_TOKENS where MKL makes
    the products (gemm.mkl_products). FP4's tiles (fp4_tiles) keep their planes, faster for them."""
    return n > MANY_TOKENS or (n > MKL_ROWS_TOKENS and isinstance(w, Int4Matrix) and gemm.mkl_products(w.in_features))


def product_rows(w: Nibbles) -> int:
    """Rows of a few tokens' tall tile: cached_rows(w) as many times as PRODUCT_VALUES hold, at least once."""
    rows = cached_rows(w)
    return rows * max(1, PRODUCT_VALUES // (rows * w.in_features))


@cache
def spans(out_features: int, height: int) -> tuple[tuple[int, int], ...]:
    """[start, end) of each run of `height` rows (the last one shorter), made once per shape: an
    expert's three weights ask for theirs at every product."""
    return tuple((r, min(r + height, out_features)) for r in range(0, out_features, height))


def apply_tiles(split: np.ndarray, w: Nibbles, tiles: Sequence[tuple[int, int]], rows: np.ndarray,
                decode: Decoder | None = None, claim: Callable[[], int | None] | None = None) -> None:
    """Decode and multiply each tile into its rows of `rows` [out, N]; this thread's buffers reused,
    a tile decoded a part at a time (decode_tile: decode_rows, or with many tokens cached_rows) or
    whole (a decoder given).

    With few tokens a tile is held as its planes one after another, each multiplied by its inputs
    (in direct blocks of rows where block_rows gives them) and the products summed (every pass
    over the tile one long run); with a very few, each part as soon as it is decoded, all decoded
    into one part's memory, kept in the L2 (products_by_parts). With many (rows_product), as rows
    [rows, in], the planes side by side, for one GEMM over whole rows (BLAS is slower on short
    ones). With `claim`, only the tiles it hands out are done (by index, until it gives None): a
    product shared from both ends with a helper process (fp8_workers)."""
    n, count, whole = split.shape[0], planes(w), rows_product(split.shape[0], w)
    width = w.in_features // count
    height = max((end - start for start, end in tiles), default=0)
    buffer = kept_memory("int4 tile", height, w.in_features).reshape(-1)
    products = None if whole else kept_memory("int4 products", count * height, n).reshape(-1)
    inputs = split.T if whole else split.reshape(n, count, width).transpose(1, 2, 0)  # [in, N] or [planes, in/8, N]
    step = cached_rows(w) if n > MANY_TOKENS else decode_rows(w, height)
    blocks = 0 if whole else block_rows(w, n)
    by_parts = not whole and decode is None and products_by_parts(n, blocks)
    for i in range(len(tiles)) if claim is None else iter(claim, None):
        start, end = tiles[i]
        tile = buffer[: (end - start) * w.in_features]
        places = tile.reshape(end - start, count, width).transpose(1, 0, 2) if whole else tile.reshape(count, -1, width)
        if decode is None:
            for r in range(0, end - start, step):
                part = (buffer[: min(step, end - start - r) * w.in_features].reshape(count, -1, width) if by_parts
                        else places[:, r : r + step])
                decode_tile(w, start + r, start + r + part.shape[1], part)
                if by_parts:  # while the part is in the cache
                    gemm.planes_matmul(part, inputs, rows[start + r : start + r + part.shape[1]],
                                       blocks or part.shape[1], products)
        else:
            decode(w, start, end, places)
        if whole:
            gemm.matmul(tile.reshape(end - start, -1), inputs, rows[start:end])
        elif not by_parts:
            gemm.planes_matmul(places, inputs, rows[start:end], blocks or end - start, products)


def dequantize_via_reference(w: Int4Matrix, out: np.ndarray | None = None) -> np.ndarray:
    """The float32 weight through `int4.dequantize_int4`, whichever function that name runs now."""
    weight = w.dequantize()
    if out is None:
        return weight
    np.copyto(out, weight)
    return out


@bypasses(int4.dequantize_int4, readable=dequantize_via_reference)
def int4_rows(w: Int4Matrix, out: np.ndarray | None = None) -> np.ndarray:
    """The float32 weight, equal bit for bit to `w.dequantize()` (both are exact), decoded a tile
    of rows at a time with the byte table (int4.unpack) straight into its rows; into `out` if
    given (C-contiguous).  -> [out, in]"""
    out = np.empty(w.shape, np.float32) if out is None else out
    for start, end in spans(w.shape[0], cached_rows(w)):
        tile = out[start:end]
        int4.unpack(w.packed[start:end], tile)
        values = tile.reshape(end - start, -1, w.group)
        np.multiply(values, int4.float32_scales(w.scales[start:end])[:, :, None], out=values)
    return out
