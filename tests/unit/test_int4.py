"""INT4 pack-quantized decoding: hand-derived words, the group scales, the checks, and the products
and the cache against the readable dequantization (against compressed-tensors' own packer and
unpacker: tests/reference/test_int4_packing.py)."""

from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest

from stepper import int4
from stepper.errors import StepperError
from stepper.kernels.int4_matmul import int4_products
from stepper.kernels.int4_tiles import MANY_TOKENS, decode_tile, int4_rows, tiles_order
from stepper.kernels.linear import float32_weight, linear, linears
from stepper.seams.swap import swapped
from stepper.weights.stored import Int4Matrix


def test_hand_derived_words():
    # 0x89ABCDEF holds, lowest bits first, the codes F E D C B A 9 8: values 7, 6, ..., 0
    word = np.array([[0x89ABCDEF]], dtype=np.uint32).view(np.int32)
    assert [int4.nibble(int(word[0, 0]), p) for p in range(8)] == [15, 14, 13, 12, 11, 10, 9, 8]
    assert [f.value for f in int4.fields(int(word[0, 0]))] == [7, 6, 5, 4, 3, 2, 1, 0]
    assert int4.unpack_bits(word, 8).tolist() == [[7, 6, 5, 4, 3, 2, 1, 0]]
    # 0x01234567: codes 7 6 5 4 3 2 1 0, values -1 .. -8 (a positive int32)
    assert int4.unpack_bits(np.array([[0x01234567]], np.int32), 8).tolist() == [[-1, -2, -3, -4, -5, -6, -7, -8]]
    assert int4.word_bits(0x89ABCDEF) == "1000 1001 1010 1011 1100 1101 1110 1111"
    assert int4.fields(-1)[0].bits == "1111" and int4.fields(-1)[7].value == 7


def test_dequantize_is_code_minus_8_times_the_group_scale():
    values = np.random.default_rng(0).integers(-8, 8, (4, 64)).astype(np.int8)
    scales = np.array([[0.5, 2.0], [1.0, -0.25], [3.0, 1e-30], [0.0, 8.0]], ml_dtypes.bfloat16)
    weight = int4.dequantize_int4(int4.pack(values), scales, 64)
    expected = values.astype(np.float64) * np.repeat(scales.astype(np.float64), 32, axis=1)
    np.testing.assert_array_equal(weight, expected.astype(np.float32))  # exact: a 4-bit integer times a BF16
    assert weight.dtype == np.float32


@pytest.mark.parametrize("packed_shape, scale_shape, in_features, expected", [
    ((4, 8), (4, 3), 64, "needs scales of shape [4, 2], got [4, 3]"),
    ((4, 7), (4, 2), 64, "needs packed words of shape [4, 8], got [4, 7]"),
    ((4, 10), (4, 3), 80, "80 inputs are not a whole number of groups of 32"),
])
def test_shapes_that_disagree_are_refused(packed_shape, scale_shape, in_features, expected):
    with pytest.raises(StepperError, match=expected.replace("[", r"\[")):
        int4.dequantize_int4(np.zeros(packed_shape, np.int32), np.ones(scale_shape, np.float32), in_features,
                             name="experts.0.up_proj.weight")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 3e38])
def test_scales_that_are_not_finite_are_refused(bad):
    scales = np.ones((2, 1), np.float32)
    scales[1, 0] = bad
    with pytest.raises(StepperError, match=r"x.weight_scale: 1 group scale\(s\) are not finite .* at \[1, 0\]"):
        Int4Matrix.of(np.zeros((2, 4), np.int32), scales, 32, name="x.weight_scale")
    with pytest.raises(StepperError, match="dtype must be bfloat16, float16 or float32"):
        int4.scales_as_f32(np.ones((2, 1), np.int32), "x")


