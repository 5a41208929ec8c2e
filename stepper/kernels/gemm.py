"""The float32 product of a weight's rows by a few tokens, `out = a @ b`, made by the fastest BLAS
at hand: NumPy's own (OpenBLAS), or Intel's MKL when the optional `mkl` extra is installed and
the CPU is Intel's.

On an Intel Xeon with AVX-512, MKL's sgemm multiplies a [2048, 7168] tile by 16 tokens at 1.5x
OpenBLAS's rate, and by 256 at 1.1-1.2x (docs/performance.md): OpenBLAS packs the whole tile for
every call, which a product with few columns cannot amortise. On AMD's CPUs NumPy's OpenBLAS is
kept: that is where stepper's figures were measured with it. MKL is called through ctypes on
its sequential layer (one thread: stepper shares products out between its cores itself); its
results equal OpenBLAS's to float32 rounding (about 5e-7 of the largest value, summed in another
order), and a product of some of a tile's rows equals those rows of the whole product, bit for
bit, as stepper's sharing of rows between cores needs.

STEPPER_GEMM=numpy (or =mkl) in the environment overrides the choice, for every process stepper
starts (its helper processes read the same variable): paired runs of the two, and a check of
MKL on another CPU.
"""

from __future__ import annotations

import ctypes
import os
from functools import cache
from pathlib import Path

import numpy as np

