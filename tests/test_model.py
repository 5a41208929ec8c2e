"""Whole-model properties that need no reference: the cache, positions, batching, laziness."""

import numpy as np
import pytest

from stepper.model import KVCache, Transformer
from stepper.presets import preset
from stepper.session import RunSpec, run
from stepper.trace import Emitter, Recorder
from stepper.weights import SyntheticWeights


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def trace(model, ids, positions, cache=None):
    rec = Recorder()
    logits = model.forward(np.array(ids), np.array(positions), Emitter([rec]), cache)
    return logits, rec.tensors()


@pytest.mark.parametrize("name", ["tiny", "tiny-v3"])
@pytest.mark.parametrize("start", [0, 5000])
def test_decode_with_cache_equals_uncached_prefill(name, start):
    model = Transformer(SyntheticWeights(preset(name), seed=3))
    ids = [[11, 22, 33, 44, 55, 66]]
    full_logits, full = trace(model, ids, start + np.arange(6))

    cache = KVCache(model.config.num_hidden_layers)
    trace(model, [ids[0][:4]], start + np.arange(4), cache)
    for t in (4, 5):
        logits, step = trace(model, [[ids[0][t]]], [start + t], cache)
        for key in ("layers.0.output", "layers.2.output", "layers.2.self_attn.attn_output"):
            assert rel_err(step[key][:, -1], full[key][:, t]) < 1e-5, (key, t)
        assert step["layers.1.self_attn.key_states"].shape[2] == t + 1
        assert rel_err(logits[0, -1], full_logits[0, t]) < 1e-5
    assert cache.length() == 6


def test_batch_rows_are_independent():
    model = Transformer(SyntheticWeights(preset("tiny"), seed=1))
    a, b = [5, 6, 7], [900, 1, 42]
    both, _ = trace(model, [a, b], np.arange(3))
    alone, _ = trace(model, [b], np.arange(3))
    assert rel_err(both[1], alone[0]) < 1e-5


def test_position_changes_attention_only_through_rope():
    model = Transformer(SyntheticWeights(preset("tiny"), seed=1))
    _, near = trace(model, [[1, 2, 3]], np.arange(3))
    _, far = trace(model, [[1, 2, 3]], 6000 + np.arange(3))
    assert np.array_equal(near["layers.0.self_attn.q_pe"], far["layers.0.self_attn.q_pe"])
    assert not np.allclose(near["layers.0.self_attn.q_pe_rope"], far["layers.0.self_attn.q_pe_rope"])
    # the first token attends only to itself wherever it is
    assert np.all(far["layers.0.self_attn.attn_weights"][..., 0, 0] == 1.0)


def test_only_chosen_experts_are_read():
    seen = []

    class Spy(SyntheticWeights):
        def get(self, name):
            seen.append(name)
            return super().get(name)

    rec = Recorder()
    run(RunSpec(prompt_len=2), [rec], Spy(preset("tiny"), 0))
    chosen = {int(e) for e in rec.tensors()["layers.1.mlp.gate.topk_idx"].ravel()}
    read = {int(n.split(".")[5]) for n in seen if n.startswith("model.layers.1.mlp.experts.")}
    assert read == chosen and len(read) < preset("tiny").n_routed_experts


def test_router_bias_is_not_degenerate():
    """Synthetic weights make routing informative: the bias changes some choices, loads spread."""
    rec = Recorder()
    run(RunSpec(prompt_len=32), [rec])
    t = rec.tensors()
    idx = t["layers.1.mlp.gate.topk_idx"]
    unbiased = np.argsort(-t["layers.1.mlp.gate.scores"], axis=1, kind="stable")[:, : idx.shape[1]]
    changed = [set(a) != set(b) for a, b in zip(idx.tolist(), unbiased.tolist())]
    assert 0 < sum(changed) < len(changed)
    assert len(np.unique(idx)) > idx.shape[1] * 2
    weights = t["layers.0.self_attn.attn_weights"][0, :, -1]
    assert weights.max() < 0.99 and weights.max() > 2.0 / weights.shape[-1]


def test_run_decodes_greedily_and_names_phases():
    rec = Recorder()
    result = run(RunSpec(prompt_len=3, decode=2), [rec])
    names = [e.name for e in rec.events]
    assert names[0] == "prefill.embed" and "decode1.logits" in names
    t = rec.tensors()
    assert result.generated[0] == int(np.argmax(t["prefill.logits"][0, -1]))
    assert result.generated[1] == int(np.argmax(t["decode0.logits"][0, -1]))
    assert t["decode1.layers.0.self_attn.key_states"].shape[2] == 5