def test_bf16_scales_become_float32_by_their_bits():
    # every BF16 pattern: the 16-bit shift gives ml_dtypes' own cast, bit for bit (NaNs stay NaN)
    patterns = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).reshape(256, 256)
    mine = int4.float32_scales(patterns.view(ml_dtypes.bfloat16))
    theirs = patterns.view(ml_dtypes.bfloat16).astype(np.float32)
    assert mine.dtype == np.float32 and mine.shape == (256, 256)
    numbers = ~np.isnan(theirs)
    np.testing.assert_array_equal(mine.view(np.uint32)[numbers], theirs.view(np.uint32)[numbers])
    assert np.isnan(mine[~numbers]).all() and (~numbers).sum() == 2 * 127  # 2 signs x 127 NaN mantissas
    assert int4.float32_scales(np.array([[0.5]], np.float16)).tolist() == [[0.5]]


def test_checkpoint_scale_check_keeps_bf16_scales_and_gives_others_as_float32():
    from stepper.weights.checkpoint import check_int4_scales

    scales = np.array([[0.5, 2.0], [1e-30, 7.0]], ml_dtypes.bfloat16)
    assert check_int4_scales("s.safetensors", "x.weight_scale", scales) is scales  # no copy
    halves = check_int4_scales("s.safetensors", "x.weight_scale", np.array([[0.5, 2.0], [0.125, 7.0]], np.float16))
    assert halves.dtype == np.float32 and halves.tolist() == [[0.5, 2.0], [0.125, 7.0]]
    for bad, said in ((np.nan, "not finite"), (np.inf, "not finite"), (3e38, "not finite"), (0.0, "zero or below"),
                      (-0.0, "zero or below"), (-1.0, "zero or below")):
        scales[1, 1] = bad
        with pytest.raises(StepperError, match=rf"s.safetensors: 'x.weight_scale' holds 1 group scale\(s\) .*{said}"):
            check_int4_scales("s.safetensors", "x.weight_scale", scales)


def test_bf16_scales_checked_on_their_bits_as_on_their_float32_values():
    # every BF16 pattern, one at a time: the bit check accepts exactly the scales the float32 check does
    patterns = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    with np.errstate(invalid="ignore"):  # the NaN patterns
        values = patterns.view(ml_dtypes.bfloat16).astype(np.float64)
    positive = (values > 0) & (values <= int4.LARGEST_SCALE)  # False for NaN
    not_negative = (values >= 0) & (values <= int4.LARGEST_SCALE) & (patterns < 0x8000)  # +0, not -0
    scales = patterns.view(ml_dtypes.bfloat16)
    assert [int4.bf16_within(scales[i : i + 1], 1) for i in range(1 << 16)] == positive.tolist()
    assert [int4.bf16_within(scales[i : i + 1], 0) for i in range(1 << 16)] == not_negative.tolist()
    assert int4.LARGEST_BF16 == 0x7DFF and positive.sum() == 0x7DFF  # 1 .. 0x7DFF


def test_int4_matrix_keeps_bf16_scales_and_checks_them_as_before():
    packed = np.zeros((2, 4), np.int32)
    scales = np.array([[0.5], [-2.0]], ml_dtypes.bfloat16)  # a negative scale is a value, not an error, here
    w = Int4Matrix.of(packed, scales, 32, name="x")
    assert w.scales is scales
    assert Int4Matrix.of(packed, scales.astype(np.float16), 32).scales.dtype == np.float32
    for bad in (np.nan, -np.inf, 3e38):
        scales[1, 0] = bad
        with pytest.raises(StepperError, match=r"x: 1 group scale\(s\) are not finite .* at \[1, 0\]"):
            Int4Matrix.of(packed, scales, 32, name="x")


def test_quantize_chooses_largest_over_7_5_and_rounds_to_nearest():
    w = np.array([[7.5, -7.5, 3.2, 0.4] + [0.0] * 28, [0.0] * 32], np.float32)
    packed, scales = int4.quantize_int4(w)
    assert scales.dtype == ml_dtypes.bfloat16 and scales.astype(np.float32).tolist() == [[1.0], [1.0]]
    assert int4.unpack_bits(packed, 32)[0, :4].tolist() == [7, -8, 3, 0]  # 7.5 -> 8 clamps to 7; -7.5 -> -8 (even)


