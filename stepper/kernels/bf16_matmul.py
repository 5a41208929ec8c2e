"""x @ W^T for BF16 weights, decoded a tile of rows at a time inside the product, never held
whole in float32: a BF16 pattern shifted 16 bits up is its float32 exactly (weights.stored.bf16_rows).

Kimi-K2-Thinking's and K2.5's attention and shared experts are BF16, as are DeepSeek-V2's
weights. Turning such a weight into a fresh float32 array for every use costs more than the
product it serves: 235 MB of new memory for one o_proj, its page faults, and a pass over it.
Here each thread decodes one tile into memory of its own, kept from one product to the next,
and multiplies it while it is still in the cache; large products are shared out by tiles across
the cores. The values are the same; only the blocking of BLAS's sums may differ.
"""

from __future__ import annotations

import itertools

import numpy as np

from stepper.kernels import cpu_caches, gemm, parallel
from stepper.kernels.fp8_matmul import padded_to_columns
from stepper.kernels.fp8_tiles import TALL_TILE_BYTES, decode_in_parts, kept_memory, multiply_tile
from stepper.weights.stored import Bf16Matrix, bf16_rows

SEVERAL_TILE_BYTES = 1 << 22  # a tile's float32 for 1 to MANY_TOKENS tokens: [128, 8192] or [682, 1536]
MANY_TOKENS = 128  # past this, TALL_TILE_BYTES (BLAS repacks the inputs for every product)
SHARE_WORK = 1 << 22  # weights x tokens below which a product stays on one thread


def tile_rows(w: Bf16Matrix, tokens: int) -> int:
    """Rows per tile: SEVERAL_TILE_BYTES of float32 for up to MANY_TOKENS tokens, TALL_TILE_BYTES
    for more, but for one token on a CPU where FP8 blocks decode faster in parts that fit half the
    L2 (fp8_tiles.decode_in_parts: an Intel Xeon whose L3 is slow), such parts. Few long calls are
    faster than many short ones (much faster when BLAS runs threads of its own, as it may when
    stepper is used as a library), and on an AMD EPYC Zen 5 (docs/performance.md) a tile of 4 MiB,
    which the L3 holds, ran 16 to 48 tokens 1.25-1.8x faster than one of 32 MiB and one token 1.4x
    faster than a tile of half the L2."""
    if tokens == 1 and decode_in_parts():
        return cpu_caches.rows_in_cache(4 * w.shape[1])
    tile_bytes = SEVERAL_TILE_BYTES if tokens <= MANY_TOKENS else TALL_TILE_BYTES
    return max(8, tile_bytes // (4 * w.shape[1]))


def bf16_products(x: np.ndarray, ws: list[Bf16Matrix]) -> list[np.ndarray]:
    """x @ W^T for each of several BF16 weights [out_i, in] of the same input; several tokens are
    padded once to whole columns of BLAS, as FP8's are (padded_to_columns: 43 tokens as 48 took
    0.85-0.88x the time, and 2 to 7 tokens as 8 ran the attention and shared expert of a Kimi K2
    layer in 24.5 ms where 2, 3 and 7 had taken 29-40, with OpenBLAS's SkylakeX kernels or its
    Haswell ones), unless a tile's product is made in direct parts (gemm.direct_parts), as FP8's
    are.  [..., in] -> [[..., out_i]]"""
    tokens = x.reshape(-1, ws[0].shape[1]).astype(np.float32, copy=False)  # [N, in]
    padded = tokens if gemm.unpadded(*tokens.shape) else padded_to_columns(tokens)  # [N', in]
    return [bf16_product(padded, w)[:, : tokens.shape[0]].T.reshape(*x.shape[:-1], w.shape[0]) for w in ws]


def bf16_product(tokens: np.ndarray, w: Bf16Matrix) -> np.ndarray:
    """W @ tokens^T, a tile of W's rows at a time.  tokens [N, in] -> [out, N]"""
    out_dim, in_dim = w.shape
    rows_t = np.empty((out_dim, tokens.shape[0]), np.float32)  # [out, N]
    large = w.bits.size * tokens.shape[0] >= SHARE_WORK
    workers = parallel.cores() if large else 1
    tiles = even_tiles(out_dim, tile_rows(w, tokens.shape[0]), workers)
    height = max((end - start for start, end in tiles), default=0)
    inputs = tokens.T  # [in, N]
    direct = gemm.direct_parts(in_dim, tokens.shape[0]) if tokens.shape[0] <= MANY_TOKENS else None

    def multiply(share: list[tuple[int, int]]) -> None:
        tile = kept_memory("bf16 tile", height, in_dim)  # [rows, in], this thread's
        for start, end in share:
            decoded = bf16_rows(w.bits[start:end], tile[: end - start])  # [rows, in]
            multiply_tile(decoded, inputs, rows_t[start:end], direct)

    parallel.split(tiles, multiply, workers)
    return rows_t


def even_tiles(out_dim: int, height: int, workers: int) -> list[tuple[int, int]]:
    """[start, end) of tiles of out_dim rows, none taller than `height`, as many as the workers
    divide and all as tall, to a row (each worker's contiguous share then has as many rows). Tiles
    of the tall height alone left kv_a_proj [576, 7168] at 512 tokens to one core, and q_a_proj
    [1536, 7168] to tiles of 1170 rows and 366: 1.3x FP8's time there."""
    count = -(-out_dim // height)
    count = min(-(-count // workers) * workers, out_dim)
    bounds = [out_dim * k // count for k in range(count + 1)] if count else [0]
    return list(itertools.pairwise(bounds))