from stepper.kernels.parallel import openblas_kernels

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112
# MKL is given products over at least this many inputs: a full-size layer's (7168, 2048, 1536...).
# The built-in tiny models' are all shorter, so their tensors, the README's examples, the lessons'
# answers and the fixtures stay the same whichever BLAS the machine has.
MKL_FROM_INPUTS = 1024
SEQUENTIAL = 1  # MKL_THREADING_SEQUENTIAL
CHOICE = "STEPPER_GEMM"


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = a @ b for float32 matrices a [M, K], b [K, N], out [M, N] (each row-major or a
    transposed view of a row-major array, as stepper's tiles, inputs and results are)."""
    sgemm = _mkl_sgemm() if backend() == "mkl" else None
    if sgemm is None or not _call(sgemm, a, b, out):
        np.matmul(a, b, out=out)
    return out


# OpenBLAS's kernels that multiply a small product straight from its operands, without packing them
DIRECT_KERNELS = ("skylakex", "cooperlake", "sapphirerapids")
DIRECT_MULTIPLY_ADDS = 10**6  # the largest such product, M x N x K (measured: N = 11 on [96, 896] 117 GFLOP/s,
# on [112, 896] 61, one core of an AMD EPYC Zen 5; docs/performance.md)
# and, for a tile's rows times inputs given transposed (as stepper gives them), rows x tokens at most this and
# at least this many inputs (OpenBLAS's sgemm_small_kernel_permit): [128, 256] planes by 11 tokens ran at
# 35-41 GFLOP/s, [64, 256] at 76 (AMD EPYC Zen 4, docs/performance.md)
DIRECT_ROWS_BY_TOKENS = 1200
DIRECT_FEWEST_INPUTS = 32


def avx512_openblas() -> bool:
    """Whether NumPy's OpenBLAS runs its AVX-512 kernels (DIRECT_KERNELS): they multiply small
    products (most_direct_rows) without packing their operands, twice as fast as packed for a few
    tokens that are not a multiple of 16 (11, 13), and take a product's tokens 16 at a time."""
    return openblas_kernels().lower() in DIRECT_KERNELS


def most_direct_rows(inner: int, tokens: int) -> int:
    """The most rows of a product [rows, inner] x [inner, tokens] (the inputs given transposed) that
    OpenBLAS's AVX-512 kernels make directly: at most DIRECT_MULTIPLY_ADDS multiply-adds and
    DIRECT_ROWS_BY_TOKENS, over at least DIRECT_FEWEST_INPUTS inputs; 0 if none. No tokens count as one."""
    tokens = max(tokens, 1)
    if inner < DIRECT_FEWEST_INPUTS:
        return 0
    return min(DIRECT_MULTIPLY_ADDS // (tokens * inner), DIRECT_ROWS_BY_TOKENS // tokens)


# OpenBLAS's AVX-512 kernels take the tokens of a product 16 at a time, and 1 to 4 more at
# little more than their share: one FP8 expert of Kimi K2 (gate, up, down) took 9.5 ms for 2 tokens
# as they are against 14.7 padded to 8, 11.9 against 17.1 for 4, 20.2 against 25.8 for 17 padded
# to 24; 5 to 15 past a multiple of 16 ran as fast or faster padded to 8s (AMD EPYC Zen 4,
# docs/performance.md).
CHEAP_REMAINDERS = (1, 2, 3, 4)
FEW_CACHED = 11  # with MKL, up to this many tokens all go to the parts (9: 0.89x MKL's whole tiles, 13: 1.03x)


def cached_rest(tokens: int, inputs: int) -> int:
    """How many of `tokens` columns of an FP8 tile's product by MKL are better not given to it: all of
    at most FEW_CACHED, or 1 to 4 past a multiple of 16 (its sgemm's cost is 16's), for each part to
    multiply as it is decoded, by NumPy's BLAS (more than one where it makes them directly). Else 0."""
    rest = tokens if tokens <= FEW_CACHED else tokens % 16 if tokens % 16 in CHEAP_REMAINDERS else 0
    if not (rest and mkl_products(inputs)):
        return 0
    return rest if rest == 1 or avx512_openblas() else 0


def unpadded(tokens: int, inputs: int) -> bool:
    """Whether `tokens` columns of a full-size product (MKL_FROM_INPUTS inputs or more) are
    multiplied faster as they are than padded to 8s: with NumPy's OpenBLAS and its AVX-512
    kernels, in direct parts (direct_parts) or 1 to 4 past a multiple of 16; with MKL, 1 to 4 past
    a multiple of 16 (cached_rest). The built-in tiny models' products are padded alike on every
    machine."""
    if cached_rest(tokens, inputs):
        return True
    return full_size_on_avx512_openblas(inputs) and (tokens % 16 in CHEAP_REMAINDERS
                                                     or direct_parts(inputs, tokens) is not None)


def mkl_products(inputs: int) -> bool:
    """Whether MKL makes the products over `inputs` inputs (MKL_FROM_INPUTS or more) of two or more tokens."""
    return inputs >= MKL_FROM_INPUTS and backend() == "mkl"


def full_size_on_avx512_openblas(inputs: int) -> bool:
    """Whether a product of a full-size weight (MKL_FROM_INPUTS inputs or more) is made by NumPy's
    OpenBLAS with its AVX-512 kernels."""
    return inputs >= MKL_FROM_INPUTS and backend() == "numpy" and avx512_openblas()


# A tile [rows, in] times a few tokens, in parts [part rows, part inputs] that OpenBLAS's AVX-512
# kernels multiply directly, the parts' products of each row summed: one Kimi K2 [128, 7168] tile
# just decoded, by 4 / 11 / 16 / 32 tokens, took 80 / 227 / 281 / 600 us against 223 / 496 / 426 /
# 758 as one packed product (11 padded to 16; AMD EPYC Zen 4, docs/performance.md). With
# Haswell's kernels, which multiply nothing directly, the parts were slower.
DIRECT_PART_INPUTS = 1024  # a part's inputs at most: the weight's inputs in equal parts
FEWEST_PART_INPUTS = 256
FEWEST_PART_ROWS = 16
MOST_PART_ROWS = 128  # a tile of few tokens is one block of 128 scale rows; parts' rows are powers of two dividing it


def direct_parts(inputs: int, tokens: int) -> tuple[int, int] | None:
    """(rows, inputs) of the parts in which a tile of a full-size weight times `tokens` columns (2 or
    more) is multiplied directly (parts_matmul), or None where one product is as fast: another BLAS
    or kernels, or so many tokens that a part of FEWEST_PART_ROWS would be too large to multiply directly."""
    if tokens < 2 or not full_size_on_avx512_openblas(inputs):
        return None
    count = -(-inputs // DIRECT_PART_INPUTS)
    while inputs % count:
        count += 1
    width = inputs // count
    if width < FEWEST_PART_INPUTS:  # inputs of no convenient size
        return None
    rows = direct_part_rows(width, tokens)
    return (rows, width) if rows else None


def direct_part_rows(width: int, tokens: int) -> int:
    """The most rows of a part [rows, width] by `tokens` columns (2 or more) that OpenBLAS's AVX-512
    kernels multiply directly (most_direct_rows): a power of two from FEWEST_PART_ROWS to
    MOST_PART_ROWS, or 0."""
    rows = min(most_direct_rows(width, tokens), MOST_PART_ROWS) if tokens >= 2 else 0
    return 1 << (rows.bit_length() - 1) if rows >= FEWEST_PART_ROWS else 0


def parts_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray, parts: tuple[int, int], scratch: np.ndarray) -> None:
    """out = a @ b for a [M, K], b [K, N] and out [M, N] (C-contiguous) as products of a's parts
    [rows, width] by b's [width, N] (planes_matmul over a's columns cut in parts of `width`).
    (parts: direct_parts)"""
    rows, width = parts
    count = a.shape[1] // width
    planes_matmul(a.reshape(a.shape[0], count, width).transpose(1, 0, 2), b.reshape(count, width, -1), out, rows,
                  scratch)


def planes_matmul(planes: np.ndarray, inputs: np.ndarray, out: np.ndarray, rows: int, scratch: np.ndarray) -> None:
    """out = the sum over p of planes[p] @ inputs[p], for planes [P, M, K] (each plane's rows evenly
    strided), inputs [P, K, N] and out [M, N] (C-contiguous), made as one batched product of
    blocks of `rows` rows of each plane (the last block shorter) and the planes' products of each
    row summed in order; scratch: float32 memory of at least P * M * N values. The same planes,
    inputs and rows give the same bits; a row's bits can differ with the rows around it, so a
    product shared between processes cuts its tiles the same way in each."""
    if not out.flags.c_contiguous:  # its rows are written through views of them
        raise ValueError("planes_matmul needs a C-contiguous result")
    count, m, width = planes.shape
    n = inputs.shape[2]
    whole = m // rows * rows
    for start, end, height in ((0, whole, rows), (whole, m, m - whole)):  # whole blocks, the rest
        if end > start:
            blocks = (end - start) // height
            products = scratch[: count * blocks * height * n].reshape(count, blocks, height, n)
            np.matmul(planes[:, start:end].reshape(count, blocks, height, width), inputs[:, None], out=products)
            np.add.reduce(products, axis=0, out=out[start:end].reshape(blocks, height, n))


@cache
def backend() -> str:
    """'mkl' or 'numpy': the environment's STEPPER_GEMM if set, else MKL on an Intel CPU when its
    library is installed."""
    asked = os.environ.get(CHOICE, "").strip().lower()
    if asked in ("numpy", "mkl"):
        return asked if asked == "numpy" or _mkl_sgemm() is not None else "numpy"
    return "mkl" if cpu_vendor() == "GenuineIntel" and _mkl_sgemm() is not None else "numpy"


def description() -> str:
    """Which BLAS makes the weights' products, for the bench's machine line."""
    if backend() == "mkl":
        return "MKL sgemm (sequential, the mkl extra)"
    if cpu_vendor() == "GenuineIntel" and _mkl_library() is None:
        return 'NumPy\'s (pip install "stepper[mkl]" adds MKL\'s, faster on this CPU)'
    return "NumPy's, a few tokens' tiles in direct parts" if avx512_openblas() else "NumPy's"


def cpu_vendor() -> str:
    """The CPU's vendor as Linux reports it ('GenuineIntel', 'AuthenticAMD'), else ''."""
    return cpu_info("vendor_id")


def cpu_info(field: str) -> str:
    """A field of the first CPU in /proc/cpuinfo ('vendor_id', 'model name'), else ''."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


@cache
def _mkl_library() -> Path | None:
    """libmkl_rt from the installed `mkl` distribution, if any."""
    from importlib import metadata

    try:
        files = metadata.distribution("mkl").files or []
    except metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name.startswith("libmkl_rt.so"):
            return Path(file.locate()).resolve()
    return None


@cache
def _mkl_sgemm():
    """MKL's cblas_sgemm on its sequential layer, or None if the library is missing or will not load."""
    path = _mkl_library()
    if path is None:
        return None
    try:
        library = ctypes.CDLL(str(path))
        library.MKL_Set_Threading_Layer(ctypes.c_int(SEQUENTIAL))
        sgemm = library.cblas_sgemm
    except (OSError, AttributeError):
        return None
    i, p = ctypes.c_int, ctypes.c_void_p
    sgemm.argtypes = [i, i, i, i, i, i, ctypes.c_float, p, i, p, i, ctypes.c_float, p, i]
    sgemm.restype = None
    return sgemm


def _layout(x: np.ndarray) -> tuple[int, int] | None:
    """(transpose flag, leading dimension) of a 2-D float32 array as BLAS sees it in row-major
    terms, or None if it is neither row-major nor the transpose of a row-major array."""
    rows, columns = x.shape
    s0, s1 = x.strides
    if s1 == 4 and s0 % 4 == 0 and s0 // 4 >= columns:
        return NO_TRANS, s0 // 4
    if s0 == 4 and s1 % 4 == 0 and s1 // 4 >= rows:
        return TRANS, s1 // 4
    return None


def _call(sgemm, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
    """out = a @ b through MKL; False (nothing done) for shapes or layouts it is not given."""
    if not (a.dtype == b.dtype == out.dtype == np.float32 and a.ndim == b.ndim == out.ndim == 2):
        return False
    (m, k), n = a.shape, b.shape[1]
    if min(m, n) < 2 or k < MKL_FROM_INPUTS or b.shape[0] != k or out.shape != (m, n):
        return False
    if out.strides[0] == 4 and out.strides[1] != 4:  # a transposed result: out.T = b.T @ a.T
        a, b, out, m, n = b.T, a.T, out.T, n, m
    la, lb, lc = _layout(a), _layout(b), _layout(out)
    if la is None or lb is None or lc is None or lc[0] != NO_TRANS:
        return False
    sgemm(ROW_MAJOR, la[0], lb[0], m, n, k, 1.0, a.ctypes.data, la[1], b.ctypes.data, lb[1], 0.0,
          out.ctypes.data, lc[1])
    return True
