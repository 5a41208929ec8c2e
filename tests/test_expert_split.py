"""Routed experts dealt out across processes (expert_split): same output, helpers or not."""

import numpy as np
import pytest

from stepper import expert_split, fp8_workers, parallel
from stepper.checkpoint import Checkpoint
from stepper.expert_split import deal, experts_across_cores
from stepper.model import KVCache, Transformer
from stepper.ops import swiglu
from stepper.presets import preset
from stepper.synth import synth_checkpoint
from stepper.trace import Emitter
from stepper.weights import SyntheticWeights

EXPERT = "model.layers.1.mlp.experts.{}.{}_proj.weight"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return Checkpoint(synth_checkpoint(SyntheticWeights(preset("tiny"), 2), tmp_path_factory.mktemp("ckpt") / "tiny"))


@pytest.fixture
def shared(monkeypatch):
    if parallel.cores() < 2:
        pytest.skip("helpers need two cores")
    monkeypatch.setattr(fp8_workers, "SHARE_WEIGHTS", 0)
    monkeypatch.setattr(expert_split, "MIN_DEALT", 0)  # tiny's few experts are dealt out too
    fp8_workers.stop_helpers()
    yield
    fp8_workers.stop_helpers()


def test_experts_are_dealt_costliest_first_to_the_least_loaded():
    assert deal([1] * 8, 2) == [0, 1, 0, 1, 0, 1, 0, 1]
    # costs are 14 + tokens: 24 to process 0; 15 to 1 (loads 24, 15); 15 to 1 (24, 30); 15 to 0 (39, 30)
    assert deal([10, 1, 1, 1], 2) == [0, 1, 1, 0]
    assert deal([5, 5, 5], 1) == [0, 0, 0]
    assert sorted(deal([3] * 9, 3)) == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def layer_output(checkpoint, tokens=6):
    cfg = checkpoint.config
    hidden = np.random.default_rng(1).standard_normal((1, tokens, cfg.hidden_size)).astype(np.float32)
    model, emit = Transformer(checkpoint), Emitter()
    return model.layer(1, hidden, model.rope(np.arange(tokens), emit), KVCache(cfg.num_hidden_layers), emit, "naive")


def test_a_layer_with_experts_dealt_out_equals_the_layer_in_one_process(checkpoint, shared, monkeypatch):
    dealt = layer_output(checkpoint)
    helper = fp8_workers.helpers()[0]
    assert helper.experts_sent >= 2 and not fp8_workers._broken
    monkeypatch.setattr(fp8_workers, "SHARE_WEIGHTS", 1 << 40)
    alone = layer_output(checkpoint)
    assert np.abs(dealt - alone).max() <= 1e-5 * np.abs(alone).max()


def experts(checkpoint, count):
    return [tuple(checkpoint.matrix(EXPERT.format(e, proj)) for proj in ("gate", "up", "down")) for e in range(count)]


def test_experts_given_to_a_helper_that_dies_run_here(checkpoint, shared):
    cfg = checkpoint.config
    x = np.random.default_rng(3).standard_normal((4, cfg.hidden_size)).astype(np.float32)
    rows, weights = np.arange(4), np.full(4, 0.5, np.float32)
    whole = sum(swiglu(x, *m) * 0.5 for m in experts(checkpoint, 4))
    out = np.zeros_like(x)
    with experts_across_cores(x, [4] * 4) as cores:
        for i, matrices in enumerate(experts(checkpoint, 4)):
            if cores.here(i, rows, weights, *matrices):
                out += swiglu(x, *matrices) * 0.5
        helper = fp8_workers.helpers()[0]
        helper.process.kill()
        helper.process.wait()
        cores.add_theirs(out)  # the helper is gone: its two experts run here
    assert fp8_workers._broken and helper.experts_sent == 2
    assert np.abs(out - whole).max() <= 1e-5 * np.abs(whole).max()


def test_an_interrupt_inside_stops_the_use_of_helpers(checkpoint, shared):
    x = np.ones((2, checkpoint.config.hidden_size), np.float32)
    with pytest.raises(KeyboardInterrupt), experts_across_cores(x, [2, 2]) as cores:
        cores.here(1, np.arange(2), np.ones(2, np.float32), *experts(checkpoint, 1)[0])
        raise KeyboardInterrupt
    assert fp8_workers._broken


def test_few_experts_stay_with_the_bands(checkpoint, shared, monkeypatch):
    monkeypatch.setattr(expert_split, "MIN_DEALT", 1000)
    layer_output(checkpoint)
    helper = fp8_workers.helpers()[0]
    assert helper.experts_sent == 0 and helper.bands_done > 3
