"""Whole experts shared with the helper process (kernels.experts): the bits one process gives alone,
whichever process takes which expert and which of the finale's tiles, NaN codes found on either side,
and the cases that stay in one process."""

import shutil
import time

import numpy as np
import pytest

from stepper import fp8
from stepper.kernels import experts, fp8_workers, parallel
from stepper.presets import preset
from stepper.seams.swap import swapped
from stepper.weights.checkpoint import Checkpoint
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.synth_checkpoint import synth_checkpoint

LAYER = "model.layers.1.mlp."
SHARED_DOWN = LAYER + "shared_experts.down_proj.weight"  # tiny's [320, 96]: three tiles of scale rows


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return synth_checkpoint(SyntheticWeights(preset("tiny"), 4), tmp_path_factory.mktemp("ckpt") / "tiny")


@pytest.fixture
def shared(monkeypatch):
    """Every product with a file behind it may go to the helper (tiny's are below the size)."""
    if parallel.cores() < 2:
        pytest.skip("helpers need two cores")
    monkeypatch.setattr(parallel, "cores", lambda: 2)
    monkeypatch.setattr(fp8_workers, "SHARE_WORK", 0)
    fp8_workers.stop_helpers()
    yield
    fp8_workers.stop_helpers()


def wait_for_the_back(claims: np.ndarray, last: int) -> None:
    """Until the helper has taken something from the back, if anything is left (a minute at most: a
    guard against a helper that never starts)."""
    deadline = time.monotonic() + 60
    while claims[1] == last and claims[0] < claims[1] and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.fixture
def slow_front(monkeypatch):
    """This process takes its first expert, and its first tile of each of the finale's runs, only once
    the helper has taken one from the back: the helper then makes some of each."""
    whole, tiles = experts.from_the_front, experts.taken

    def experts_slowly(claims):
        take, last = whole(claims), int(claims[1])
        return lambda: (wait_for_the_back(claims, last), take())[1]

    def tiles_slowly(claims, front, first, stop):
        take, last = tiles(claims, front, first, stop), int(claims[1])
        return (lambda: (wait_for_the_back(claims, last), take())[1]) if front else take

    monkeypatch.setattr(experts, "from_the_front", experts_slowly)
    monkeypatch.setattr(experts, "taken", tiles_slowly)


