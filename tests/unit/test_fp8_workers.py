"""FP8 products shared with helper processes (fp8_workers): same values, and a safe fallback."""

import itertools
import os

import numpy as np
import pytest

from stepper.kernels import fp8_matmul, fp8_workers, parallel
from stepper.kernels.fp8_matmul import linear_fp8
from stepper.model import KVCache, Transformer
from stepper.presets import preset
from stepper.seams.trace import Emitter
from stepper.weights.checkpoint import Checkpoint
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.stored import FileBytes, Fp8Matrix
from stepper.weights.synth_checkpoint import synth_checkpoint

EXPERT = "model.layers.1.mlp.experts.3.down_proj.weight"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return Checkpoint(synth_checkpoint(SyntheticWeights(preset("tiny"), 4), tmp_path_factory.mktemp("ckpt") / "tiny"))


@pytest.fixture
def shared(monkeypatch):
    """Every product with a file behind it goes through the helpers (tiny's are below the size)."""
    if parallel.cores() < 2:
        pytest.skip("helpers need two cores")
    monkeypatch.setattr(fp8_workers, "SHARE_WORK", 0)
    fp8_workers.stop_helpers()
    yield
    fp8_workers.stop_helpers()


def exact(x, w: Fp8Matrix):
    return x.astype(np.float64) @ w.dequantize().astype(np.float64).T


@pytest.mark.parametrize("tokens", [1, 5, 300])
def test_shared_product_equals_the_dense_product(checkpoint, shared, tokens):
    w = checkpoint.matrix(EXPERT)  # [320, 96]: three blocks of scale rows, bands of 1 and 2
    assert w.origin is not None and w.shape[0] > 2 * 128
    x = np.random.default_rng(tokens).standard_normal((tokens, w.shape[1])).astype(np.float32)
    y = linear_fp8(x, w)
    helper = fp8_workers.helpers()[0]
    assert not fp8_workers._broken and helper.bands_done >= 1 and helper.process.poll() is None
    assert np.abs(y - exact(x, w)).max() <= 2e-6 * np.abs(exact(x, w)).max()


def test_a_helper_is_in_a_session_of_its_own_so_ctrl_c_reaches_this_process_alone(shared):
    """A terminal's Ctrl-C goes to its foreground process group: a helper in it printed its own
    KeyboardInterrupt traceback under stepper's "interrupted"."""
    helper = fp8_workers.helpers()[0]
    assert os.getsid(helper.process.pid) == helper.process.pid != os.getsid(0)
    assert os.getpgid(helper.process.pid) != os.getpgid(0)


def test_shares_cover_the_rows_in_whole_scale_blocks():
    w = Fp8Matrix.of(np.zeros((1000, 256), np.uint8), np.ones((8, 2), np.float32))
    for parts in (1, 2, 3, 6, 8, 20):
        cut = fp8_workers.shares([w], parts)
        bands = [band for share in cut for _, band in share]
        assert all(len(share) == 1 for share in cut) and len(cut) == min(parts, 8)
        assert bands[0].start == 0 and bands[-1].end == 1000
        assert all(a.end == b.start and a.end % 128 == 0 for a, b in itertools.pairwise(bands))


def test_shares_of_several_weights_take_their_rows_one_after_another():
    gate, up = (Fp8Matrix.of(np.zeros((2048, 256), np.uint8), np.ones((16, 2), np.float32)) for _ in range(2))
    two = fp8_workers.shares([gate, up], 2)  # one weight each
    assert two == [[(0, fp8_workers.Band(0, 2048))], [(1, fp8_workers.Band(0, 2048))]]
    three = fp8_workers.shares([gate, up], 3)  # 32 blocks: 10, 11, 11
    assert three == [[(0, fp8_workers.Band(0, 1280))],
                     [(0, fp8_workers.Band(1280, 2048)), (1, fp8_workers.Band(0, 640))],
                     [(1, fp8_workers.Band(640, 2048))]]


@pytest.mark.parametrize("tokens", [1, 5, 300])
@pytest.mark.parametrize("processes", [2, 3])
def test_products_of_one_input_with_several_weights_equal_each_dense_product(checkpoint, shared, monkeypatch,
                                                                            tokens, processes):
    """Three weights of one scale block each: on two cores, the helper is sent two bands at once
    (of many tokens), or shares each weight's tiles in turn (of few); on three, one each."""
    monkeypatch.setattr(parallel, "cores", lambda: processes)
    names = [EXPERT.replace("down_proj", name) for name in ("gate_proj", "up_proj")]
    names.append(EXPERT.replace("experts.3", "experts.2").replace("down", "gate"))
    ws = [checkpoint.matrix(name) for name in names]  # [96, 320] each in tiny
    x = np.random.default_rng(tokens).standard_normal((tokens, ws[0].shape[1])).astype(np.float32)
    ys = fp8_matmul.products(x, ws)
    helpers = fp8_workers.helpers()
    assert len(helpers) == processes - 1 and not fp8_workers._broken
    in_turn = processes == 2 and tokens <= 128
    bands = [len(ws)] if in_turn else [len(share) for share in fp8_workers.shares(ws, processes)[1:]]
    assert [helper.bands_done for helper in helpers] == bands == ([3] if in_turn else [2] if processes == 2 else [1, 1])
    assert not any(helper.sent for helper in helpers)
    for y, w in zip(ys, ws, strict=True):
        assert np.abs(y - exact(x, w)).max() <= 2e-6 * np.abs(exact(x, w)).max()


