"""One FP8 weight's tiles decoded with the bit trick and multiplied, in one process: the work
that kernels.fp8_matmul does itself or shares out with the helper processes of kernels.fp8_workers.

A tile's codes are decoded straight into a float32 buffer as their values times 2^-120 (the
bits moved into place, not yet rebiased); the block scales and the powers of two go onto the
inputs or onto the tile (see kernels.fp8_matmul for the arithmetic). NaN codes are looked for
block by block while the codes are in the cache (`NanCheck`).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from functools import cache

import numpy as np

from stepper.kernels import cpu_caches, gemm
from stepper.weights.stored import Fp8Matrix

Decoder = Callable[[np.ndarray, np.ndarray], object]  # (codes [rows, in], out float32 [rows, in]); result unused
# Up to this many tokens a tile's part is multiplied as soon as it is decoded, in the cache; with
# more, the whole tile at once (the shorter products of parts ran slower: 1.3x at 64 tokens), but
# for the few that MKL multiplies dearly (gemm.cached_rest)
PART_PRODUCT_TOKENS = 1
TALL_TILE_BYTES = 1 << 25  # float32 bytes of a tile of several scale blocks, for many tokens
SIGN_EXPONENT_MANTISSA = np.int32(-0x78100000)  # 0x87F00000 as int32: bit 31 and bits 26..20
SCALED_INPUT_EXPONENT = 64  # the largest |x * s * 2^k| is near 2^64; products stay near 2^(64 - 111)


def tall_rows(rows: int, in_dim: int) -> int:
    """A tall tile's rows for many tokens: `rows` (a tile of few tokens) as many times as
    TALL_TILE_BYTES of float32 [rows, in_dim] hold, at least once."""
    return rows * max(1, TALL_TILE_BYTES // (4 * in_dim * rows))


def many_tokens(n: int, w: Fp8Matrix) -> bool:
    """More tokens than a scale block has rows: the scales then go onto the tiles (see apply_tiles)."""
    return n > w.block[0]


def result_arrays(rows: int, n: int, many: bool, flat: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A product's result for `rows` weight rows and n tokens (in `flat` if given), and its
    [rows, N] view that the tiles' products write into.

    For many tokens the result is [N, rows]: each tile's product then writes columns of it, and
    no transpose of [N, rows] is ever made (NumPy's transposes are slow). For few, it is
    [rows, N], the way round OpenBLAS multiplies a tile by 8 or 16 tokens faster."""
    shape = (n, rows) if many else (rows, n)
    result = np.empty(shape, np.float32) if flat is None else flat.reshape(shape)
    return result, (result.T if many else result)


def times_power_of_two(a: np.ndarray, e: int, out: np.ndarray | None = None) -> np.ndarray:
    """a * 2^e, rounded as np.ldexp rounds it: one multiplication when 2^e is a normal float32
    (NumPy's ldexp is many times slower than a multiplication)."""
    if -126 <= e <= 127:
        return np.multiply(a, np.float32(2.0**e), out=out)
    return np.ldexp(a, e, out=out)


