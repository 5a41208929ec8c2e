"""The fast FP8 product (fp8_matmul) and the split of products across cores (parallel)."""

import threading

import ml_dtypes
import numpy as np
import pytest

from stepper import fp8
from stepper.kernels import linear as linear_module
from stepper.kernels import parallel
from stepper.kernels.fp8_matmul import dequantize_rows, input_rebias, linear_fp8
from stepper.kernels.fp8_tiles import decode_unbiased, row_tiles, times_power_of_two
from stepper.weights.stored import FileBytes, Fp8Matrix


def test_decoded_tile_is_every_code_times_two_to_the_minus_120_exactly():
    codes = np.arange(256, dtype=np.uint8).reshape(2, 128)
    tile = np.empty((2, 128), np.float32)
    decode_unbiased(codes, tile)
    expected = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64) * 2.0**-120  # ml_dtypes: independent
    assert np.array_equal(tile, expected.astype(np.float32), equal_nan=True)
    assert np.isnan(tile.ravel()[[0x7F, 0xFF]]).all()
    assert tile.ravel()[0x01] == np.float32(2.0**-129)  # e4m3's smallest subnormal, a float32 subnormal here
    assert tile.ravel()[0x7E] == np.float32(448 * 2.0**-120)


@pytest.mark.parametrize("tokens", [1, 3, 15, 16, 40, 200])  # 200 > 128 rows: scales on the tiles
@pytest.mark.parametrize("shape", [(576, 700), (130, 129), (3, 5), (256, 7168)])
def test_product_equals_float64_dequantized_product(shape, tokens):
    rng = np.random.default_rng(sum(shape) + tokens)
    codes, scale_inv = fp8.quantize(rng.standard_normal(shape).astype(np.float32) * 0.05)
    w = Fp8Matrix.of(codes, scale_inv)
    x = rng.standard_normal((tokens, shape[1])).astype(np.float32)
    exact = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
    y = linear_fp8(x, w)
    assert y.dtype == np.float32 and y.shape == (tokens, shape[0])
    assert np.abs(y - exact).max() <= 2e-6 * np.abs(exact).max()


def test_scales_far_from_one_and_large_inputs_keep_full_precision():
    rng = np.random.default_rng(4)
    codes, scale_inv = fp8.quantize(rng.standard_normal((256, 384)).astype(np.float32))
    for scale, x_size in ((2.0**-40, 1.0), (2.0**30, 1.0), (1e-3, 1e20), (1.0, 1e-15), (1.0, 1e-30), (2.0**-100, 1.0)):
        w = Fp8Matrix.of(codes, (scale_inv * scale).astype(np.float32))
        for tokens in (2, 300):  # scales on the inputs, then on the tiles
            x = (rng.standard_normal((tokens, 384)) * x_size).astype(np.float32)
            exact = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
            y = linear_fp8(x, w)
            assert np.all(np.isfinite(y)), (scale, x_size, tokens)
            assert np.abs(y - exact).max() <= 2e-6 * np.abs(exact).max(), (scale, x_size, tokens)


def test_the_rebias_puts_the_largest_scaled_input_near_two_to_the_64():
    codes, scale_inv = fp8.quantize(np.ones((128, 256), np.float32))  # every scale 1/448
    w = Fp8Matrix.of(codes, scale_inv)
    for x_max in (1.0, 3e38, 1e-15):
        k = input_rebias(np.full((2, 256), x_max, np.float32), w)
        assert 2.0**63 <= float(np.float32(x_max)) * float(scale_inv[0, 0]) * 2.0**k < 2.0**64
    for x_max in (np.inf, np.nan, 0.0, 1e-30):  # no safe k: these take the dense path
        assert input_rebias(np.full((2, 256), x_max, np.float32), w) is None