def int4_weight(out_dim: int, in_dim: int, seed: int = 0) -> Int4Matrix:
    w = np.random.default_rng(seed).standard_normal((out_dim, in_dim), dtype=np.float32) / np.sqrt(in_dim)
    packed, scales = int4.quantize_int4(w)
    return Int4Matrix.of(packed, scales, in_dim, name="w")


@pytest.mark.parametrize("direct", [False, True])  # each plane whole, or in direct blocks of rows (block_rows)
@pytest.mark.parametrize("tokens", [1, 3, 8, 11, 20, 130, 300])
def test_tiled_products_match_the_dense_product(tokens, direct, monkeypatch):
    """Whichever tiles, blocks and padding the BLAS's direct products call for (int4_tiles.tile_height,
    block_rows): 300 rows in tiles of 128 and a short one; at 11 and 20 tokens blocks of 64 and 32
    rows and a short one, at 3 and 8 one short block of 128."""
    from stepper.kernels import gemm

    monkeypatch.setattr(gemm, "avx512_openblas", lambda: direct)
    blocks, planes_matmul = [], gemm.planes_matmul
    monkeypatch.setattr(gemm, "planes_matmul", lambda planes, inputs, out, rows, scratch: (
        blocks.append((planes.shape[1], rows)), planes_matmul(planes, inputs, out, rows, scratch)))
    w = int4_weight(300, 512)  # planes [rows, 64]
    x = np.random.default_rng(1).standard_normal((1, tokens, 512), dtype=np.float32)
    ref = x.astype(np.float64) @ w.dequantize().T.astype(np.float64)
    for y in (linear(x, w), linears(x, (w, w))[1], int4_products(x, [w])[0]):
        assert y.shape == (1, tokens, 300) and y.dtype == np.float32
        assert np.abs(y - ref).max() <= 1e-6 * np.abs(ref).max()
    if tokens > MANY_TOKENS:
        assert not blocks
    else:
        expected = gemm.direct_part_rows(64, tokens) if direct else 0
        assert set(blocks) == {(height, expected or height) for height in (128, 44)}
        assert expected == {1: 0, 3: 128, 8: 128, 11: 64, 20: 32}[tokens] * direct


def test_rows_decoded_for_the_cache_are_the_readable_dequantization_bit_for_bit():
    w = int4_weight(70, 256, seed=2)
    assert w.scales.dtype == ml_dtypes.bfloat16  # as quantize_int4 (and a checkpoint) gives them
    for weight in (w, replace(w, scales=w.scales.astype(np.float32))):
        np.testing.assert_array_equal(int4_rows(weight), w.dequantize())
        np.testing.assert_array_equal(float32_weight(weight), w.dequantize())


@pytest.mark.parametrize("tokens", [1, 7, 300])
def test_bf16_scales_widened_in_the_tiles_give_the_float32_scales_products_bit_for_bit(tokens):
    w = int4_weight(200, 320, seed=4)  # 200 rows: whole tiles and a short one
    widened = replace(w, scales=w.scales.astype(np.float32))  # ml_dtypes' cast, the way the scales were kept before
    x = np.random.default_rng(5).standard_normal((tokens, 320), dtype=np.float32)
    np.testing.assert_array_equal(int4_products(x, [w])[0], int4_products(x, [widened])[0])
    tile = np.empty((8, 32, 40), np.float32)  # [planes, rows, in/8]
    np.testing.assert_array_equal(decode_tile(w, 64, 96, tile), decode_tile(widened, 64, 96, tile.copy()))


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16, np.float32])
@pytest.mark.parametrize("lowest", [-30, -149])  # -149: scales down to float32's smallest, whose sixteenths round
def test_decoded_tiles_are_the_dequantized_weight_bit_for_bit(dtype, lowest):
    """decode_tile's planes (the nibbles as 16 (n - 8), the scales as s / 16) hold exactly the
    values of the readable dequantization, for every scale dtype and scales of any size, in the
    tiles' order."""
    rng = np.random.default_rng(abs(lowest))
    packed = rng.integers(-2**31, 2**31, (32, 32), dtype=np.int64).astype(np.int32)  # every nibble, 256 inputs
    scales = np.exp2(rng.uniform(lowest, 10, (32, 8))) * rng.choice([-1, 1], (32, 8))
    w = Int4Matrix.of(packed, scales.astype(dtype), 256)
    expected = w.dequantize()[:, tiles_order(256, 32)].reshape(32, 8, 32).transpose(1, 0, 2)
    tile = decode_tile(w, 0, 32, np.empty((8, 32, 32), np.float32))
    np.testing.assert_array_equal(tile.view(np.uint32), np.ascontiguousarray(expected).view(np.uint32))