def groups_of(n: int, seed: int, chosen: int = 7) -> list:
    """`chosen` experts, each on some of n tokens with routing weights, and the shared expert on all."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(chosen):
        rows = np.sort(rng.choice(n, int(rng.integers(1, n + 1)), replace=False))
        out.append((rows, rng.random(len(rows)).astype(np.float32)))
    return [*out, (np.arange(n), None)]


def matrices_of(checkpoint: Checkpoint, count: int):
    prefixes = [f"{LAYER}experts.{e}." for e in range(3, 3 + count - 1)] + [f"{LAYER}shared_experts."]
    return lambda i: tuple(checkpoint.matrix(prefixes[i] + f"{p}_proj.weight") for p in ("gate", "up", "down"))


def swiglus(checkpoint: Checkpoint, tokens: np.ndarray, groups: list) -> list[np.ndarray]:
    done = []
    ys = list(experts.swiglus(tokens, groups, matrices_of(checkpoint, len(groups)), done.append))
    assert all(0 <= d <= len(groups) for d in done)
    return ys


def alone(checkpoint: Checkpoint, tokens: np.ndarray, groups: list) -> list[np.ndarray]:
    with fp8_workers.here():
        return swiglus(checkpoint, tokens, groups)


def expert_claims() -> np.ndarray:
    return np.frombuffer(fp8_workers.helpers()[0].scratch, np.int64, 6)


@pytest.mark.parametrize("tokens", [1, 6, 40])
def test_whole_experts_shared_are_the_bits_of_one_process(folder, shared, tokens):
    checkpoint = Checkpoint(folder)
    x = np.random.default_rng(tokens).standard_normal((tokens, 320)).astype(np.float32)
    groups = groups_of(tokens, tokens)
    ys = swiglus(checkpoint, x, groups)
    assert fp8_workers.helpers()[0].bands_done == 1 and not fp8_workers._broken  # one experts message
    want = alone(checkpoint, x, groups)
    assert [y.shape for y in ys] == [(len(rows), 320) for rows, _ in groups]
    for y, w in zip(ys, want, strict=True):
        np.testing.assert_array_equal(y, w)
    # and the readable SwiGLU, in float64 from the dequantized weights
    gate, up, down = (w.dequantize().astype(np.float64) for w in matrices_of(checkpoint, len(groups))(0))
    rows, weights = groups[0]
    h = x[rows].astype(np.float64) @ gate.T
    exact = ((h / (1 + np.exp(-h))) * (x[rows] @ up.T) * weights[:, None]) @ down.T
    assert np.abs(ys[0] - exact).max() <= 1e-5 * np.abs(exact).max()


def test_the_helper_takes_experts_and_the_finales_tiles(folder, shared, slow_front):
    checkpoint = Checkpoint(folder)
    x = np.random.default_rng(3).standard_normal((6, 320)).astype(np.float32)
    groups = groups_of(6, 3)
    ys = swiglus(checkpoint, x, groups)
    claims = expert_claims()
    assert claims[1] < len(groups) - 1  # the helper took the last whole experts
    assert claims[3] < 2 and claims[5] < 3  # and the finale's last gate-or-up tile and last down tile
    for y, w in zip(ys, alone(checkpoint, x, groups), strict=True):
        np.testing.assert_array_equal(y, w)


def test_nan_codes_in_the_helpers_finale_tiles_are_found_and_not_forgotten(folder, shared, slow_front, tmp_path):
    poisoned_folder = tmp_path / "poisoned"
    shutil.copytree(folder, poisoned_folder)
    checkpoint = Checkpoint(poisoned_folder)
    shard = checkpoint.shard_of(SHARED_DOWN)
    rows, columns = checkpoint.matrix(SHARED_DOWN).shape
    with open(shard.path, "r+b") as f:  # a NaN code in down's last row, before anything maps the file
        f.seek(shard.data_range(SHARED_DOWN)[0] + (rows - 1) * columns + 5)
        f.write(b"\x7f")
    checkpoint = Checkpoint(poisoned_folder)
    x = np.random.default_rng(4).standard_normal((5, 320)).astype(np.float32)
    groups = groups_of(5, 4, chosen=2)
    shared_y = swiglus(checkpoint, x, groups)[-1]
    assert expert_claims()[5] < 3 and not fp8_workers._broken  # the helper took the last tile
    assert np.unique(np.nonzero(np.isnan(shared_y))[1]).tolist() == [rows - 1]
    # then this process alone: down was not remembered here as free of NaN codes, so they are looked for
    assert np.unique(np.nonzero(np.isnan(alone(checkpoint, x, groups)[-1]))[1]).tolist() == [rows - 1]


def test_a_dead_helper_leaves_the_experts_here(folder, shared):
    checkpoint = Checkpoint(folder)
    x = np.random.default_rng(5).standard_normal((4, 320)).astype(np.float32)
    groups = groups_of(4, 5)
    helper = fp8_workers.helpers()[0]
    helper.process.kill()
    helper.process.wait()
    ys = swiglus(checkpoint, x, groups)
    assert fp8_workers._broken
    for y, w in zip(ys, alone(checkpoint, x, groups), strict=True):
        np.testing.assert_array_equal(y, w)


def test_one_process_when_a_learners_decode_runs_or_the_results_are_large(folder, shared, monkeypatch):
    checkpoint = Checkpoint(folder)
    x = np.random.default_rng(6).standard_normal((4, 320)).astype(np.float32)
    groups = groups_of(4, 6)
    with swapped({"decode": fp8.decode.__wrapped__}):
        assert experts.whole_experts(x, groups, matrices_of(checkpoint, len(groups)), lambda done: None) is None
    looked_up = []

    def matrices(i):
        looked_up.append(i)
        return matrices_of(checkpoint, len(groups))(i)

    monkeypatch.setattr(experts, "RESIDENT_BYTES", 3 * 3 * 320 * 96)  # three experts' codes
    assert experts.whole_experts(x, groups, matrices, lambda done: None) is None
    assert looked_up == [0, 1, 2, 3]  # no more looked up than the reader keeps mapped, and one
    monkeypatch.setattr(experts, "SHARED_RESULTS_BYTES", 4 * 320 * 8)
    assert experts.whole_experts(x, groups, matrices_of(checkpoint, len(groups)), lambda done: None) is None
    monkeypatch.setattr(parallel, "cores", lambda: 3)  # two helpers: products shared tile by tile instead
    assert experts.whole_experts(x, groups, matrices_of(checkpoint, len(groups)), lambda done: None) is None


def test_inputs_with_infinities_leave_the_finale_whole_and_the_same(folder, shared):
    """A token holding inf has no safe power of two for the tiles (fp8_matmul.input_rebias): the
    shared expert is then one more whole expert, its products made the readable way, as alone."""
    checkpoint = Checkpoint(folder)
    x = np.random.default_rng(7).standard_normal((5, 320)).astype(np.float32)
    x[2, 7] = np.inf
    groups = groups_of(5, 7)
    with np.errstate(invalid="ignore"):  # inf - inf in the products: NaN, as meant
        ys, want = swiglus(checkpoint, x, groups), alone(checkpoint, x, groups)
    assert not fp8_workers._broken and fp8_workers.helpers()[0].bands_done == 1
    for y, w in zip(ys, want, strict=True):
        np.testing.assert_array_equal(y, w)
    assert np.isnan(ys[-1][2]).any() and np.isfinite(np.delete(ys[-1], 2, axis=0)).all()
