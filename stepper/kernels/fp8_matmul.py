"""FP8 weights applied to activations without ever holding the weight in float32.

`Fp8Matrix` is an e4m3 weight [out, in] with its block scales. `x @ W^T` runs one tile of rows
at a time: the tile's codes are decoded straight into a float32 buffer one block of scale rows
high, multiplied, and the buffer is reused for the next tile. A large product is shared out in
bands of rows with helper processes, one per further core (`fp8_workers`).

Decoding is `fp8.decode`'s bit trick without its last pass: the tile holds each code's value
times 2^-120 (the bits moved into place, not yet rebiased). Neither the 2^120 nor the block
scales touch the weight. A tile never crosses a block of scale rows, so for its rows the scale
depends only on the input column: it goes onto the inputs instead, with a power of two 2^k,

    y[i] = sum_j d[i, j] * s[b, j] * x[j] = 2^(120 - k) * sum_j (d[i, j] * 2^-120) * (x[j] * s[b, j] * 2^k)

which costs N x in multiplications per scale row instead of rows x in per tile. k is chosen
per product so that the largest scaled input is about 2^64: then every product and every sum
stays far inside float32's range whatever the magnitudes of x and s (`input_rebias`), and the
powers of two are exact. The result equals dequantizing with `fp8.dequantize` and multiplying,
which stays as the readable reference, to float32 rounding: each weight-times-input is rounded
once either way, at a different place.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import numpy as np

from stepper import fp8
from stepper.errors import StepperError
from stepper.swap import bypasses
from stepper.weights.stored import Fp8Matrix

Decoder = Callable[[np.ndarray, np.ndarray], object]  # (codes [rows, in], out float32 [rows, in]); result unused
TALL_TILE_BYTES = 1 << 25  # float32 bytes of a tile of several scale blocks, for many tokens
GEMM_COLUMNS = 8  # BLAS's fast multiple of tokens
SIGN_EXPONENT_MANTISSA = np.int32(-0x78100000)  # 0x87F00000 as int32: bit 31 and bits 26..20
REBIAS_EXPONENT = 120  # fp8.REBIAS = 2^120
SCALED_INPUT_EXPONENT = 64  # the largest |x * s * 2^k| is near 2^64; products stay near 2^(64 - 111)
SMALLEST_INPUT = 2.0**-60  # below this the scales times 2^k could overflow: the dense path is used


def linear_fp8(x: np.ndarray, w: Fp8Matrix) -> np.ndarray:
    """x @ W^T for an FP8 weight.  [..., in] -> [..., out], float32."""
    return products(x, [w])[0]


def product(x: np.ndarray, w: Fp8Matrix, decode: Decoder | None = None) -> np.ndarray:
    """x @ W^T, each tile decoded by decode(codes, out) into its values times 2^-120 (by default
    the bit trick here, with large products shared out across the cores)."""
    return tiled_products(x, [w], decode)[0]


def products_via_dequantize(x: np.ndarray, ws: list[Fp8Matrix]) -> list[np.ndarray]:
    """The same products with each tile through `fp8.dequantize` (and so `fp8.decode`), whichever
    functions those names run now: the tiles, padding, scaling and products are those of
    `tiled_products`, so stepper's own functions give the same bits.  [..., in] -> [[..., out_i]]"""
    return [product(x, w, dequantizing_decoder(w)) for w in ws]


def dequantizing_decoder(w: Fp8Matrix) -> Decoder:
    """A tile decoder calling `fp8.dequantize` with unit scales times 2^-120 (exact)."""

    def decode(codes: np.ndarray, out: np.ndarray) -> None:
        unbias = np.full(fp8.scale_grid(codes.shape, w.block), 1 / fp8.REBIAS, dtype=np.float32)
        out[...] = fp8.dequantize(codes, unbias, w.block, name=w.name)

    return decode


def tiled_products(x: np.ndarray, ws: list[Fp8Matrix], decode: Decoder | None = None) -> list[np.ndarray]:
    """x @ W^T for each of several weights [out_i, in] of the same input, which is looked over
    and padded once; shared with helpers, the weights' rows one after another are cut into bands
    as one weight's would be (a SwiGLU's gate and up on two cores: one weight each, one message
    and one wait for the two).  [..., in] -> [[..., out_i]]"""
    tokens = x.reshape(-1, ws[0].shape[1]).astype(np.float32, copy=False)  # [N, in]
    x_max = input_magnitude(tokens)
    ks = [input_rebias(tokens, w, x_max) for w in ws]
    # inf / NaN / all-tiny inputs or scales (no k): the readable path gives their exact semantics
    outs = [np.matmul(x, w.dequantize().T) if k is None else None for w, k in zip(ws, ks)]
    tiled = [i for i, k in enumerate(ks) if k is not None]
    if not tiled:
        return outs
    padded = padded_to_columns(tokens)  # [N', in]
    arrays = [result_arrays(ws[i].shape[0], padded.shape[0], many_tokens(padded.shape[0], ws[i])) for i in tiled]
    from stepper.kernels.fp8_workers import linear_bands

    if decode is not None or not linear_bands(padded, [ws[i] for i in tiled], [ks[i] for i in tiled],
                                              [rows for _, rows in arrays]):  # large: shared with helpers
        for i, (_, rows) in zip(tiled, arrays):
            apply_tiles(padded, ws[i], ks[i], rows, decode)
    for i, (result, rows) in zip(tiled, arrays):
        times_power_of_two(result, REBIAS_EXPONENT - ks[i], out=result)
        outs[i] = rows[:, : tokens.shape[0]].T.reshape(*x.shape[:-1], ws[i].shape[0])  # [..., out]
    return outs