def test_a_learners_dequantize_runs_in_every_product():
    w = int4_weight(40, 64, seed=3)
    calls = []

    def mine(packed, scales, in_features, group=32, *, name="weight"):
        calls.append(packed.shape)
        return int4.dequantize_int4.__wrapped__(packed, scales, in_features, group, name=name) * 2

    x = np.ones((1, 2, 64), np.float32)
    with swapped({"dequantize_int4": mine}):
        doubled = linear(x, w)
    assert calls and np.allclose(doubled, 2 * linear(x, w), rtol=1e-6)


@pytest.mark.parametrize("backend", ["numpy", "mkl"])
@pytest.mark.parametrize("tokens", [2, 11, 129])
def test_full_width_products_whichever_blas_makes_them(backend, tokens, monkeypatch):
    """A weight of 2048 inputs, whose tall tiles (past MANY_TOKENS) MKL multiplies when it is
    installed (kernels.gemm): the products are the exact weights' to float32 rounding either way."""
    from stepper.kernels import gemm

    if backend == "mkl" and gemm._mkl_sgemm() is None:
        pytest.skip("the mkl extra is not installed")
    monkeypatch.setattr(gemm, "backend", lambda: backend)
    w = int4_weight(300, 2048, seed=4)
    x = np.random.default_rng(tokens).standard_normal((tokens, 2048)).astype(np.float32)
    exact = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
    bound = 1e-6 * (np.abs(x).astype(np.float64) @ np.abs(w.dequantize()).astype(np.float64).T)
    assert (np.abs(linear(x, w) - exact) <= bound).all()