def test_inf_nan_and_zero_inputs_give_the_dense_products_exactly():
    codes, scale_inv = fp8.quantize(np.ones((128, 128), np.float32))
    w = Fp8Matrix.of(codes, scale_inv)
    for bad in (np.inf, np.nan, 0.0):
        x = np.full((1, 128), bad if bad == 0 else 1, np.float32)
        x[0, 5] = bad
        with np.errstate(over="ignore", invalid="ignore"):
            reference = x @ w.dequantize().T
            assert np.array_equal(linear_fp8(x, w), reference, equal_nan=True), bad


def test_nan_codes_give_nan_in_their_rows_only():
    codes, scale_inv = fp8.quantize(np.full((300, 200), 0.5, np.float32))
    raw = codes.view(np.uint8)
    raw[7, 3], raw[260, 199] = 0x7F, 0xFF
    for tokens in (1, 20):
        y = linear_fp8(np.ones((tokens, 200), np.float32), Fp8Matrix.of(codes, scale_inv))
        assert sorted(np.flatnonzero(np.isnan(y).any(axis=0))) == [7, 260]
        assert np.isnan(y[:, [7, 260]]).all()


def test_tiles_are_whole_blocks_of_scale_rows():
    w = Fp8Matrix.of(np.zeros((1000, 7168), np.uint8), np.ones((8, 56), np.float32))
    assert row_tiles(w) == [(r, 128 * r, min(128 * r + 128, 1000)) for r in range(8)]
    assert row_tiles(w, 3) == [(0, 0, 384), (3, 384, 768), (6, 768, 1000)]


def test_split_runs_every_share_once_on_several_threads():
    seen, threads = [], set()
    # breaks unless 3 run at once (a minute: a busy machine starts threads late)
    lock, all_started = threading.Lock(), threading.Barrier(3, timeout=60)

    def work(share):
        with lock:
            seen.extend(share)
            threads.add(threading.get_ident())
        all_started.wait()

    parallel.split(list(range(10)), work, workers=3)
    assert sorted(seen) == list(range(10))
    assert len(threads) == 3
    parallel.split([], lambda share: seen.extend(share), workers=3)
    assert sorted(seen) == list(range(10))


def test_split_inside_a_share_runs_there_whole():
    seen = []

    def outer(share):
        for item in share:
            parallel.split([10 * item, 10 * item + 1], seen.extend, workers=2)

    caller = threading.Thread(target=parallel.split, args=([1, 2], outer), kwargs={"workers": 2}, daemon=True)
    caller.start()
    caller.join(timeout=60)  # a pool thread waiting for a share queued behind itself never ends
    assert not caller.is_alive()
    assert sorted(seen) == [10, 11, 20, 21]


def test_split_raises_a_failing_share_after_all_finished():
    done = []

    def work(share):
        if 0 in share:
            raise ValueError("first share")
        done.extend(share)

    with pytest.raises(ValueError, match="first share"):
        parallel.split(list(range(6)), work, workers=2)
    assert sorted(done) == [3, 4, 5]


def test_linear_by_rows_equals_one_product():
    rng = np.random.default_rng(2)
    weight = rng.standard_normal((1100, 1024)).astype(np.float32)
    for shape in ((1024,), (1, 1024), (2, 5, 1024)):
        x = rng.standard_normal(shape).astype(np.float32)
        exact = x.astype(np.float64) @ weight.astype(np.float64).T
        y = linear_module.linear(x, weight)  # big enough to be shared out by rows
        assert weight.size >= linear_module.SPLIT_WEIGHTS and y.shape == exact.shape and y.dtype == np.float32
        assert np.abs(y - exact).max() <= 1e-5 * np.abs(exact).max()


def test_single_threaded_blas_finds_numpys_openblas():
    if "openblas" not in str(np.show_config(mode="dicts")).lower():
        pytest.skip("NumPy here is not built on OpenBLAS")
    assert parallel.single_threaded_blas()


def test_batches_are_padded_with_zero_rows_to_a_multiple_of_8():
    from stepper.kernels.fp8_matmul import padded_to_columns

    x = np.arange(5 * 3, dtype=np.float32).reshape(5, 3)
    padded = padded_to_columns(x)
    assert padded.shape == (8, 3) and np.array_equal(padded[:5], x) and not padded[5:].any()
    assert padded_to_columns(x[:1]).shape == (1, 3)
    assert padded_to_columns(np.ones((16, 3), np.float32)).shape == (16, 3)


