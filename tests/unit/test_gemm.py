"""kernels.gemm: the weights' float32 products through MKL's sgemm (the mkl extra) or NumPy's.

MKL's path is held to a float64 product of the same values, in every layout stepper passes (a
tile's rows, inputs as a transposed view, results as rows or as a transposed view), and to
itself on a subset of a tile's rows, bit for bit. Which BLAS is chosen is checked against the
environment variable and the CPU's vendor."""

from __future__ import annotations

import numpy as np
import pytest

from stepper.kernels import gemm

mkl = pytest.mark.skipif(gemm._mkl_sgemm() is None, reason="the mkl extra is not installed")


def operands(m: int, k: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((n, k), dtype=np.float32)


def close_to_exact(got: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """got equals the float64 product to float32 rounding of a K-term sum."""
    exact = a.astype(np.float64) @ b.astype(np.float64)
    bound = 2 * a.shape[1] * np.finfo(np.float32).eps * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64))
    assert np.all(np.abs(got - exact) <= bound)
    assert not np.array_equal(got, np.zeros_like(got))


@mkl
@pytest.mark.parametrize("m, k, n", [(128, 7168, 16), (200, 1024, 3), (7, 2048, 64)])
def test_mkl_rows_times_transposed_inputs(m, k, n):
    a, x = operands(m, k, n)
    out = np.empty((m, n), np.float32)
    assert gemm._call(gemm._mkl_sgemm(), a, x.T, out)  # inputs [in, N] as a view of [N, in], as the tiles pass them
    close_to_exact(out, a, x.T)


@mkl
def test_mkl_into_a_transposed_result():
    """Many tokens: a tile's product writes columns of a [N, out] result (rows = result.T)."""
    a, x = operands(96, 1536, 40, seed=1)
    result = np.full((40, 300), np.nan, np.float32)
    rows = result.T  # [out, N], strides (4, 1200)
    assert gemm._call(gemm._mkl_sgemm(), a, x.T, rows[100:196])
    close_to_exact(rows[100:196], a, x.T)
    assert np.isnan(rows[:100]).all() and np.isnan(rows[196:]).all()  # nothing written outside its rows


@mkl
def test_mkl_contiguous_inputs_and_strided_rows():
    a, x = operands(64, 1100, 9, seed=2)
    wide = np.zeros((64, 1110), np.float32)
    wide[:, :1100] = a
    out = np.empty((64, 9), np.float32)
    assert gemm._call(gemm._mkl_sgemm(), wide[:, :1100], np.ascontiguousarray(x.T), out)  # lda 1110 > K
    close_to_exact(out, a, x.T)
    every_other = np.empty((32, 9), np.float32)
    assert gemm._call(gemm._mkl_sgemm(), a[::2], x.T, every_other)  # lda 600
    close_to_exact(every_other, a[::2], x.T)


@mkl
def test_mkl_rows_of_a_tile_equal_the_whole_product_bit_for_bit():
    """Cores share a product by rows: the rows each makes are those the whole product has."""
    a, x = operands(256, 7168, 16, seed=3)
    whole = np.empty((256, 16), np.float32)
    gemm._call(gemm._mkl_sgemm(), a, x.T, whole)
    for start, end in [(0, 128), (128, 256), (37, 101)]:
        part = np.empty((end - start, 16), np.float32)
        gemm._call(gemm._mkl_sgemm(), a[start:end], x.T, part)
        assert np.array_equal(part, whole[start:end])


@mkl
def test_mkl_declines_what_it_is_not_given():
    """A layout BLAS cannot take, another dtype or a vector is left to NumPy (False: nothing written)."""
    sgemm = gemm._mkl_sgemm()
    a, x = operands(32, 1024, 4)
    out1 = np.zeros((32, 1), np.float32)
    assert not gemm._call(sgemm, a, x[:1].T, out1)  # one token: a matrix-vector product
    assert not gemm._call(sgemm, a.astype(np.float64), x.T.astype(np.float64), np.zeros((32, 4)))
    assert not gemm._call(sgemm, a[:, ::2], x[:, ::2].T, np.zeros((32, 4), np.float32))  # columns with a gap
    short = np.zeros((32, 4), np.float32)
    assert not gemm._call(sgemm, a[:, :1023], x[:, :1023].T, short)  # a tiny model's product: NumPy's, as ever
    assert not out1.any() and not short.any()