def test_a_layer_with_helpers_equals_the_layer_without(checkpoint, shared, monkeypatch):
    cfg = checkpoint.config
    hidden = np.random.default_rng(1).standard_normal((1, 6, cfg.hidden_size)).astype(np.float32)
    model = Transformer(checkpoint)

    def layer_output():
        emit = Emitter()
        return model.layer(1, hidden, model.rope(np.arange(6), emit), KVCache(cfg.num_hidden_layers), emit, "naive")

    with_helpers = layer_output()
    assert fp8_workers.helpers()[0].bands_done > 5  # the attention's products, and the experts (kernels.experts)
    monkeypatch.setattr(fp8_workers, "SHARE_WORK", 1 << 40)
    alone = layer_output()
    np.testing.assert_array_equal(with_helpers, alone)  # the same tiles, whichever process makes each


def test_a_helper_that_dies_leaves_the_products_here(checkpoint, shared):
    w = checkpoint.matrix(EXPERT)
    x = np.ones((2, w.shape[1]), np.float32)
    linear_fp8(x, w)
    helper = fp8_workers.helpers()[0]
    helper.process.kill()
    helper.process.wait()
    y = linear_fp8(x, w)  # the helper is gone: noticed, and the product is done here
    assert fp8_workers._broken
    assert np.abs(y - exact(x, w)).max() <= 2e-6 * np.abs(exact(x, w)).max()


def test_scratch_grows_for_long_inputs(checkpoint, shared):
    w = checkpoint.matrix(EXPERT)
    x = np.random.default_rng(5).standard_normal((50_000, w.shape[1])).astype(np.float32)  # 19 MB of inputs
    y = linear_fp8(x, w)
    assert len(fp8_workers.helpers()[0].scratch) >= x.nbytes > 1 << 24  # grown past its first 16 MiB
    assert np.abs(y - exact(x, w)).max() <= 2e-6 * np.abs(exact(x, w)).max()


def test_a_helper_that_reports_an_error_leaves_the_products_here(checkpoint, shared, tmp_path):
    w = checkpoint.matrix(EXPERT)
    gone = Fp8Matrix(w.codes, w.scale_inv, w.block,
                     origin=FileBytes(str(tmp_path / "gone.safetensors"), 0, (0, 0, 0, 0)))
    x = np.random.default_rng(6).standard_normal((3, w.shape[1])).astype(np.float32)
    y = linear_fp8(x, gone)
    assert fp8_workers._broken and fp8_workers.helpers()[0].process.poll() is None  # it answered, and lives on
    assert np.abs(y - exact(x, w)).max() <= 2e-6 * np.abs(exact(x, w)).max()


def test_a_file_replaced_after_it_was_read_is_not_mapped_by_the_helper(shared, tmp_path):
    """This process still maps the file it read; the helper would map what the path holds now."""
    folder = synth_checkpoint(SyntheticWeights(preset("tiny"), 4), tmp_path / "tiny")
    read = Checkpoint(folder)
    w = read.matrix(EXPERT)
    x = np.random.default_rng(7).standard_normal((5, w.shape[1])).astype(np.float32)
    want = exact(x, w)
    shard = read.shard_of(EXPERT).path
    replacement = bytearray(shard.read_bytes())
    start, end = read.shard_of(EXPERT).data_range(EXPERT)
    replacement[start:end] = bytes(end - start)  # the expert's codes all zero in the new file
    (tmp_path / "new").write_bytes(replacement)
    (tmp_path / "new").replace(shard)
    y = linear_fp8(x, w)
    assert fp8_workers._broken and fp8_workers.helpers()[0].process.poll() is None  # refused, and lives on
    assert np.abs(y - want).max() <= 2e-6 * np.abs(want).max()


@pytest.fixture
def slow_front(monkeypatch):
    """This process takes its first tile only once the helper has taken one from the back (however
    busy the machine: a minute at most, a guard against a helper that never starts)."""
    import time

    taken_from_the_front = fp8_workers.from_the_front

    def slowly(claims):
        take, tiles = taken_from_the_front(claims), int(claims[1])

        def take_slowly():
            deadline = time.monotonic() + 60
            while claims[1] == tiles and time.monotonic() < deadline:
                time.sleep(0.01)
            return take()
        return take_slowly
    monkeypatch.setattr(fp8_workers, "from_the_front", slowly)


def test_tiles_taken_from_both_ends_make_the_dense_product(checkpoint, shared, slow_front):
    w = checkpoint.matrix(EXPERT)  # three tiles
    x = np.random.default_rng(9).standard_normal((3, w.shape[1])).astype(np.float32)
    y = linear_fp8(x, w)
    helper = fp8_workers.helpers()[0]
    assert not fp8_workers._broken and helper.claims()[1] < 3  # the helper took the last tile or more
    assert np.abs(y - exact(x, w)).max() <= 2e-6 * np.abs(exact(x, w)).max()


def test_nan_codes_in_the_helpers_tiles_are_found_and_not_forgotten(checkpoint, shared, slow_front, tmp_path):
    import shutil

    folder = tmp_path / "poisoned"
    shutil.copytree(checkpoint.path, folder)
    poisoned = Checkpoint(folder)
    shard = poisoned.shard_of(EXPERT)
    last_row = shard.data_range(EXPERT)[0] + (poisoned.matrix(EXPERT).shape[0] - 1) * poisoned.matrix(EXPERT).shape[1]
    with open(shard.path, "r+b") as f:  # a NaN code in the last row, before anything maps the file
        f.seek(last_row + 5)
        f.write(b"\x7f")
    poisoned = Checkpoint(folder)
    w = poisoned.matrix(EXPERT)
    x = np.ones((1, w.shape[1]), np.float32)
    for _ in range(2):  # the second time too: the weight is not remembered as free of NaN codes
        y = linear_fp8(x, w)[0]
        assert fp8_workers.helpers()[0].claims()[1] < 3 and not fp8_workers._broken
        assert np.flatnonzero(np.isnan(y)).tolist() == [w.shape[0] - 1]