@pytest.mark.parametrize("tokens", [2, 3, 17, 20])
def test_tokens_as_they_are_or_padded_give_the_same_product(tokens, monkeypatch):
    """Where the BLAS multiplies 1-4 tokens past a multiple of 16 faster unpadded (gemm.unpadded),
    they go as they are; either way the product is the dequantized one's."""
    from stepper.kernels import gemm

    rng = np.random.default_rng(tokens)
    codes, scale_inv = fp8.quantize(rng.standard_normal((256, 2048)).astype(np.float32) * 0.05)
    w = Fp8Matrix.of(codes, scale_inv)
    x = rng.standard_normal((tokens, 2048)).astype(np.float32)
    exact = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
    made = {}
    for as_they_are in (True, False):
        monkeypatch.setattr(gemm, "unpadded", lambda n, inputs, answer=as_they_are: answer)
        made[as_they_are] = linear_fp8(x, w)
        assert np.abs(made[as_they_are] - exact).max() <= 2e-6 * np.abs(exact).max()
    assert made[True].shape == made[False].shape == (tokens, 256)


def product_of_300_rows_checked(tokens: int) -> None:
    """A [300, 2048] FP8 weight (tiles of 128, 128 and 44 rows) times `tokens` tokens through
    linear_fp8, held to the float64 product of its dequantized values."""
    rng = np.random.default_rng(tokens)
    codes, scale_inv = fp8.quantize(rng.standard_normal((300, 2048)).astype(np.float32) * 0.05)
    w = Fp8Matrix.of(codes, scale_inv)
    x = rng.standard_normal((tokens, 2048)).astype(np.float32)
    exact = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
    made = linear_fp8(x, w)
    assert made.shape == (tokens, 300) and np.abs(made - exact).max() <= 2e-6 * np.abs(exact).max()


@pytest.mark.parametrize("tokens", [2, 11, 17, 61])
def test_a_few_tokens_product_in_direct_parts_is_the_dequantized_one(tokens, monkeypatch):
    """Where OpenBLAS's AVX-512 kernels multiply small products directly (forced here, on any
    machine), each tile's product is made in such parts (gemm.direct_parts), unpadded; the last
    tile (44 rows) is shorter than a part."""
    from stepper.kernels import gemm

    monkeypatch.setattr(gemm, "full_size_on_avx512_openblas", lambda inputs: True)
    monkeypatch.setattr(gemm, "backend", lambda: "numpy")
    calls = []
    real = gemm.parts_matmul
    monkeypatch.setattr(gemm, "parts_matmul", lambda a, b, out, parts, scratch: calls.append((a.shape, b.shape, parts))
                        or real(a, b, out, parts, scratch))
    product_of_300_rows_checked(tokens)
    parts = gemm.direct_parts(2048, tokens)
    assert calls == [((128, 2048), (2048, tokens), parts)] * 2 + [((44, 2048), (2048, tokens), parts)]


@pytest.mark.parametrize("tokens, small_parts, head, whole", [
    (2, False, 0, 0), (4, False, 0, 0), (5, True, 0, 0), (11, True, 0, 0), (5, False, 5, 5), (12, True, 12, 16),
    (16, False, 16, 16), (17, False, 16, 16), (20, False, 16, 16), (21, False, 21, 24), (36, False, 32, 32)])