def test_tiles_for_few_tokens_follow_the_blas_and_the_cache(monkeypatch):
    """A [2048, 7168] expert weight with a 1 MiB L2 (32 rows decoded a part): where OpenBLAS's AVX-512
    kernels multiply small products directly, the planes [rows, 896] are multiplied in blocks they
    make directly (at most 10^6 multiply-adds and 1200 rows x tokens), the tokens unpadded, and a
    tile is as tall as is decoded at once (2^20 values, 128 rows); else, or past 69 tokens, tall
    tiles of 2^21 values (288 rows) with the tokens padded to 8s. Either is at most a sixteenth of
    the weight (128 rows); past MANY_TOKENS the tall tiles of many tokens."""
    from stepper.kernels import cpu_caches, gemm, int4_tiles
    from stepper.kernels.int4_matmul import padded_tokens

    monkeypatch.setattr(cpu_caches, "l2_bytes", lambda: 1 << 20)
    w = Int4Matrix(np.zeros((2048, 896), np.int32), np.ones((2048, 224), np.float32), 7168)
    monkeypatch.setattr(gemm, "avx512_openblas", lambda: True)
    assert {n: int4_tiles.block_rows(w, n) for n in (1, 2, 8, 11, 16, 32, 64, 69, 70)} == {
        1: 0, 2: 128, 8: 128, 11: 64, 16: 64, 32: 32, 64: 16, 69: 16, 70: 0}  # 64 x 11 x 896 = 630,784
    assert {n: int4_tiles.tile_height(w, n) for n in (1, 11, 16, 32, 64, 70, 200)} == {
        1: 128, 11: 128, 16: 128, 32: 128, 64: 128, 70: 128, 200: 1152}
    x = np.ones((70, 7168), np.float32)
    eleven = x[:11]
    assert padded_tokens(eleven, w) is eleven
    assert padded_tokens(x, w).shape == (72, 7168) and padded_tokens(x[:5], w).shape == (5, 7168)
    down = Int4Matrix(np.zeros((7168, 256), np.int32), np.ones((7168, 64), np.float32), 2048)
    assert (int4_tiles.block_rows(down, 11), int4_tiles.tile_height(down, 11)) == (64, 384)  # a sixteenth: 448
    tall = Int4Matrix(np.zeros((8192, 896), np.int32), np.ones((8192, 224), np.float32), 7168)
    assert int4_tiles.tile_height(tall, 11) == 128
    monkeypatch.setattr(gemm, "avx512_openblas", lambda: False)
    assert padded_tokens(x[:11], w).shape == (16, 7168) and padded_tokens(x[:5], w).shape == (5, 7168)
    assert {n: int4_tiles.tile_height(w, n) for n in (1, 11, 16, 32, 64, 200)} == {
        1: 128, 11: 128, 16: 128, 32: 128, 64: 128, 200: 1152}
    assert len(int4_tiles.row_tiles(w, 11)) == 16 and int4_tiles.row_tiles(w, 11)[-1] == (1920, 2048)
    assert int4_tiles.tile_height(tall, 11) == 288  # a taller weight's sixteenth is more than 2^21 values


@pytest.mark.parametrize("tokens", [1, 4, 16, 17])
def test_a_few_tokens_multiply_each_part_as_it_is_decoded(tokens, monkeypatch):
    """Where tiles are decoded in parts (32 rows of 7168 inputs, a tile 128 rows here), up to
    PART_PRODUCT_TOKENS tokens multiply each part as soon as it is decoded (one token, or where
    OpenBLAS multiplies the planes in direct blocks), every part decoded into the same memory (kept
    in the L2); more multiply the whole tile, each part decoded into its rows. The product is the
    dense one either way."""
    from stepper.kernels import cpu_caches, gemm, int4_tiles, parallel

    monkeypatch.setattr(cpu_caches, "l2_bytes", lambda: 1 << 20)
    monkeypatch.setattr(int4_tiles, "decode_in_parts", lambda: True)
    monkeypatch.setattr(int4_tiles, "SHARED_TILES", 2)  # 300 rows: tiles of 128, 128 and 44
    monkeypatch.setattr(parallel, "cores", lambda: 1)  # one thread's memory
    monkeypatch.setattr(gemm, "avx512_openblas", lambda: True)  # 2-4 tokens' planes in direct blocks
    heights, planes_matmul = [], gemm.planes_matmul
    monkeypatch.setattr(gemm, "planes_matmul", lambda planes, inputs, out, rows, scratch: (
        heights.append(planes.shape[1]), planes_matmul(planes, inputs, out, rows, scratch)))
    places, decode_tile = [], int4_tiles.decode_tile
    monkeypatch.setattr(int4_tiles, "decode_tile", lambda w, start, end, out: (
        places.append(out.ctypes.data), decode_tile(w, start, end, out))[1])
    w = int4_weight(300, 7168)
    x = np.random.default_rng(2).standard_normal((tokens, 7168), dtype=np.float32)
    ref = x.astype(np.float64) @ w.dequantize().T.astype(np.float64)
    y = int4_products(x, [w])[0]
    assert np.abs(y - ref).max() <= 1e-6 * np.abs(ref).max()
    assert int4_tiles.decode_rows(w, 128) == 32 and int4_tiles.row_tiles(w, tokens)[-1] == (256, 300)
    assert sorted(heights) == ([12] + [32] * 9 if tokens <= int4_tiles.PART_PRODUCT_TOKENS else [44, 128, 128])
    assert len(places) == 10 and len(set(places)) == (1 if tokens <= int4_tiles.PART_PRODUCT_TOKENS else 4)


