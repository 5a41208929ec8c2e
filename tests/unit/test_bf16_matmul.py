"""BF16 weights multiplied tile by tile (kernels.bf16_matmul): the decoded values are ml_dtypes'
bit for bit, the products those of the float32 weight, one token or many, on one thread or shared."""

import itertools

import ml_dtypes
import numpy as np
import pytest

from stepper.kernels import bf16_matmul, cpu_caches
from stepper.kernels.linear import float32_kept, float32_weight, linear, linears
from stepper.weights.stored import Bf16Matrix, Stored, bf16_rows


def bf16_weight(rng, out: int, inp: int) -> np.ndarray:
    return rng.standard_normal((out, inp), dtype=np.float32).astype(ml_dtypes.bfloat16)


def test_every_bf16_pattern_decodes_to_ml_dtypes_float32_bit_for_bit():
    patterns = np.arange(1 << 16,
                         dtype=np.uint32).astype(np.uint16).reshape(256, 256)  # NaNs, infinities, subnormals, -0
    decoded = bf16_rows(patterns, np.empty((256, 256), np.float32))
    expected = patterns.view(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(decoded.view(np.uint32), expected.view(np.uint32))
    assert decoded.view(np.uint32)[0, 1] == 0x10000  # the pattern 0x0001 is the float32 0x00010000: shifted 16 bits up


def test_a_bf16_matrix_is_kept_as_stored_and_other_tensors_are_float32():
    w = bf16_weight(np.random.default_rng(0), 5, 7)
    matrix = Stored("BF16", w).matrix("m")
    assert isinstance(matrix, Bf16Matrix) and matrix.shape == (5, 7) and matrix.nbytes == 70
    assert np.shares_memory(matrix.bits, w)  # no copy
    vector = Stored("BF16", w[0]).matrix("v")  # a norm's weight: not a matrix
    assert isinstance(vector, np.ndarray) and vector.dtype == np.float32


@pytest.mark.parametrize("tokens", [1, 3, 200])
@pytest.mark.parametrize("shared", [False, True])
def test_products_equal_the_float32_weights_product(tokens, shared, monkeypatch):
    monkeypatch.setattr(bf16_matmul, "SEVERAL_TILE_BYTES", 4 * 96 * 8)  # 8-row tiles: many, the last one short
    monkeypatch.setattr(bf16_matmul, "TALL_TILE_BYTES", 4 * 96 * 16)
    if shared:
        monkeypatch.setattr(bf16_matmul, "SHARE_WORK", 1)
    rng = np.random.default_rng(tokens)
    w = bf16_weight(rng, 77, 96)
    x = rng.standard_normal((1, tokens, 96), dtype=np.float32)
    exact = (x.astype(np.float64) @ w.astype(np.float64).T)  # [1, N, 77]
    got = linear(x, Stored("BF16", w).matrix())
    assert got.shape == (1, tokens, 77) and got.dtype == np.float32
    np.testing.assert_allclose(got, exact, rtol=2e-5, atol=2e-5 * np.abs(exact).max())
    np.testing.assert_allclose(got, np.matmul(x, w.astype(np.float32).T), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tokens", [2, 11, 61])
@pytest.mark.parametrize("shared", [False, True])
def test_a_few_tokens_product_in_direct_parts_is_the_product(tokens, shared, monkeypatch):
    """Where OpenBLAS's AVX-512 kernels multiply small products directly (forced here, on any
    machine), each tile is multiplied in such parts (gemm.direct_parts), the tokens unpadded."""
    from stepper.kernels import gemm

    monkeypatch.setattr(gemm, "full_size_on_avx512_openblas", lambda inputs: True)
    if shared:
        monkeypatch.setattr(bf16_matmul, "SHARE_WORK", 1)
    calls = []
    real = gemm.parts_matmul
    monkeypatch.setattr(gemm, "parts_matmul", lambda a, b, out, parts, scratch: calls.append(b.shape)
                        or real(a, b, out, parts, scratch))
    rng = np.random.default_rng(tokens)
    w = bf16_weight(rng, 300, 2048)
    x = rng.standard_normal((tokens, 2048), dtype=np.float32)
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    got = linear(x, Stored("BF16", w).matrix())
    assert got.shape == (tokens, 300) and np.abs(got - exact).max() <= 2e-6 * np.abs(exact).max()
    assert calls and set(calls) == {(2048, tokens)}  # every tile in parts, the tokens as they are


def test_several_weights_of_one_input_and_the_decoded_copies():
    rng = np.random.default_rng(1)
    gate, up = bf16_weight(rng, 40, 24), bf16_weight(rng, 40, 24)
    x = rng.standard_normal((2, 24), dtype=np.float32)
    got = linears(x, (Stored("BF16", gate).matrix(), Stored("BF16", up).matrix()))
    for g, w in zip(got, (gate, up)):
        np.testing.assert_allclose(g, x @ w.astype(np.float32).T, rtol=1e-5, atol=1e-6)
    m = Stored("BF16", gate).matrix()
    np.testing.assert_array_equal(float32_weight(m), gate.astype(np.float32))
    kept: dict = {}
    first = float32_kept(m, kept)
    np.testing.assert_array_equal(first, gate.astype(np.float32))
    assert not first.flags.writeable


def test_tiles_hold_4_mib_for_up_to_128_tokens_and_32_mib_past_them(monkeypatch):
    monkeypatch.setattr(bf16_matmul, "decode_in_parts", lambda: False)  # as on an AMD EPYC
    w = Stored("BF16", np.zeros((4096, 7168), ml_dtypes.bfloat16)).matrix()
    assert bf16_matmul.tile_rows(w, 1) == bf16_matmul.tile_rows(w, 128) == 146  # [146, 7168] float32: 4 MiB
    assert bf16_matmul.tile_rows(w, 129) == bf16_matmul.TALL_TILE_BYTES // (4 * 7168) == 1170  # many: tall
    narrow = Stored("BF16", np.zeros((64, 1 << 20), ml_dtypes.bfloat16)).matrix()
    assert bf16_matmul.tile_rows(narrow, 1) == 8  # at least 8 rows, however wide


def test_one_token_takes_half_the_l2_where_fp8_blocks_decode_faster_in_such_parts(monkeypatch):
    monkeypatch.setattr(bf16_matmul, "decode_in_parts", lambda: True)  # as on an Intel Xeon whose L3 is slow
    monkeypatch.setattr(cpu_caches, "l2_bytes", lambda: 2 << 20)
    w = Stored("BF16", np.zeros((4096, 7168), ml_dtypes.bfloat16)).matrix()
    assert bf16_matmul.tile_rows(w, 1) == 32  # (1 MiB / 28 KiB = 36 rows) in whole 8s
    monkeypatch.setattr(cpu_caches, "l2_bytes", lambda: 512 << 10)
    assert bf16_matmul.tile_rows(w, 1) == 8
    assert bf16_matmul.tile_rows(w, 2) == 146  # several tokens: 4 MiB all the same


def test_several_tokens_are_multiplied_in_whole_columns_of_8(monkeypatch):
    seen = []
    product = bf16_matmul.bf16_product
    monkeypatch.setattr(bf16_matmul, "bf16_product",
                        lambda tokens, w: seen.append(tokens.shape[0]) or product(tokens, w))
    rng = np.random.default_rng(2)
    w = bf16_weight(rng, 16, 24)
    for n in (1, 2, 7, 8, 9, 43):
        x = rng.standard_normal((n, 24), dtype=np.float32)
        np.testing.assert_allclose(linear(x, Stored("BF16", w).matrix()), x @ w.astype(np.float32).T, rtol=1e-5,
                                   atol=1e-5)
    assert seen == [1, 8, 8, 8, 16, 48]  # one token stays a matrix-vector product


def test_shared_tiles_give_each_core_as_many_rows():
    def heights(out_dim, height, workers):
        tiles = bf16_matmul.even_tiles(out_dim, height, workers)
        assert tiles[0][0] == 0 and tiles[-1][1] == out_dim
        assert all(end == start for (_, end), (start, _) in itertools.pairwise(tiles))  # one after another
        return [end - start for start, end in tiles]

    assert heights(576, 1170, 2) == [288, 288]  # kv_a_proj at 512 tokens: one tile was one core's
    assert heights(1536, 1170, 2) == [768, 768]  # q_a_proj: 1170 and 366 before
    assert heights(7168, 1024, 2) == [896] * 8  # o_proj: 7 tiles, 4 for one core and 3 for the other
    assert heights(77, 8, 2) == [7, 8, 8, 7, 8, 8, 7, 8, 8, 8]  # ten tiles, within a row of each other
    assert heights(77, 8, 1) == heights(77, 8, 2)  # ten tiles divide among two workers already
    assert heights(9, 8, 1) == [4, 5] and heights(3, 100, 4) == [1, 1, 1]  # no tile empty
