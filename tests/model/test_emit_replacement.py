"""The model goes on with what emit returns: a tensor a sink replaces changes what follows it."""

import numpy as np
import pytest

from stepper.model import KVCache, Transformer
from stepper.presets import preset
from stepper.seams.trace import Emitter, Recorder
from stepper.weights.seeded import SyntheticWeights

IDS, POSITIONS = np.array([[3, 14, 15, 92, 65]]), np.arange(5)


def replacement(key: str, array: np.ndarray, experts: int) -> np.ndarray:
    """Something else of the same shape and dtype, whose change reaches the logits."""
    if key == "mlp.gate.topk_idx":
        return (array + 1) % experts
    if key == "mlp.gate.group_mask":
        return np.float32(1) - array  # the other groups
    if key == "mlp.gate.group_scores":
        return -array  # the worst groups
    return np.full_like(array, np.nan)


@pytest.fixture(scope="module")
def model():
    return Transformer(SyntheticWeights(preset("tiny-v3"), seed=2))


def patched(name: str, experts: int):
    """A sink replacing the tensor `name` and no other."""
    def patch(event):
        return replacement(event.key, event.array, experts) if event.name == name else None

    return patch


@pytest.mark.parametrize("attn", ["naive", "absorb"])
@pytest.mark.parametrize("layer", [0, 1])  # a dense and a MoE layer
def test_every_tensor_of_a_layer_a_sink_replaces_changes_its_output(model, attn, layer):
    hidden, rope = model.embed(IDS), model.rope(POSITIONS, Emitter())
    rec = Recorder()
    plain = model.layer(layer, hidden, rope, KVCache(3), Emitter([rec]), attn)
    unchanged = []
    for event in rec.events:
        with np.errstate(invalid="ignore"):
            out = model.layer(layer, hidden, rope, KVCache(3),
                              Emitter([patched(event.name, model.config.n_routed_experts)]), attn)
        if np.array_equal(out, plain):
            unchanged.append(event.name)
    assert len(rec.events) > 20 and unchanged == []


def test_every_tensor_outside_the_layers_a_sink_replaces_changes_the_logits(model):
    rec = Recorder()
    plain = model.forward(IDS, POSITIONS, Emitter([rec]))
    outside = [e.name for e in rec.events if not e.name.startswith("layers.")]
    assert outside == ["embed", "rope_cos", "rope_sin", "norm", "logits"]
    for name in outside:
        with np.errstate(invalid="ignore"):
            assert not np.array_equal(model.forward(IDS, POSITIONS,
                                                    Emitter([patched(name, model.config.n_routed_experts)])),
                                                    plain), name
