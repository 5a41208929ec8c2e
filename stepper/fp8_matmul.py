"""FP8 weights applied to activations without ever holding the weight in float32.

`Fp8Matrix` is an e4m3 weight [out, in] with its block scales. `x @ W^T` runs one tile of rows
at a time: the tile's codes are decoded straight into a small float32 buffer that stays in
cache, scaled, and multiplied, then the buffer is reused for the next tile. The result equals
dequantizing the whole weight with `fp8.dequantize` and multiplying, which stays as the readable
reference. (Two worker threads sharing the tiles measured slower here than one: each tile's
NumPy calls are too short for the GIL hand-offs to pay.)

The decode is `fp8.decode`'s bit trick with one pass folded away: the 2^120 rebias is multiplied
in together with the scales.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import fp8

F32 = np.float32
TILE_BYTES = 1 << 19  # float32 bytes of one decoded tile for a few tokens: 512 KiB stays in L2
BATCH_TOKENS = 16  # from this many tokens on, a tile is a whole scale block of rows: BLAS needs the height
SIGN_EXPONENT_MANTISSA = np.int32(-0x78100000)  # 0x87F00000 as int32: bit 31 and bits 26..20


@dataclass(frozen=True)
class Fp8Matrix:
    """An FP8 weight [out, in] with scale_inv [ceil(out/bo), ceil(in/bi)], applied lazily."""

    codes: np.ndarray  # uint8 [out, in]
    scale_inv: np.ndarray  # float32 [out/bo, in/bi]
    block: tuple[int, int] = fp8.BLOCK
    name: str = "weight"

    @classmethod
    def of(cls, codes: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int] = fp8.BLOCK, name: str = "weight"):
        codes = fp8.as_codes(codes, name)
        fp8.check_block_shapes(codes, np.asarray(scale_inv), block, name)
        return cls(codes, fp8.scales_as_f32(scale_inv, name), block, name)

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scale_inv.nbytes

    def dense(self) -> np.ndarray:
        """The float32 weight (the readable reference path)."""
        return fp8.dequantize(self.codes, self.scale_inv, self.block, name=self.name)


def linear_fp8(x: np.ndarray, w: Fp8Matrix) -> np.ndarray:
    """x @ W^T for an FP8 weight.  [..., in] -> [..., out], float32."""
    out_dim, in_dim = w.shape
    if w.scale_inv.size and float(w.scale_inv.max()) >= 2.0**7:  # scale * 2^120 would overflow float32
        return np.matmul(x, w.dense().T)
    tokens = x.reshape(-1, in_dim).astype(F32, copy=False)  # [N, in]
    y_t = np.empty((out_dim, tokens.shape[0]), dtype=F32)  # [out, N]: each tile writes whole rows
    apply_tiles(tokens, w, row_tiles(w, tokens.shape[0]), y_t)
    return y_t.T.reshape(*x.shape[:-1], out_dim)


def row_tiles(w: Fp8Matrix, tokens: int = 1) -> list[tuple[int, int, int]]:
    """(scale row, first row, end row) of each tile; a tile never crosses a scale block.

    For a few tokens (decode) tiles are small enough to stay in cache; for many (prefill) they
    are a whole scale block high, so each product is a GEMM BLAS runs at full rate."""
    out_dim, in_dim = w.shape
    block_rows = w.block[0]
    rows = block_rows if tokens >= BATCH_TOKENS else max(1, min(block_rows, TILE_BYTES // (4 * max(in_dim, 1))))
    return [
        (r0 // block_rows, t0, min(t0 + rows, r0 + block_rows, out_dim))
        for r0 in range(0, out_dim, block_rows)
        for t0 in range(r0, min(r0 + block_rows, out_dim), rows)
    ]


def apply_tiles(tokens: np.ndarray, w: Fp8Matrix, tiles: list[tuple[int, int, int]], y_t: np.ndarray) -> None:
    """Decode, scale and multiply each tile into its rows of y_t [out, N], with one reused buffer."""
    in_dim = w.shape[1]
    height = max((end - start for _, start, end in tiles), default=0)
    buffer = np.empty((height, in_dim), dtype=F32)
    low_bits = np.empty((height, in_dim), dtype=np.uint8)
    row_scales = {}
    for r, start, end in tiles:
        if r not in row_scales:
            row_scales.clear()
            row_scales[r] = np.repeat(w.scale_inv[r] * fp8.REBIAS, w.block[1])[:in_dim]  # [in]
        tile, codes = buffer[: end - start], w.codes[start:end]
        decode_scaled(codes, row_scales[r], tile)
        magnitude = np.bitwise_and(codes, 0x7F, out=low_bits[: end - start])
        if magnitude.max(initial=0) == 0x7F:  # a NaN code (0x7F / 0xFF) decoded as 480: make it NaN
            tile[magnitude == 0x7F] = np.nan
        np.matmul(tile, tokens.T, out=y_t[start:end])


def decode_scaled(codes: np.ndarray, scales: np.ndarray, out: np.ndarray) -> None:
    """out = decode(codes) * scales, in four passes over the tile.  [rows, in] uint8 -> float32

    scales [in] already carry the 2^120 rebias of `fp8.decode`'s bit trick.
    """
    bits = out.view(np.int32)
    np.copyto(bits, codes.view(np.int8))  # s eeee mmm -> s...s s eeee mmm (sign-extended)
    np.left_shift(bits, 20, out=bits)
    np.bitwise_and(bits, SIGN_EXPONENT_MANTISSA, out=bits)  # s 0000 eeee mmm 0...0
    np.multiply(out, scales, out=out)