# The name the kernels call: the tiled products, or their readable version while a learner's
# `decode` or `dequantize` is swapped in (they never call those functions themselves).
products = bypasses("decode", "dequantize", readable=products_via_dequantize)(tiled_products)


def dequantize_via_reference(w: Fp8Matrix, out: np.ndarray | None = None) -> np.ndarray:
    """An FP8 weight as float32 through `fp8.dequantize`, whichever function that name runs now;
    into `out` if given.  -> [out, in]"""
    weight = w.dequantize()
    if out is None:
        return weight
    if np.shape(weight) != w.shape:
        raise StepperError(f"dequantize gave shape {list(np.shape(weight))} for '{w.name}', expected {list(w.shape)}")
    np.copyto(out, weight)
    return out


@bypasses("decode", "dequantize", readable=dequantize_via_reference)
def dequantize_rows(w: Fp8Matrix, out: np.ndarray | None = None) -> np.ndarray:
    """The float32 weight, equal bit for bit to `w.dequantize()` (fp8.dequantize), decoded one block of
    rows at a time with the bit trick: each value d * 2^-120 times s * 2^120 is the exact d * s,
    rounded once, as dequantize rounds it; into `out` if given.  -> [out, in]"""
    if not float(np.abs(w.scale_inv).max(initial=0)) < 2.0 ** (127 - REBIAS_EXPONENT):  # s * 2^120 would overflow
        if out is None:
            return w.dequantize()
        np.copyto(out, w.dequantize())
        return out
    out = np.empty(w.shape, np.float32) if out is None else out
    scales = column_scales(w, REBIAS_EXPONENT)
    nan_check = NanCheck(w)
    for r, start, end in row_tiles(w):
        block = out[start:end]
        nan_check.decode(w.codes[start:end], block)
        np.multiply(block, scales[r], out=block)
    nan_check.done()
    return out


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


def padded_to_columns(tokens: np.ndarray) -> np.ndarray:
    """Several tokens padded with zero rows to a multiple of GEMM_COLUMNS.  [N, in] -> [N', in]

    OpenBLAS multiplies 8 columns at a time, so 8 tokens take less time than 5 (times in
    docs/design-notes.md). One token stays one (a matrix-vector product)."""
    n = tokens.shape[0]
    if n <= 1 or n % GEMM_COLUMNS == 0:
        return tokens
    padded = np.zeros((n + GEMM_COLUMNS - n % GEMM_COLUMNS, tokens.shape[1]), dtype=np.float32)
    padded[:n] = tokens
    return padded


def input_magnitude(tokens: np.ndarray) -> float:
    """The largest |x| (NaN if any x is), without an |x| array."""
    return max(float(tokens.max(initial=0)), -float(tokens.min(initial=0)))


def input_rebias(tokens: np.ndarray, w: Fp8Matrix, x_max: float | None = None) -> int | None:
    """k making the largest |x * s * 2^k| about 2^64; None if there is no safe k. (x_max: the
    inputs' input_magnitude, when already known.)"""
    x_max = input_magnitude(tokens) if x_max is None else x_max
    s_max = float(np.abs(w.scale_inv).max(initial=0))
    largest = x_max * s_max
    if not (math.isfinite(largest) and x_max >= SMALLEST_INPUT and s_max > 0):
        return None
    return SCALED_INPUT_EXPONENT - math.frexp(largest)[1]


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
    run faster.
    Such a tile is decoded block by block, so that each block's passes run in the cache.

    With `claim`, only the tiles it hands out are done (by index, until it gives None), and with
    `nan_check` the caller puts together and remembers what was found (fp8_workers shares a
    product's tiles with a helper that way)."""
    remember = nan_check is None
    nan_check = nan_check or NanCheck(w, decode)
    block_rows, in_dim = w.block[0], w.shape[1]
    many = many_tokens(tokens.shape[0], w)
    tiles = row_tiles(w, max(1, TALL_TILE_BYTES // (4 * in_dim * block_rows)) if many else 1)
    buffer = kept_memory("tiles", max((end - start for _, start, end in tiles), default=0), in_dim)
    if many:
        c = SCALED_INPUT_EXPONENT - math.frexp(float(np.abs(w.scale_inv).max(initial=0)))[1]
        # [in, N]: with the tiles' 2^c, still 2^k in all
        inputs = times_power_of_two(tokens, k - c, out=kept_memory("inputs", *tokens.shape)).T
        scales = column_scales(w, c)
    else:
        scales, scaled = column_scales(w, k), np.empty(tokens.shape, np.float32)
    for i in range(len(tiles)) if claim is None else iter(claim, None):
        r, start, end = tiles[i]
        tile = buffer[: end - start]
        for b, b0 in enumerate(range(0, end - start, block_rows)):
            block = tile[b0 : b0 + block_rows]
            nan_check.decode(w.codes[start + b0 : start + b0 + block_rows], block)
            if many:
                np.multiply(block, scales[r + b], out=block)
        if not many:
            inputs = np.multiply(tokens, scales[r], out=scaled).T  # [in, N]
        np.matmul(tile, inputs, out=rows[start:end])
    if remember:
        nan_check.done()


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
    after decoding it, while its codes are still in the cache (two reductions over the whole
    weight first cost 12% of a decode step, most of it reading the codes from memory).

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