@pytest.mark.parametrize(("backend", "tokens", "whole_rows"),
                         [("mkl", 24, False), ("mkl", 25, True), ("mkl", 128, True), ("numpy", 40, False),
                          ("numpy", 129, True)])
def test_with_mkl_more_than_24_tokens_multiply_whole_rows(backend, tokens, whole_rows, monkeypatch):
    """With MKL, a tile of more than MKL_ROWS_TOKENS tokens is multiplied as its rows [rows, in] in one
    product, as past MANY_TOKENS with either BLAS; fewer, or with NumPy's BLAS, as its planes. An FP4
    weight's tiles keep their planes. The product is the dense one either way."""
    from stepper.kernels import gemm, int4_tiles
    from stepper.weights.stored import Fp4Matrix

    monkeypatch.setattr(gemm, "backend", lambda: backend)  # without MKL installed, gemm.matmul is NumPy's
    planes, rows, planes_matmul, matmul = [], [], gemm.planes_matmul, gemm.matmul
    monkeypatch.setattr(gemm, "planes_matmul", lambda p, inputs, out, r, scratch: (
        planes.append(p.shape), planes_matmul(p, inputs, out, r, scratch)))
    monkeypatch.setattr(gemm, "matmul", lambda a, b, out: (rows.append(a.shape), matmul(a, b, out))[1])
    w = int4_weight(300, 2048, seed=5)
    x = np.random.default_rng(tokens).standard_normal((tokens, 2048)).astype(np.float32)
    exact = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
    bound = 1e-6 * (np.abs(x).astype(np.float64) @ np.abs(w.dequantize()).astype(np.float64).T)
    assert (np.abs(int4_products(x, [w])[0] - exact) <= bound).all()
    assert bool(rows) == whole_rows and bool(planes) != whole_rows
    assert all(shape[1] == 2048 for shape in rows) and sum(shape[0] for shape in rows) == (300 if whole_rows else 0)
    fp4 = Fp4Matrix(np.zeros((300, 1024), np.uint8), np.full((300, 64), 127, np.uint8))
    assert not int4_tiles.rows_product(min(tokens, 128), fp4)


def test_few_tokens_tiles_decode_whole_where_the_machine_prefers_it(monkeypatch):
    from stepper.kernels import cpu_caches, int4_tiles

    monkeypatch.setattr(cpu_caches, "l2_bytes", lambda: 1 << 20)
    w = Int4Matrix(np.zeros((2048, 896), np.int32), np.ones((2048, 224), np.float32), 7168)
    monkeypatch.setattr(int4_tiles, "decode_in_parts", lambda: True)
    assert int4_tiles.decode_rows(w, 96) == int4_tiles.decode_rows(w, 288) == 32
    monkeypatch.setattr(int4_tiles, "decode_in_parts", lambda: False)
    assert (int4_tiles.decode_rows(w, 96), int4_tiles.decode_rows(w, 288)) == (96, 128)  # at most 2^20 values


@pytest.mark.parametrize(("kernels", "direct"),
                         [("SkylakeX", True), ("SapphireRapids", True), ("Haswell", False), ("", False)])
def test_direct_products_only_with_openblas_kernels_that_make_them(kernels, direct, monkeypatch):
    from stepper.kernels import gemm, int4_tiles

    monkeypatch.setattr(gemm, "openblas_kernels", lambda: kernels)
    assert gemm.avx512_openblas() == direct
    assert (int4_tiles.block_rows(int4_weight(64, 2048), 11) > 0) == direct


def test_products_of_no_tokens_are_empty():
    """An empty input (no token routed, an empty chunk) gives an empty product."""
    w = int4_weight(100, 192)
    y = linear(np.zeros((0, 192), np.float32), w)
    assert y.shape == (0, 100) and y.dtype == np.float32