def test_with_mkl_the_few_tokens_past_16s_are_multiplied_in_the_cache(tokens, small_parts, head, whole, monkeypatch):
    """With MKL (chosen here on any machine; NumPy's BLAS stands in where it is not installed) and
    OpenBLAS's AVX-512 kernels beside it, 1 to 4 tokens past a multiple of 16, and where a block is
    decoded in smaller parts (16 rows of 2048 inputs here) all of up to 11, go unpadded and are
    multiplied by each part of a tile as it is decoded (fp8_tiles.multiply_in_cache); the other
    tokens by the whole tile (`whole` columns: unpadded up to 11); the product is the dequantized
    one's either way."""
    from stepper.kernels import cpu_caches, fp8_tiles, gemm

    monkeypatch.setattr(gemm, "backend", lambda: "mkl")
    monkeypatch.setattr(gemm, "avx512_openblas", lambda: True)  # 2-4 tokens are multiplied directly
    if small_parts:
        monkeypatch.setattr(cpu_caches, "l2_bytes", lambda: 1 << 18)
        monkeypatch.setattr(fp8_tiles, "decode_in_parts", lambda: True)
    wholes, parts = [], []
    real_tile, real_part = fp8_tiles.multiply_tile, fp8_tiles.multiply_in_cache
    monkeypatch.setattr(fp8_tiles, "multiply_tile", lambda tile, inputs, out, direct: wholes.append(inputs.shape[1])
                        or real_tile(tile, inputs, out, direct))
    monkeypatch.setattr(fp8_tiles, "multiply_in_cache", lambda part, inputs, out: parts.append(inputs.shape[1])
                        or real_part(part, inputs, out))
    product_of_300_rows_checked(tokens)
    assert wholes == ([whole] * 3 if head else [])  # three tiles: 128, 128 and 44 rows
    assert set(parts) == ({tokens - head} if tokens > head else set())
    assert len(parts) >= (3 if tokens > head else 0)


@pytest.mark.parametrize(("tokens", "one_part"), [(1, True), (3, True), (17, False)])
def test_tokens_all_multiplied_in_the_cache_need_one_part_of_memory(tokens, one_part, monkeypatch):
    """Where blocks are decoded in parts (16 rows of 2048 inputs here), and every token is multiplied
    by each part as it is decoded (one token; with MKL, 2 to 4), every part is decoded into the same
    memory, which stays in the L2; with tokens for the whole tile (17: 16 of them), each part into
    its rows of the tile. The product is the dequantized one's either way."""
    from stepper.kernels import cpu_caches, fp8_tiles, gemm

    monkeypatch.setattr(cpu_caches, "l2_bytes", lambda: 1 << 18)
    monkeypatch.setattr(fp8_tiles, "decode_in_parts", lambda: True)
    monkeypatch.setattr(gemm, "backend", lambda: "mkl")
    monkeypatch.setattr(gemm, "avx512_openblas", lambda: True)
    places, decode = [], fp8_tiles.NanCheck.decode
    monkeypatch.setattr(fp8_tiles.NanCheck, "decode", lambda check, codes, out: (
        places.append((out.shape[0], out.ctypes.data)), decode(check, codes, out))[1])
    product_of_300_rows_checked(tokens)
    assert [rows for rows, _ in places] == [16] * 18 + [12]  # tiles of 128, 128 and 44 rows
    assert len({place for _, place in places}) == (1 if one_part else 8)


@pytest.mark.parametrize("scale", [1e-3, 2.0**-140, 100.0, 2.0**10, np.inf])  # subnormal; s * 2^120 overflows
def test_decoded_equals_dequantize_bit_for_bit(scale):
    rng = np.random.default_rng(5)
    codes = rng.integers(0, 256, (300, 200), dtype=np.uint8)
    codes[0, :256 - 56] = np.arange(200)  # and every code, NaNs among them, at least once:
    codes[1, :56] = np.arange(200, 256)
    scale_inv = (rng.uniform(0.5, 2, (3, 2)) * scale).astype(np.float32)
    w = Fp8Matrix.of(codes, scale_inv)
    with np.errstate(over="ignore", invalid="ignore"):
        expected = fp8.dequantize(codes, scale_inv)
        got = dequantize_rows(w)
        given = np.empty(w.shape, np.float32)
        assert (dequantize_rows(w, given) is given
                and np.array_equal(given, got, equal_nan=True))  # into given memory too
    assert got.dtype == np.float32 and got.flags.c_contiguous
    nan = np.isnan(expected)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.int32), expected[~nan].view(np.int32))
    assert np.isnan(got[0, 0x7F]) and np.isnan(got[1, 0xFF - 200])


