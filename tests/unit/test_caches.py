"""The cache sizes read from the machine, and the FP8 tiles cut to them still giving the product."""

import time

import numpy as np
import pytest

from stepper import fp8
from stepper.kernels import cpu_caches, fp8_tiles
from stepper.kernels.fp8_matmul import linear_fp8, products_via_dequantize
from stepper.kernels.fp8_tiles import in_steps
from stepper.weights.stored import Fp8Matrix


def write_cache(folder, index, level, kind, size):
    (folder / f"index{index}").mkdir(parents=True)
    for name, text in (("level", level), ("type", kind), ("size", size)):
        (folder / f"index{index}" / name).write_text(f"{text}\n")


def test_the_l2_is_read_from_a_sysfs_cache_folder(tmp_path):
    write_cache(tmp_path, 0, 1, "Data", "48K")
    write_cache(tmp_path, 1, 1, "Instruction", "64K")
    write_cache(tmp_path, 2, 2, "Unified", "2048K")
    write_cache(tmp_path, 3, 3, "Unified", "491520K")
    assert cpu_caches.l2_from_sysfs(tmp_path) == 2048 * 1024
    assert cpu_caches.l2_from_sysfs(tmp_path / "missing") is None


@pytest.mark.parametrize("text, size", [("2048K", 2 << 20), ("1M", 1 << 20), ("512", 512), ("", None), ("xK", None),
                                        ("0K", None)])
def test_sizes_are_parsed_or_refused(text, size):
    assert cpu_caches.parse_size(text) == size


def test_rows_in_cache_take_half_the_l2_in_multiples_of_eight(monkeypatch):
    monkeypatch.setattr(cpu_caches, "l2_bytes", lambda: 2 << 20)
    assert cpu_caches.rows_in_cache(7168 * 4) == 32  # 1 MiB / 28 KiB = 36.6 -> 32
    assert cpu_caches.rows_in_cache(1536 * 4) == 168
    assert cpu_caches.rows_in_cache(10 << 20) == 8  # never fewer than one multiple


