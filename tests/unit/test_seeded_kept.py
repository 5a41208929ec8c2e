"""Seeded weights are made once a run and kept, within a bound: a decode step reads the weights
the step before read, and making one (normals, FP8 or INT4 rounding) cost more than the step's
products (tiny, 20 decode steps: each weight was made 8 times on average). Counted, not timed."""

from collections import Counter

import numpy as np
import pytest

import stepper
from stepper.planning import memory, plan_run
from stepper.session import RunSpec
from stepper.weights.seeded import KEPT_BYTES, SyntheticWeights, stored_size


@pytest.fixture
def made(monkeypatch):
    """How many times each weight was made, by each source (the run's, and the miniatures' whose
    runs derive the names a run emits)."""
    counts: Counter[tuple[int, str]] = Counter()
    make = SyntheticWeights._made

    def counted(self, name):
        counts[id(self), name] += 1
        return make(self, name)

    monkeypatch.setattr(SyntheticWeights, "_made", counted)
    return counts


@pytest.mark.parametrize("model", ["tiny", "tiny-int4", "tiny-kimi-linear"])
def test_a_decode_run_makes_each_weight_once(made, model):
    stepper.run(model, decode=3, keep="*logits")
    assert made and max(made.values()) == 1


def test_without_room_weights_are_made_again_and_the_run_is_the_same_bit_for_bit(made, monkeypatch):
    kept = stepper.run("tiny", decode=3, keep="*logits")
    once = sum(made.values())
    made.clear()
    monkeypatch.setattr(memory, "SEEDED_SHARE", 2**62)  # no room for them: nothing kept
    remade = stepper.run("tiny", decode=3, keep="*logits")
    assert sum(made.values()) > once and max(made.values()) >= 4  # each step made the attention's weights again
    for name in kept.names:
        assert np.array_equal(kept[name], remade[name])


def test_what_is_kept_stays_within_the_plans_share_of_the_memory_available(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda: 2**30)
    plan = plan_run(RunSpec(model="tiny", decode=2)).plan
    assert plan.weights.kept_limit == 2**30 // memory.SEEDED_SHARE <= KEPT_BYTES
    needs = [n.bytes for n in memory.needs(plan, [], "--prompt-len") if n.what.startswith("the seeded weights")]
    assert needs == [plan.weights.kept_bound(range(3))] and 0 < needs[0] < plan.weights.kept_limit  # all of tiny's
    monkeypatch.setattr(memory, "available_bytes", lambda: 4 * 2**20)
    weights = plan_run(RunSpec(model="tiny", decode=2)).plan.weights
    assert weights.kept_limit == 2**18  # a sixteenth of 4 MiB
    for expert in range(32):
        weights.stored(f"model.layers.1.mlp.experts.{expert}.up_proj.weight")  # 33 KiB each, stored
    assert 2**18 - 2**16 < weights.kept_bytes <= 2**18
    assert sum(stored_size(s) for s in weights.kept.values()) == weights.kept_bytes
    assert "model.layers.1.mlp.experts.0.up_proj.weight" not in weights.kept  # the least recently used let go


def test_a_kept_weight_is_read_only_and_equal_to_one_made_afresh():
    weights = SyntheticWeights(stepper.session.preset_config("tiny"))
    name = "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"
    first = weights.stored(name)
    assert weights.stored(name) is first
    with pytest.raises(ValueError, match="read-only"):
        first.data[0, 0] = 0
    fresh = SyntheticWeights(weights.config)._made(name)
    assert np.array_equal(first.data.view(np.uint8), fresh.data.view(np.uint8))
    assert np.array_equal(first.scale_inv, fresh.scale_inv)
