"""A shown attention's weights gathered in the helper process (kernels.gather_workers) while this
process gathers its scores: the same figures, to the bit, as those gathered here; and a helper
that fails on the way leaves them the same."""

import numpy as np
import pytest

from stepper import prefill
from stepper.kernels import attention as kernels
from stepper.kernels import fp8_workers, gather_workers, parallel
from stepper.seams.trace import Emitter, Event
from stepper.tensors import statistics
from stepper.tensors.statistics import Gather
from stepper.tensors.tiled import Tiled

PADS = {"self_attn.attn_scores": -np.inf, "self_attn.attn_weights": 0.0}
NAMES = ("self_attn.attn_scores", "self_attn.attn_weights")


@pytest.fixture
def beside(monkeypatch):
    """Every tiled tensor after the first goes to the helper (a test's are below the size)."""
    if parallel.cores() < 2:
        pytest.skip("the helper needs two cores")
    monkeypatch.setattr(gather_workers, "BESIDE_VALUES", 0)
    fp8_workers.stop_helpers()
    used = []
    in_helper = gather_workers.in_helper
    monkeypatch.setattr(gather_workers, "in_helper", lambda *args: used.append(1) or in_helper(*args))
    yield used
    fp8_workers.stop_helpers()


def operands() -> kernels.Operands:
    """An absorbed attention of 8 heads, 128 queries after 896 cached keys: its scores and weights
    are 8 blocks each (statistics.CHUNK), masked, the weights spanning many binades."""
    rng = np.random.default_rng(5)
    latents, k_pe = rng.standard_normal((1, 1, 1024, 16), np.float32), rng.standard_normal((1, 1, 1024, 4), np.float32)
    queries = [rng.standard_normal((1, 8, 128, 16), np.float32) * 4, rng.standard_normal((1, 8, 128, 4), np.float32)]
    return kernels.Operands(queries, [latents, k_pe], latents, 0.25)


def figures() -> dict[str, tuple]:
    """The scores' and weights' figures as a shown prefill's flush gathers them."""
    ops = operands()
    gathered = prefill.Gathered(Emitter([lambda e: None]), PADS)
    gathered(Event(f"layers.0.{NAMES[0]}", NAMES[0], Tiled(ops.shape, ops.rows), 0))
    gathered(Event(f"layers.0.{NAMES[1]}", NAMES[1], Tiled(ops.shape, kernels.Softmaxed(ops).weights), 0))
    return {name: described(gathered.parts[f"layers.0.{name}"].gather) for name in NAMES}


def described(gather: Gather) -> tuple:
    bins = gather.bins.kept()
    return gather.stats(), gather.finite, bins.exponent, bins.base, bins.counts.tolist()


def test_the_weights_gathered_in_the_helper_have_the_figures_gathered_here(beside, monkeypatch):
    in_the_helper = figures()
    assert beside and not fp8_workers._broken
    monkeypatch.setattr(gather_workers, "BESIDE_VALUES", 1 << 60)
    here = figures()
    assert len(beside) == 1  # the helper was not asked again
    assert in_the_helper == here
    assert np.prod(operands().shape) == 8 * statistics.CHUNK  # 8 blocks each
    stats = here[NAMES[1]][0]
    assert stats.min == 0.0 and 0 < stats.mean < 1 and stats.nan == 0  # the weights, their masked future 0


def test_a_helper_that_dies_while_gathering_leaves_the_figures_right(beside, monkeypatch):
    answered = gather_workers.answered
    answers = []

    def dying(conn):
        answers.append(1)
        if len(answers) == 3:  # three blocks in: the helper is killed, its gather lost
            helper = fp8_workers.helpers()[0]
            helper.process.kill()
            helper.process.wait()
        answered(conn)
    monkeypatch.setattr(gather_workers, "answered", dying)
    after_failure = figures()
    assert beside and fp8_workers._broken and len(answers) == 3
    monkeypatch.setattr(gather_workers, "BESIDE_VALUES", 1 << 60)
    assert after_failure == figures()


def test_blocks_of_integers_and_of_float64_are_gathered_in_the_helper_as_here(beside):
    rng = np.random.default_rng(9)
    integers = [rng.integers(-300, 5000, 70_000).astype(np.float32) for _ in range(3)]
    wide = [rng.standard_normal(50_000) * 1e200 for _ in range(3)]
    first = [rng.standard_normal(1000).astype(np.float32) for _ in range(3)]
    taken = Gather()
    gathers = gather_workers.gathered_beside(first, taken.add, [lambda: iter(integers), lambda: iter(wide)],
                                             [True, False], 0)
    assert beside
    for gather, blocks, integer in zip(gathers, (integers, wide), (True, False)):
        here = Gather(integer)
        for block in blocks:
            here.add(block)
        assert described(gather) == described(here)
    here = Gather()
    for block in first:
        here.add(block)
    assert described(taken) == described(here)