def test_steps_cover_every_row_once_and_never_cross_a_scale_block():
    for rows, block, step in ((128, 128, 32), (300, 128, 48), (100, 128, 200), (7, 3, 2), (256, 128, 128)):
        parts = in_steps(rows, block, step)
        assert [r for a, b in parts for r in range(a, b)] == list(range(rows))
        assert all(b - a <= step and a // block == (b - 1) // block for a, b in parts)


@pytest.mark.parametrize("parts", [True, False])  # what the machine measured faster (fp8_tiles.decode_in_parts)
@pytest.mark.parametrize("tokens", [1, 5, 200])  # scales on the inputs; on the tiles (taller than a block)
def test_products_in_parts_of_a_small_cache_equal_the_readable_and_exact_products(monkeypatch, tokens, parts):
    monkeypatch.setattr(cpu_caches, "l2_bytes", lambda: 2 * 8 * 4 * 700)  # parts of 8 rows: 16 per scale block
    monkeypatch.setattr(fp8_tiles, "decode_in_parts", lambda: parts)
    assert fp8_tiles.part_rows(128, 700) == (8 if parts else 128)
    rng = np.random.default_rng(tokens)
    codes, scale_inv = fp8.quantize(rng.standard_normal((300, 700)).astype(np.float32) * 0.05)
    w = Fp8Matrix.of(codes, scale_inv)
    x = rng.standard_normal((tokens, 700)).astype(np.float32)
    y = linear_fp8(x, w)
    exact = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
    assert np.abs(y - exact).max() <= 2e-6 * np.abs(exact).max()
    assert np.array_equal(y, products_via_dequantize(x, [w])[0])  # the same tiles through fp8.dequantize


def test_blocks_are_cut_into_parts_only_where_parts_measured_faster(monkeypatch):
    assert fp8_tiles.prefer_parts(whole=1.0, parts=0.5) and fp8_tiles.prefer_parts(1.0, fp8_tiles.PARTS_GAIN)
    assert not fp8_tiles.prefer_parts(1.0, 0.95) and not fp8_tiles.prefer_parts(1.0, 1.2)
    monkeypatch.setattr(fp8_tiles, "decode_in_parts", lambda: True)
    monkeypatch.setattr(cpu_caches, "l2_bytes", lambda: 2 << 20)
    assert (fp8_tiles.part_rows(128, 7168), fp8_tiles.part_rows(128, 18432), fp8_tiles.part_rows(128, 1024)) == (
        32, 8, 128)  # half the L2: 1 MiB / 28 KiB = 36.6, / 72 KiB = 14.2, / 4 KiB = 256
    monkeypatch.setattr(fp8_tiles, "decode_in_parts", lambda: False)
    assert fp8_tiles.part_rows(128, 7168) == 128


@pytest.fixture
def fresh_probe():
    """fp8_tiles.decode_in_parts measured afresh, and its answer forgotten again afterwards."""
    fp8_tiles.decode_in_parts.cache_clear()
    yield fp8_tiles.decode_in_parts
    fp8_tiles.decode_in_parts.cache_clear()


def test_the_probe_times_nothing_when_a_whole_block_fits_half_the_l2(monkeypatch, fresh_probe):
    monkeypatch.setattr(cpu_caches, "l2_bytes", lambda: 8 << 20)  # [128, 7168] float32 is 3.5 MiB
    monkeypatch.setattr(fp8_tiles, "decode_nan_free", None)  # called, it would raise
    assert fresh_probe() is False


def test_the_probe_takes_parts_when_they_run_faster(monkeypatch, fresh_probe):
    """The probe times the same block whole and in parts; with a decoder that is slow on large
    arrays (as an L3 out of reach makes it), it takes parts, and whole blocks with one slow on many
    calls."""
    real = fp8_tiles.decode_nan_free
    monkeypatch.setattr(cpu_caches, "l2_bytes", lambda: 2 << 20)
    for slow_when, parts in ((lambda rows: rows > 64, True), (lambda rows: rows <= 64, False)):
        def decode(codes, out, slow_when=slow_when):
            real(codes, out)
            if slow_when(codes.shape[0]):
                time.sleep(0.002)
        monkeypatch.setattr(fp8_tiles, "decode_nan_free", decode)
        fresh_probe.cache_clear()
        assert fresh_probe() is parts


def test_the_probe_block_holds_a_checkpoint_s_codes_no_float32_subnormals_once_decoded():
    """An Intel CPU multiplies float32 subnormals many times slower; an e4m3 subnormal decoded times
    2^-120 is one, and a checkpoint's weights hardly hold any. Random codes of every kind made the
    probe's product 12x slower there and chose whole blocks where parts ran 1.4x faster."""
    codes = fp8_tiles.probe_codes(*fp8_tiles.PROBE_BLOCK)
    assert codes.shape == fp8_tiles.PROBE_BLOCK and not fp8_tiles.nan_codes_in(codes)
    tile = np.empty(codes.shape, np.float32)
    fp8_tiles.decode_nan_free(codes, tile)
    assert np.abs(tile).min() >= np.finfo(np.float32).tiny  # 2^-126: no subnormal
    values = fp8.decode(codes)
    assert np.abs(values).min() == 2.0**-6 and np.abs(values).max() == 448  # every normal e4m3 exponent
    assert np.array_equal(tile, values * np.float32(2.0**-120))


def test_int4_tiles_take_a_quarter_of_the_l2_and_at_least_2_to_the_18_values(monkeypatch):
    from stepper.kernels.int4_tiles import cached_rows as tile_rows
    from stepper.weights.stored import Int4Matrix

    def weight(in_features):
        return Int4Matrix(np.zeros((256, in_features // 8), np.int32), np.ones((256, in_features // 32), np.float32),
                          in_features)

    monkeypatch.setattr(cpu_caches, "l2_bytes", lambda: 1 << 20)  # 2^16 float32 values: too few for NumPy's calls
    assert (tile_rows(weight(7168)), tile_rows(weight(2048))) == (32, 128)  # 2^18: [36, 7168] as whole 32s
    monkeypatch.setattr(cpu_caches, "l2_bytes", lambda: 2 << 20)  # 2^17
    assert (tile_rows(weight(7168)), tile_rows(weight(2048))) == (32, 128)
    monkeypatch.setattr(cpu_caches, "l2_bytes", lambda: 8 << 20)  # 2^19: [73, 7168]
    assert (tile_rows(weight(7168)), tile_rows(weight(1024))) == (64, 128)
    monkeypatch.setattr(cpu_caches, "l2_bytes", lambda: 64 << 20)  # 2^22: [585, 7168], at most MOST_TILE_ROWS
    assert (tile_rows(weight(7168)), tile_rows(weight(2048))) == (128, 128)