def row_tiles(w: Fp8Matrix, blocks: int = 1) -> list[tuple[int, int, int]]:
    """(first scale row, first row, end row) of each tile: `blocks` blocks of scale rows each.

    Tiles are not made smaller than a block: kept in L2, they were no faster."""
    out_dim, block_rows = w.shape[0], w.block[0]
    rows = blocks * block_rows
    return [(r0 // block_rows, r0, min(r0 + rows, out_dim)) for r0 in range(0, out_dim, rows)]


def apply_tiles(tokens: np.ndarray, w: Fp8Matrix, k: int, rows: np.ndarray, decode: Decoder | None = None,
                claim: Callable[[], int | None] | None = None, nan_check: NanCheck | None = None) -> None:
    """Decode and multiply each tile into its rows of `rows` [out, N] (times 2^(k - 120)), one buffer reused.

    With fewer tokens than a scale block has rows, a tile is one block and its scales go onto the
    inputs. With more, they go onto the tiles (one pass over each), the inputs are scaled once,
    and a tile is several blocks high: BLAS repacks the inputs for every product, so taller tiles
    run faster (docs/design-notes.md). A tile is decoded in parts of at most a block whose float32
    fit in half the L2 read from the machine (cpu_caches), so that each pass runs in the cache: a
    block [128, 7168] (3.5 MiB) does not fit a 2 MiB L2. One token, and with MKL a few more
    (tokens_in_cache), are multiplied by each part as soon as it is decoded (with no others, all
    parts decoded into one part's memory, kept in the L2); the others by the whole tile. Where
    OpenBLAS multiplies small products directly, a few tokens' tile is multiplied in such parts
    (gemm.direct_parts).

    With `claim`, only the tiles it hands out are done (by index, until it gives None), and with
    `nan_check` the caller puts together and remembers what was found (fp8_workers shares a
    product's tiles with a helper that way)."""
    remember = nan_check is None
    nan_check = nan_check or NanCheck(w, decode)
    block_rows, in_dim = w.block[0], w.shape[1]
    many = many_tokens(tokens.shape[0], w)
    tiles = row_tiles(w, tall_rows(block_rows, in_dim) // block_rows if many else 1)
    buffer = kept_memory("tiles", max((end - start for _, start, end in tiles), default=0), in_dim)
    if many:
        c = SCALED_INPUT_EXPONENT - math.frexp(float(np.abs(w.scale_inv).max(initial=0)))[1]
        # [in, N]: with the tiles' 2^c, still 2^k in all
        inputs = times_power_of_two(tokens, k - c, out=kept_memory("inputs", *tokens.shape)).T
        scales = column_scales(w, c)
    else:
        scales, scaled = column_scales(w, k), np.empty(tokens.shape, np.float32)
    step = part_rows(block_rows, in_dim)
    n = tokens.shape[0]
    rest = 0 if many else tokens_in_cache(n, block_rows, in_dim)
    head = n - rest  # tokens multiplied with the whole tile; the rest part by part, in the cache
    direct = None if many else gemm.direct_parts(in_dim, n)  # the tile's product in direct parts
    for i in range(len(tiles)) if claim is None else iter(claim, None):
        r, start, end = tiles[i]
        tile = buffer[: end - start]
        if not many:
            inputs = np.multiply(tokens, scales[r], out=scaled).T  # [in, N]
        for b0, b1 in in_steps(end - start, block_rows, step):
            part = tile[b0:b1] if head or many else buffer[: b1 - b0]  # [<= step, in]; else one part's, in the L2
            nan_check.decode(w.codes[start + b0 : start + b1], part)
            if many:
                np.multiply(part, scales[r + b0 // block_rows], out=part)
            elif rest:
                multiply_in_cache(part, inputs[:, head:], rows[start + b0 : start + b1, head:])
        if head:
            multiply_tile(tile, inputs[:, :head], rows[start:end, :head], direct)
    if remember:
        nan_check.done()


def tokens_in_cache(n: int, block_rows: int, in_dim: int) -> int:
    """How many of a few tokens' n (the last ones) each part of a tile multiplies as it is decoded: one,
    or with MKL the 1-4 past a multiple of 16 and, where parts are smaller than a block, all of up to
    gemm.FEW_CACHED (cached_rest; a [128, 2048] block by 7-12 ran 1.06-1.45x slower); the others the tile."""
    rest = n if n <= PART_PRODUCT_TOKENS else gemm.cached_rest(n, in_dim)
    return rest if n % 16 in gemm.CHEAP_REMAINDERS or part_rows(block_rows, in_dim) < block_rows else 0


def multiply_tile(tile: np.ndarray, inputs: np.ndarray, out: np.ndarray, direct: tuple[int, int] | None) -> None:
    """out = tile @ inputs, in the direct parts gemm.direct_parts gave, if any, else as one product.
    [rows, in] x [in, N] -> [rows, N]"""
    if direct is None:
        gemm.matmul(tile, inputs, out)
    else:
        scratch = kept_memory("tile parts", tile.shape[0] * inputs.shape[1], tile.shape[1] // direct[1])
        gemm.parts_matmul(tile, inputs, out, direct, scratch.reshape(-1))


def multiply_in_cache(part: np.ndarray, inputs: np.ndarray, out: np.ndarray) -> None:
    """out = part @ inputs for a part of a tile just decoded, while it is in the cache: one
    token's as one matrix-vector product, a few tokens' in blocks of rows that OpenBLAS multiplies
    directly (gemm.most_direct_rows).  [rows, in] x [in, r] -> [rows, r]"""
    step = part.shape[0]
    if inputs.shape[1] > 1:
        step = 1 << (max(gemm.most_direct_rows(part.shape[1], inputs.shape[1]), 1).bit_length() - 1)
    for r0 in range(0, part.shape[0], step):
        np.matmul(part[r0 : r0 + step], inputs, out=out[r0 : r0 + step])


def part_rows(block_rows: int, in_dim: int) -> int:
    """Rows of a tile decoded (and, for the tokens of tokens_in_cache, multiplied) at once: those whose float32 fit
    half the L2 (cpu_caches), where that runs faster on this machine (decode_in_parts); else a
    whole block of scale rows."""
    rows = min(block_rows, cpu_caches.rows_in_cache(4 * in_dim))
    return rows if rows < block_rows and decode_in_parts() else block_rows


PROBE_BLOCK = (128, 7168)  # a block of Kimi K2's scale rows [128, hidden]: 3.5 MiB in float32
PROBE_ROUNDS = 5
PARTS_GAIN = 0.9  # parts are taken when they take at most this share of a whole block's time


@cache
def decode_in_parts() -> bool:
    """Whether a block decoded and multiplied by one token in parts that fit half the L2 runs
    faster than the whole block at once, on this machine: measured once per process on a
    synthetic PROBE_BLOCK, whole and in parts in turn, the least of PROBE_ROUNDS each (about
    25 ms). Both ways decode the same values (a one-token product may differ in its last bits
    where kernels.gemm sends a whole block to another BLAS). Their speed is the CPU's: on an Intel
    Xeon whose L3 is slow, parts ran 1.5-2.2x faster, and on an AMD EPYC (Zen 4) whole blocks ran
    1.1-1.4x faster (docs/performance.md)."""
    rows, width = PROBE_BLOCK
    step = cpu_caches.rows_in_cache(4 * width)
    if step >= rows:
        return False
    codes = probe_codes(rows, width)
    tile, x, y = np.empty((rows, width), np.float32), np.ones((width, 1), np.float32), np.empty((rows, 1), np.float32)

    def seconds(size: int) -> float:
        start = time.perf_counter()
        for b0 in range(0, rows, size):
            decode_nan_free(codes[b0 : b0 + size], tile[b0 : b0 + size])
            np.matmul(tile[b0 : b0 + size], x, out=y[b0 : b0 + size])
        return time.perf_counter() - start

    rounds = [(seconds(rows), seconds(step)) for _ in range(PROBE_ROUNDS)]
    return prefer_parts(min(whole for whole, _ in rounds), min(parts for _, parts in rounds))


SMALLEST_NORMAL_CODE = 0x08  # e4m3 0 0001 000: 2^-6; the codes below are subnormal (and 0)


def probe_codes(rows: int, width: int) -> np.ndarray:
    """Random e4m3 codes [rows, width] as a checkpoint's weights hold them: normal values, no NaN. Their
    decoded tile then holds no float32 subnormals (an e4m3 subnormal times 2^-120 is one), which an
    Intel CPU multiplies many times slower: random codes of every kind (6% subnormal) made
    its product 12x slower and the probe chose whole blocks where parts ran 1.4x faster."""
    return np.random.default_rng(0).integers(SMALLEST_NORMAL_CODE, 0x7F, (rows, width), dtype=np.uint8)


def prefer_parts(whole: float, parts: float) -> bool:
    """Parts, when they take at most PARTS_GAIN of the whole block's time (a tie keeps whole blocks:
    fewer NumPy calls)."""
    return parts <= PARTS_GAIN * whole


def in_steps(rows: int, block_rows: int, step: int) -> list[tuple[int, int]]:
    """[start, end) of each part of a tile of `rows` rows: at most `step` rows, never crossing a
    block of block_rows (a part has one scale row)."""
    return [(b0, min(b0 + step, block, rows)) for block in range(block_rows, rows + block_rows, block_rows)
            for b0 in range(block - block_rows, min(block, rows), step)]


_buffers = threading.local()


def kept_memory(use: str, rows: int, columns: int) -> np.ndarray:
    """Float32 memory [rows, columns] for one use (the tiles, the scaled inputs), this thread's,
    kept from one product to the next: fresh memory for each product costs its page faults
    every time."""
    kept = getattr(_buffers, use, None)
    if kept is None or kept.size < rows * columns:
        kept = np.empty(rows * columns, np.float32)
        setattr(_buffers, use, kept)
    return kept[: rows * columns].reshape(rows, columns)


def column_scales(w: Fp8Matrix, k: int) -> np.ndarray:
    """s[b, j] * 2^k for every scale row b and input j (exact: a power of two), made once per
    product: a row of it scales a tile or its inputs.  -> [out/bo, in]"""
    return np.repeat(times_power_of_two(w.scale_inv, k), w.block[1], axis=1)[:, : w.shape[1]]


def decode_nan_free(codes: np.ndarray, out: np.ndarray) -> None:
    """out = decode(codes) * 2^-120 for codes with no NaN code, in three passes over the tile.
    [rows, in] uint8 -> float32"""
    bits = out.view(np.int32)
    np.copyto(bits, codes.view(np.int8))  # s eeee mmm -> s...s s eeee mmm (sign-extended)
    np.left_shift(bits, 20, out=bits)
    np.bitwise_and(bits, SIGN_EXPONENT_MANTISSA, out=bits)  # s 0000 eeee mmm 0...0


def decode_unbiased(codes: np.ndarray, out: np.ndarray) -> bool:
    """out = decode(codes) * 2^-120.  [rows, in] uint8 -> float32

    NaN codes (0x7F, 0xFF), which the bit trick turns into 480 * 2^-120, are made NaN.
    Returns whether there were any."""
    decode_nan_free(codes, out)
    if not nan_codes_in(codes):
        return False
    out[(codes & 0x7F) == 0x7F] = np.nan
    return True


def nan_codes_in(codes: np.ndarray) -> bool:
    """Whether any code is 0x7F or 0xFF (e4m3's two NaNs): two quick reductions."""
    return bool(codes.max(initial=0) == 0xFF or codes.view(np.int8).max(initial=0) == 0x7F)


NAN_FREE_KEPT = 1 << 16  # entries remembered: a 61-layer model has about 70,000 weight matrices
_nan_free: dict[tuple, None] = {}  # (FileBytes, shape) of a file's codes found without a NaN code


class NanCheck:
    """Decodes a weight's blocks with the bit trick, and looks for NaN codes in each block just
    after decoding it, while its codes are still in the cache (a pass of its own would read
    every code from memory once more).

    Codes read from a file are looked at once: a weight found without NaN codes is remembered
    by file range (`origin`), as the same weights recur at every decode step. A decoder of one's
    own (`decode`) is used as it is, unchecked: it gives the NaNs itself."""

    def __init__(self, w: Fp8Matrix, decode: Decoder | None = None, checking: bool | None = None):
        self.key = w.file_key
        self.checking = (decode is None and self.key not in _nan_free) if checking is None else checking
        self.decode_block = decode or (decode_unbiased if self.checking else decode_nan_free)
        self.found = False

    def decode(self, codes: np.ndarray, out: np.ndarray) -> None:
        """out = decode(codes) * 2^-120.  [rows, in] uint8 -> float32"""
        found = self.decode_block(codes, out)
        if self.checking:  # decode_unbiased's answer; a decoder of one's own returns what it likes
            self.found |= found

    def done(self) -> None:
        """Every block decoded: remember a file range found without NaN codes."""
        if self.checking and not self.found and self.key is not None:
            if len(_nan_free) >= NAN_FREE_KEPT:
                _nan_free.clear()
            _nan_free[self.key] = None
