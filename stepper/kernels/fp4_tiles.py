"""One FP4 weight's tiles (DeepSeek-V4's routed experts) decoded and multiplied, in one process:
the work kernels.fp4_matmul does itself, with threads, or shares out with the helper processes of
kernels.fp8_workers.

FP4 bytes lie as INT4 words do: a group's 32 inputs are 16 bytes, four little-endian words, and
byte q of word k holds inputs 8k + 2q (low nibble) and 8k + 2q + 1 (high). So a product of up
to PLANES_MOST_TOKENS tokens takes INT4's tiles (kernels.int4_tiles): the words put word by word,
the nibbles moved to the top of their bytes, eight planes [rows, in/8] each multiplied by its
inputs and the products summed. Only a nibble's value differs: e2m1 (sign, two exponent bits, one mantissa bit) is put
into a float32's bits, the sign at the top and the three others at the exponent's foot, which is
the value times 2^-126 (0.5 a subnormal); the group's power-of-two scale times 2^126 then gives
the value times the scale, exactly as w.dequantize() makes it. Where this CPU multiplies
subnormals slowly (an Intel Xeon's 10x: subnormals_slow), three integer passes first make every
value its e2m1 times 2^-125, none subnormal, and the scales take 2^125 (normalized).

With more tokens a tile is a block of whole rows in the inputs' own order, decoded by looking up
each byte's two values in `fp4.PAIRS` (low nibble first) and multiplying each group of 32 by its
scale, for one GEMM a tile (past MANY_TOKENS taller, the result laid out [N, out]:
fp8_tiles.result_arrays). `decode_rows` also decodes a whole weight (fp4_matmul.fp4_rows).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import cache

import numpy as np

from stepper import fp4
from stepper.kernels import int4_tiles
from stepper.kernels.fp8_tiles import kept_memory, multiply_tile, tall_rows
from stepper.weights.stored import Fp4Matrix

TILE_VALUES = 1 << 17  # values decoded at once, about: [32, 4096] float32 (0.5 MB) stays in the cache
PLANES_MOST_TOKENS = 64  # up to this, tiles are planes; past it, rows in the inputs' order (row_tiles). At 96 and 128
# tokens a V4-Flash w1's planes took about 1.15x the time of [256, 4096] rows (AMD EPYC Zen 4, docs/performance.md)
FEW_TILE_VALUES = 1 << 20  # a tile past PLANES_MOST_TOKENS, about [256, 4096], decoded TILE_VALUES at a time
MANY_TOKENS = 256  # past this, tiles are taller, the result [N, out] (row_tiles). At 129-256 tokens [256, in] rows
# and [out, N] took 0.8-0.95x the time of tall ones (AMD EPYC Zen 4, docs/performance.md); at 300-512, about the same
SIGN_AND_CODE = np.uint32(0x81C0_0000).view(np.int32)  # bit 31, and bits 22-24 (exponent's foot, mantissa's top)
CODE_BITS = np.int32(0x01C0_0000)  # bits 22-24: a nibble's two exponent bits and its mantissa bit, c << 22
TWO_CODES = np.int32(0x0080_0000)  # 2 << 22: one more in the exponent field
UNBIAS_EXPONENT = 126  # a nibble's bits give its value times 2^-126 (normalized: 2^-125)
SUBNORMAL_PENALTY = 3.0  # subnormals multiplied this many times slower than normal values: slow (an Intel Xeon's 9-12x)


def decode_rows(w: Fp4Matrix, start: int, end: int, out: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Rows [start, end) of the weight as float32 into `out` [rows, in] (C-contiguous): every
    value e2m1(code) * its group's scale, exactly as w.dequantize() gives it; `scales`: the rows'
    scales as float32 [rows, in/32] (e8m0.decode of theirs)."""
    rows, in_dim = end - start, w.shape[1]
    # mode="wrap": a byte indexes 256 rows, so no index is out of range, and NumPy's wrapping take skips
    # the bounds check that made the default ("raise") take twice as long
    pairs = out.reshape(rows, in_dim // 2, 2)  # [rows, in/2, 2]: each byte's two values, low nibble first
    np.take(fp4.PAIRS, w.packed[start:end], axis=0, out=pairs, mode="wrap")
    groups = out.reshape(rows, -1, fp4.GROUP)  # [rows, in/32, 32]
    np.multiply(groups, scales[:, :, None], out=groups)
    return out


def decode_planes(w: Fp4Matrix, start: int, end: int, places: np.ndarray) -> None:
    """Rows [start, end) as float32 in the planes' order (int4_tiles.tiles_order) into `places`
    [planes, rows, in/8], int4_tiles.decode_rows(w, rows) rows at a time: the values of w.dequantize()."""
    step = int4_tiles.decode_rows(w, end - start)
    for r in range(0, end - start, step):
        plane_part(w, start + r, min(start + r + step, end), places[:, r : r + step])


def plane_part(w: Fp4Matrix, start: int, end: int, out: np.ndarray) -> None:
    """Rows [start, end) into `out` [planes, rows, in/8] (decode_planes), in six passes (nine where
    subnormals are slow: normalized). The scales' bytes are their float32's exponent fields, 2^126
    (2^125) folded in as 126 (125) more (int4_tiles.scales_per_byte), or, where a byte is too large
    for that to stay in float32's range, the values unbiased first; bytes 0x00 (2^-127, a float32
    subnormal) and 0xFF (NaN) are no exponent field, and a tile holding one takes their values from
    the table (e8m0.decode)."""
    memory = int4_tiles.tile_memory(end - start, w)
    int4_tiles.put_words(w.packed[start:end].view(np.int32), memory)  # four little-endian words a group
    int4_tiles.nibbles_up(memory)  # s e e m 0000
    bits = out.view(np.int32)
    np.copyto(bits, memory.values)  # sign-extended: s...s e e m 0000
    np.left_shift(bits, 18, out=bits)
    np.bitwise_and(bits, SIGN_AND_CODE, out=bits)  # s 000000 e e m 0...0: the value times 2^-126
    exponent = UNBIAS_EXPONENT
    if subnormals_slow():
        normalized(bits, kept_memory("fp4 codes", 1, bits.size).view(np.int32).reshape(bits.shape))
        exponent -= 1
    unbias = np.float32(2.0**exponent)
    scale_bytes = w.scales[start:end]
    largest = int(scale_bytes.max(initial=0))
    folded = largest <= fp4.e8m0.EXPONENT_BIAS + 127 - exponent  # a scale times 2^exponent stays finite
    if largest == fp4.e8m0.NAN_BYTE or scale_bytes.min(initial=1) == 0:
        scales = int4_tiles.scales_per_byte(fp4.e8m0.decode(scale_bytes), memory)
        if folded:
            np.multiply(scales, unbias, out=scales)
    else:
        scales = int4_tiles.scales_per_byte(scale_bytes, memory, exponent if folded else 0)
    if not folded:  # the values unbiased first (exact), then scaled
        np.multiply(out, unbias, out=out)
    np.multiply(out, scales, out=out)  # the same [rows, in/8] for every plane


def normalized(bits: np.ndarray, scratch: np.ndarray) -> None:
    """A nibble's bits (plane_part: s, then its code c = e e m at bits 22-24, the value times 2^-126,
    0.5 a float32 subnormal) made its value times 2^-125, every one normal or zero, in three
    integer passes: min(c, 2) << 22 added. c >= 2 (an exponent e >= 1) gains one in the exponent
    field; c = 1 (0.5, bits 1 << 22: 2^-127) becomes 1 << 23 (2^-126); c = 0 stays zero.
    bits, scratch: int32 of the same shape"""
    np.bitwise_and(bits, CODE_BITS, out=scratch)
    codes = scratch.view(np.float32)  # c << 22 >= 0 orders as its float32 does; NumPy's int32 minimum ran 1.5x slower
    np.minimum(codes, TWO_CODES.view(np.float32), out=codes)
    np.add(bits, scratch, out=bits)


PROBE_VALUES = 1 << 14
PROBE_ROUNDS = 5


@cache
def subnormals_slow() -> bool:
    """Whether this CPU multiplies float32 subnormals SUBNORMAL_PENALTY times slower than normal
    values or more, measured once per process (the least of PROBE_ROUNDS of each, about 1 ms):
    FP4's 0.5 decoded by the bit trick is one. An Intel Xeon took FP4 tiles at 0.19-0.22 G values/s
    with them and 1.6 without (docs/performance.md); there the decoding takes three passes more to
    avoid them. Either way the values come out the same, bit for bit."""
    return slow_subnormals(multiply_seconds(2.0**-127), multiply_seconds(2.0**-125))


def multiply_seconds(value: float) -> float:
    """The least time of PROBE_ROUNDS multiplications of PROBE_VALUES float32 copies of `value`."""
    a, out = np.full(PROBE_VALUES, value, np.float32), np.empty(PROBE_VALUES, np.float32)
    rounds = []
    for _ in range(PROBE_ROUNDS):
        start = time.perf_counter()
        np.multiply(a, np.float32(3.0), out=out)
        rounds.append(time.perf_counter() - start)
    return min(rounds)


def slow_subnormals(subnormal: float, normal: float) -> bool:
    """Slow: the subnormals' multiplication took SUBNORMAL_PENALTY times the normal values' or more."""
    return subnormal >= SUBNORMAL_PENALTY * normal


def tile_rows(w: Fp4Matrix) -> int:
    """Rows decoded at once in the inputs' order: as many as TILE_VALUES hold (at least one)."""
    return max(1, TILE_VALUES // w.shape[1])


def row_tiles(w: Fp4Matrix, tokens: int = 0, shares: int = 1) -> list[tuple[int, int]]:
    """[start, end) of each tile of a product with `tokens` tokens: up to PLANES_MOST_TOKENS INT4's
    (int4_tiles.row_tiles); up to MANY_TOKENS as FEW_TILE_VALUES hold; past that as TALL_TILE_BYTES
    of float32 hold, but at most a share of the rows among `shares` threads; decoding alone (0),
    tile_rows(w) rows."""
    if 0 < tokens <= PLANES_MOST_TOKENS:
        return list(int4_tiles.row_tiles(w, tokens))
    rows, (out_dim, in_dim) = tile_rows(w), w.shape
    if tokens > MANY_TOKENS:
        height = min(tall_rows(rows, in_dim), rows * -(-out_dim // (rows * shares)))
    else:
        height = rows * max(1, FEW_TILE_VALUES // (rows * in_dim)) if tokens else rows
    return [(r, min(r + height, out_dim)) for r in range(0, out_dim, height)]


def apply_tiles(tokens_t: np.ndarray, w: Fp4Matrix, tiles: Sequence[tuple[int, int]], rows: np.ndarray,
                claim: Callable[[], int | None] | None = None) -> None:
    """Decode each tile and multiply it into its rows of `rows` [out, N]; tokens_t: the inputs
    [in, N]. Up to PLANES_MOST_TOKENS the tiles are planes (int4_tiles.apply_tiles, the inputs put
    in their order here); past them, rows decoded tile_rows(w) at a time. With `claim`, only the
    tiles it hands out are done (by index, until it gives None): a product shared from both ends
    with a helper process (fp8_workers)."""
    if tokens_t.shape[1] <= PLANES_MOST_TOKENS:
        split = int4_tiles.split_inputs(tokens_t.T, w)  # [N, in] in the planes' order
        int4_tiles.apply_tiles(split, w, tiles, rows, decode_planes, claim)
        return
    height, step = max((end - start for start, end in tiles), default=0), tile_rows(w)
    buffer = kept_memory("fp4 tile", height, w.shape[1])
    scales = fp4.e8m0.decode(w.scales)  # [out, in/32] float32, made once a call (a tile's few would cost more)
    for i in range(len(tiles)) if claim is None else iter(claim, None):
        start, end = tiles[i]
        tile = buffer[: end - start]  # [rows, in]
        for r in range(0, end - start, step):
            part = slice(start + r, min(start + r + step, end))
            decode_rows(w, part.start, part.stop, tile[r : r + step], scales[part])
        multiply_tile(tile, tokens_t, rows[start:end], None)