def test_times_a_power_of_two_rounds_as_ldexp():
    rng = np.random.default_rng(6)
    a = (rng.standard_normal(20000) * np.exp2(rng.integers(-149, 126, 20000))).astype(np.float32)
    for e in (-160, -127, -126, -100, -20, 0, 20, 127, 130):
        with np.errstate(over="ignore", under="ignore"):
            assert np.array_equal(times_power_of_two(a, e), np.ldexp(a, e)), e


def test_wide_products_come_back_contiguous_and_narrow_ones_as_before():
    codes, scale_inv = fp8.quantize(np.random.default_rng(7).standard_normal((256, 384)).astype(np.float32))
    w = Fp8Matrix.of(codes, scale_inv)
    for tokens in (1, 12, 200):
        x = np.random.default_rng(tokens).standard_normal((1, tokens, 384)).astype(np.float32)
        y = linear_fp8(x, w)
        exact = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
        assert y.shape == (1, tokens, 256) and np.abs(y - exact).max() <= 2e-6 * np.abs(exact).max()
        if tokens > 128:
            assert y.flags.c_contiguous


def test_the_nan_check_is_remembered_per_file_range():
    codes, scale_inv = fp8.quantize(np.full((256, 128), 0.5, np.float32))
    poisoned = codes.view(np.uint8).copy()
    poisoned[200, 7] = 0xFF
    x = np.ones((1, 128), np.float32)

    def nan_rows(c, origin):
        return np.flatnonzero(np.isnan(linear_fp8(x, Fp8Matrix.of(c, scale_inv, origin=origin))[0])).tolist()

    read = FileBytes("nan-check.safetensors", 4096, (1, 2, 3, 4))
    assert nan_rows(codes, read) == []
    assert nan_rows(poisoned, read) == []  # that range was found NaN-free: not looked at again
    assert nan_rows(poisoned, read.at(4096)) == [200]  # another range
    assert nan_rows(poisoned, read.at(4096)) == [200]  # a range with NaN codes: looked at every time
    rewritten = FileBytes("nan-check.safetensors", 4096, (1, 2, 3, 5))  # the same path and range, modified since
    assert nan_rows(poisoned, rewritten) == [200]
    assert nan_rows(poisoned, None) == [200]  # codes from no file: looked at every time


def test_decoded_into_given_memory_is_that_memory_holding_dequantize():
    codes, scale_inv = fp8.quantize(np.random.default_rng(8).standard_normal((300, 200)).astype(np.float32))
    w = Fp8Matrix.of(codes, scale_inv)
    out = np.full(w.shape, np.nan, np.float32)
    assert dequantize_rows(w, out) is out and np.array_equal(out, w.dequantize())


def test_products_of_other_shapes_in_turn_share_one_tile_buffer_and_stay_right():
    rng = np.random.default_rng(9)
    shapes = [(600, 384), (200, 130), (600, 384), (129, 1000)]  # larger, smaller, again, other width
    for tokens in (1, 3, 300):
        for out_dim, in_dim in shapes:
            codes, scale_inv = fp8.quantize(rng.standard_normal((out_dim, in_dim)).astype(np.float32))
            w = Fp8Matrix.of(codes, scale_inv)
            x = rng.standard_normal((tokens, in_dim)).astype(np.float32)
            want = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
            got = linear_fp8(x, w)
            assert np.allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max()), (tokens, out_dim, in_dim)
    buffers = {}

    def thread_buffer(name):
        from stepper.kernels.fp8_tiles import kept_memory

        buffers[name] = kept_memory("tiles", 128, 64)

    for name in ("a", "b"):
        t = threading.Thread(target=thread_buffer, args=(name,))
        t.start()
        t.join()
    assert not np.shares_memory(buffers["a"], buffers["b"])  # each thread its own