@pytest.mark.parametrize("backend", ["numpy", "mkl"])
def test_matmul_in_every_layout_whichever_blas(backend, monkeypatch):
    if backend == "mkl" and gemm._mkl_sgemm() is None:
        pytest.skip("the mkl extra is not installed")
    monkeypatch.setattr(gemm, "backend", lambda: backend)
    a, x = operands(48, 1024, 12, seed=5)
    out = gemm.matmul(a, x.T, np.empty((48, 12), np.float32))
    close_to_exact(out, a, x.T)
    gapped = gemm.matmul(a[:, ::2], x[:, ::2].T, np.empty((48, 12), np.float32))  # left to NumPy
    close_to_exact(gapped, a[:, ::2], x[:, ::2].T)


def choose(monkeypatch, asked: str | None, vendor: str, installed: bool) -> str:
    monkeypatch.setattr(gemm, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(gemm, "_mkl_sgemm", lambda: object() if installed else None)
    if asked is None:
        monkeypatch.delenv(gemm.CHOICE, raising=False)
    else:
        monkeypatch.setenv(gemm.CHOICE, asked)
    gemm.backend.cache_clear()
    try:
        return gemm.backend()
    finally:
        gemm.backend.cache_clear()


def test_the_choice_of_blas(monkeypatch):
    assert choose(monkeypatch, None, "GenuineIntel", True) == "mkl"
    assert choose(monkeypatch, None, "AuthenticAMD", True) == "numpy"  # measured with OpenBLAS there
    assert choose(monkeypatch, None, "GenuineIntel", False) == "numpy"
    assert choose(monkeypatch, "numpy", "GenuineIntel", True) == "numpy"
    assert choose(monkeypatch, "MKL", "AuthenticAMD", True) == "mkl"
    assert choose(monkeypatch, "mkl", "GenuineIntel", False) == "numpy"  # asked, but not installed
    assert choose(monkeypatch, "blis", "GenuineIntel", True) == "mkl"  # an unknown name: the usual choice


@pytest.mark.parametrize("kernels, blas, inputs, expected", [
    ("SkylakeX", "numpy", 7168, [*range(1, 62), 65, 66, 67, 68]),  # 2-61 in direct parts, then 1-4 past 16s
    ("SkylakeX", "numpy", 1023, []),  # the built-in tiny models' products: padded on every machine
    ("Haswell", "numpy", 7168, []),
    ("SkylakeX", "mkl", 7168, [*range(1, 12), 17, 18, 19, 20, 33, 34, 35, 36, 49, 50, 51, 52, 65, 66, 67, 68]),
    ("Haswell", "mkl", 7168, [1, 17, 33, 49, 65]),  # 2-4 only where OpenBLAS multiplies them directly
    ("SkylakeX", "mkl", 1023, []),
])
def test_which_token_counts_go_unpadded(kernels, blas, inputs, expected, monkeypatch):
    monkeypatch.setattr(gemm, "openblas_kernels", lambda: kernels)
    monkeypatch.setattr(gemm, "backend", lambda: blas)
    assert [n for n in range(1, 80) if gemm.unpadded(n, inputs)] == expected


def on_avx512_openblas(monkeypatch) -> None:
    monkeypatch.setattr(gemm, "openblas_kernels", lambda: "SkylakeX")
    monkeypatch.setattr(gemm, "backend", lambda: "numpy")


def test_direct_parts_are_as_tall_as_a_direct_product_allows(monkeypatch):
    on_avx512_openblas(monkeypatch)
    # 7168 inputs in 7 parts of 1024; rows halved from 128 until rows x tokens x 1024 <= 10^6
    assert [gemm.direct_parts(7168, n) for n in (1, 2, 7, 8, 15, 16, 30, 31, 61, 62)] == [
        None, (128, 1024), (128, 1024), (64, 1024), (64, 1024), (32, 1024), (32, 1024), (16, 1024), (16, 1024), None]
    assert gemm.direct_parts(2048, 11) == (64, 1024)  # an expert's down_proj: 2 parts
    assert gemm.direct_parts(1536, 11) == (64, 768)  # q_b_proj: 2 parts of 768
    assert gemm.direct_parts(7000, 4) == (128, 1000)
    assert gemm.direct_parts(2053, 4) is None  # 2053 = 2053 x 1: no parts of a convenient size
    assert gemm.direct_parts(1000, 4) is None  # the tiny models' products: as on every machine
    assert gemm.direct_parts(1536, 10) == (64, 768)  # 128 x 10 x 768 <= 10^6, but 128 x 10 > 1200


def test_direct_rows_follow_openblas_small_kernel_permit():
    """At most 10^6 multiply-adds, rows x tokens at most 1200 (the inputs given transposed), at
    least 32 inputs: [96, 896] by 11 tokens is direct, [128, 256] by 11 is not (1408 > 1200)."""
    assert gemm.most_direct_rows(896, 11) == 101 and gemm.most_direct_rows(256, 11) == 109
    assert gemm.most_direct_rows(256, 4) == 300 and gemm.most_direct_rows(24, 4) == 0
    assert gemm.most_direct_rows(1024, 0) == 976  # no tokens count as one
    assert [gemm.direct_part_rows(256, n) for n in (1, 2, 9, 10, 11, 18, 19, 37, 38, 75, 76)] == [
        0, 128, 128, 64, 64, 64, 32, 32, 16, 16, 0]


@pytest.mark.parametrize("kernels, blas", [("Haswell", "numpy"), ("SkylakeX", "mkl")])
def test_no_direct_parts_for_other_kernels_or_blas(kernels, blas, monkeypatch):
    monkeypatch.setattr(gemm, "openblas_kernels", lambda: kernels)
    monkeypatch.setattr(gemm, "backend", lambda: blas)
    assert all(gemm.direct_parts(7168, n) is None for n in range(1, 130))


@pytest.mark.parametrize("parts", [(64, 1024), (16, 1024), (128, 512), (32, 768)])
def test_a_product_in_parts_is_the_product(parts):
    rng = np.random.default_rng(parts[0])
    a = rng.standard_normal((200, 3 * parts[1]), dtype=np.float32)  # whole parts, then 200 % rows rows
    x = rng.standard_normal((11, 3 * parts[1]), dtype=np.float32)
    out = np.full((200, 11), np.nan, np.float32)
    gemm.parts_matmul(a, x.T, out, parts, np.empty(200 * 11 * 3, np.float32))  # x.T: the inputs as stepper passes them
    exact = a.astype(np.float64) @ x.T.astype(np.float64)
    assert np.abs(out - exact).max() <= 1e-6 * np.abs(exact).max()
    again = np.empty_like(out)
    gemm.parts_matmul(a, x.T, again, parts, np.empty(200 * 11 * 3, np.float32))
    assert np.array_equal(again, out)  # the same bits every time
    with pytest.raises(ValueError, match="C-contiguous"):
        gemm.parts_matmul(a, x.T, np.empty((11, 200), np.float32).T, parts, np.empty(200 * 11 * 3, np.float32))


@pytest.mark.parametrize("rows", [16, 64, 128, 200])
def test_planes_multiplied_in_blocks_of_rows_are_the_summed_products(rows):
    """Eight planes one after another (as an INT4 tile) and the same planes as strided views of
    one matrix's columns; whole blocks of rows and a shorter last one."""
    rng = np.random.default_rng(rows)
    planes = rng.standard_normal((8, 200, 64), dtype=np.float32)
    x = rng.standard_normal((11, 8 * 64), dtype=np.float32)
    inputs = x.reshape(11, 8, 64).transpose(1, 2, 0)  # [planes, 64, N], as int4_tiles passes them
    exact = sum(planes[p].astype(np.float64) @ inputs[p].astype(np.float64) for p in range(8))
    side = np.ascontiguousarray(planes.transpose(1, 0, 2)).reshape(200, 512)  # the planes side by side
    for view in (planes, side.reshape(200, 8, 64).transpose(1, 0, 2)):
        out = np.full((200, 11), np.nan, np.float32)
        gemm.planes_matmul(view, inputs, out, rows, np.empty(8 * 200 * 11, np.float32))
        assert np.abs(out - exact).max() <= 1e-6 * np.abs(exact).max()
    with pytest.raises(ValueError, match="C-contiguous"):
        gemm.planes_matmul(planes, inputs, np.empty((11, 200), np.float32).T, rows, np.empty(8 * 200 * 11, np.float32))
