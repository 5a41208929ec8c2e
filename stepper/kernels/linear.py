"""x @ W^T for every kind of weight, behind one call: float32 weights with BLAS (large ones
shared out by rows across the cores), FP8 weights (kernels.fp8_matmul), INT4 weights
(kernels.int4_matmul), FP4 weights (kernels.fp4_matmul) and BF16 weights (kernels.bf16_matmul)
decoded tile by tile inside the product, never held whole in float32.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import numpy as np

from stepper.kernels import gemm, parallel
from stepper.kernels.bf16_matmul import bf16_products
from stepper.kernels.fp4_matmul import fp4_products, fp4_rows
from stepper.kernels.fp8_matmul import dequantize_rows, linear_fp8, products
from stepper.kernels.int4_matmul import int4_products
from stepper.kernels.int4_tiles import int4_rows
from stepper.weights.stored import Bf16Matrix, Fp4Matrix, Fp8Matrix, Int4Matrix

Coded = (Fp8Matrix, Int4Matrix, Fp4Matrix, Bf16Matrix)  # weights kept as stored

SPLIT_WEIGHTS = 1 << 20  # a float32 weight of this many values or more is shared out by rows


def linear(x: np.ndarray, weight: np.ndarray | Fp8Matrix | Int4Matrix | Bf16Matrix) -> np.ndarray:
    """x @ W^T with an HF-layout weight [out, in].  [..., in] -> [..., out]

    An FP8, INT4, FP4 or BF16 weight is decoded tile by tile inside the product, never as a whole.
    """
    if isinstance(weight, Fp8Matrix):
        return linear_fp8(x, weight)
    if isinstance(weight, Int4Matrix):
        return int4_products(x, [weight])[0]
    if isinstance(weight, Fp4Matrix):
        return fp4_products(x, [weight])[0]
    if isinstance(weight, Bf16Matrix):
        return bf16_products(x, [weight])[0]
    if weight.size < SPLIT_WEIGHTS:
        return np.matmul(x, weight.T)
    return linear_by_rows(x, weight)


def linear_in_row_blocks(x: np.ndarray, blocks: Iterable, out_dim: int) -> np.ndarray:
    """x @ W^T with W [out_dim, in] given as consecutive blocks of its rows, each multiplied (and
    let go) before the next is asked for: np.concatenate([linear(x, b) for b in blocks], -1)
    written into one array, so all of W never exists at once.  [..., in] -> [..., out_dim]"""
    out = np.empty((*x.shape[:-1], out_dim), dtype=np.float32)
    start = 0
    for block in blocks:  # the next rows of W [rows, in]
        stop = start + block.shape[0]
        out[..., start:stop] = linear(x, block)
        start = stop
    return out


def linears(x: np.ndarray, weights: tuple) -> list[np.ndarray]:
    """x @ W^T for several weights of the same input: FP8 ones as one product, the input made
    ready once and, on two cores, one weight on each (a SwiGLU's gate and up).  [..., in] -> [[..., out]]"""
    if all(isinstance(w, Fp8Matrix) for w in weights):
        return products(x, list(weights))
    if all(isinstance(w, Int4Matrix) for w in weights):
        return int4_products(x, list(weights))
    if all(isinstance(w, Fp4Matrix) for w in weights):
        return fp4_products(x, list(weights))
    if all(isinstance(w, Bf16Matrix) for w in weights):
        return bf16_products(x, list(weights))
    return [linear(x, w) for w in weights]


def row_block(weight, start: int, stop: int):
    """Rows start:stop of a weight, kept as stored (an FP8 one with its scale rows, when start and
    stop fall on its scale blocks' edges; else decoded), so that linear(x, row_block(W, a, b))
    multiplies by W[a:b] without decoding the rest.  [out, in] -> [stop - start, in]"""
    if isinstance(weight, np.ndarray):
        return weight[start:stop]
    at = (lambda skip: None) if weight.origin is None else weight.origin.at
    if isinstance(weight, Fp8Matrix):
        rows = weight.block[0]
        if start % rows or (stop % rows and stop != weight.shape[0]):
            return float32_weight(weight)[start:stop]
        scales = weight.scale_inv[start // rows : -(-stop // rows)]
        return replace(weight, codes=weight.codes[start:stop], scale_inv=scales, origin=at(start * weight.shape[1]))
    if isinstance(weight, Bf16Matrix):
        return replace(weight, bits=weight.bits[start:stop], origin=at(start * weight.bits.strides[0]))
    if isinstance(weight, (Fp4Matrix, Int4Matrix)):
        return replace(weight, packed=weight.packed[start:stop], scales=weight.scales[start:stop],
                       origin=at(start * weight.packed.strides[0]))
    raise TypeError(f"no rows of a {type(weight).__name__}")


def float32_weight(weight: np.ndarray | Fp8Matrix | Int4Matrix | Bf16Matrix,
                   out: np.ndarray | None = None) -> np.ndarray:
    """A weight as float32 [out, in]: an FP8 one decoded a block of rows at a time (the same bits
    as fp8.dequantize, a few times faster), an INT4 or FP4 one a tile of rows at a time, a BF16 one
    whole (both their exact values), into `out` if given; a float32 one as it is."""
    if isinstance(weight, Fp8Matrix):
        return dequantize_rows(weight, out)
    if isinstance(weight, Int4Matrix):
        return int4_rows(weight, out)
    if isinstance(weight, Fp4Matrix):
        return fp4_rows(weight, out)
    if isinstance(weight, Bf16Matrix):
        return weight.dequantize(out)
    return weight


def float32_kept(weight: np.ndarray | Fp8Matrix | Int4Matrix | Bf16Matrix, kept: dict) -> np.ndarray:
    """float32_weight(weight), read-only, decoded into memory kept in `kept` from one call to the
    next (shape -> (memory, the FileBytes key of the weight it holds)), so valid only until the
    next call for that shape. Fresh memory for each call would fault its pages in again, and a
    checkpoint weight the memory still holds is not decoded again. Synthetic weights (no key)
    are always decoded."""
    if not isinstance(weight, Coded):
        return weight
    memory, holds = kept.get(weight.shape, (None, None))
    if memory is None:
        memory = np.empty(weight.shape, np.float32)
    key = weight.file_key
    if key is None or key != holds:
        kept[weight.shape] = (memory, None)  # holds nothing whole until decoded
        memory.flags.writeable = True
        float32_weight(weight, memory)
        memory.flags.writeable = False
        kept[weight.shape] = (memory, key)
    return memory


def linear_by_rows(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """x @ W^T with W's rows shared out across the cores.  [..., in] -> [..., out]"""
    out_dim, in_dim = weight.shape
    tokens = x.reshape(-1, in_dim)  # [N, in]
    y_t = np.empty((out_dim, tokens.shape[0]), dtype=np.result_type(x, weight))  # [out, N]
    n = parallel.cores()
    shares = [(out_dim * k // n, out_dim * (k + 1) // n) for k in range(n)]

    def rows(share: list[tuple[int, int]]) -> None:
        for start, end in share:
            gemm.matmul(weight[start:end], tokens.T, y_t[start:end])

    parallel.split(shares, rows)
    return y_t.T.reshape(*x.shape[:-1], out_dim)
