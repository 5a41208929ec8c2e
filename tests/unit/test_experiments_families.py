"""The experiment helpers on the 2026 families' own layers: DeepSeek-V4's routers (`ffn.gate.*`:
hash layers' hash_idx, score layers' topk_idx and biased_scores) and heads (`attn.output`), and
Kimi Linear's KDA heads (`self_attn.gated_output`). Each checked against what the changed
tensor's part would be, computed by hand from the run's kept tensors and the weights."""

import numpy as np
import pytest
from helpers.changed_weights import Changed

import stepper
from stepper.errors import StepperError
from stepper.families.deepseek_v4_synth import V4Synthetic
from stepper.model.ops import silu
from stepper.presets import preset
from stepper.session import preset_config
from stepper.weights.seeded import SyntheticWeights

IDS = [17, 40, 99, 3, 5, 6]  # tiny-v4's vocabulary is 256 tokens
N = len(IDS)
V4 = V4Synthetic(preset_config("tiny-v4"), seed=0)  # the weights a tiny-v4 run reads
KIMI = SyntheticWeights(preset("tiny-kimi-linear"), 0)


@pytest.fixture(scope="module")
def plain():
    return stepper.run("tiny-v4", ids=IDS, decode=1)


def v4(name: str) -> np.ndarray:
    return V4.get(name).astype(np.float64)


def v4_expert(x: np.ndarray, layer: int, e: int) -> np.ndarray:
    """w2(silu(min(w1 x, L)) * clip(w3 x, -L, L)) in float64.  [N, d] -> [N, d]"""
    p, limit = f"model.layers.{layer}.mlp.experts.{e}.", V4.config.swiglu_limit
    gate, up = x @ v4(p + "gate_proj.weight").T, x @ v4(p + "up_proj.weight").T
    return (silu(np.minimum(gate, limit)) * np.clip(up, -limit, limit)) @ v4(p + "down_proj.weight").T


def tokens(run, name: str) -> np.ndarray:
    return run[name].reshape(-1, run[name].shape[-1]).astype(np.float64)  # [B, T, d] -> [N, d]


@pytest.mark.parametrize(("layer", "choice"), [(0, "hash_idx"), (2, "topk_idx")])
def test_zero_expert_on_v4_takes_exactly_that_experts_weighted_part_from_routed_output(plain, layer, choice):
    """Layer 0 is hash-routed (tid2eid's row for each token), layer 2 score-routed: either way the
    expert's weight is 0 wherever chosen, and routed_output loses its weighted output, no more."""
    at = f"prefill.layers.{layer}.ffn."
    chosen, weights = plain[at + f"gate.{choice}"], plain[at + "gate.weights"]
    e = int(chosen[0, 0])
    run = stepper.run("tiny-v4", ids=IDS, decode=1, patch=stepper.zero_expert(layer, e))
    assert np.array_equal(run[at + f"gate.{choice}"], chosen)
    assert np.array_equal(run[at + "gate.weights"], np.where(chosen == e, 0, weights))
    weight = np.where(chosen == e, weights, 0).sum(axis=1, keepdims=True)  # [N, 1]: e's weight per token, or 0
    part = weight * v4_expert(tokens(plain, at.removesuffix("ffn.") + "ffn_norm"), layer, e)  # [N, d]
    np.testing.assert_allclose(tokens(plain, at + "routed_output") - tokens(run, at + "routed_output"), part,
                               rtol=1e-4, atol=1e-6)
    assert np.abs(part).max() > 0.01
    assert sorted(run.patched) == sorted(f"layers.{layer}.ffn.gate.{n}" for n in ("logits", choice, "weights"))


def test_zero_expert_on_v4_holds_in_the_decode_step():
    """The decode step's token chooses by its own hash row: where it chose the expert, its weight is 0,
    and routed_output is the other chosen experts' weighted sum."""
    e = 13  # in the hash row of the token tiny-v4 generates after IDS
    run = stepper.run("tiny-v4", ids=IDS, decode=1, patch=stepper.zero_expert(0, e))
    at = "decode0.layers.0.ffn."
    chosen, weights = run[at + "gate.hash_idx"], run[at + "gate.weights"]
    assert e in chosen and np.all(weights[chosen == e] == 0) and np.all(weights[chosen != e] > 0)
    x = tokens(run, "decode0.layers.0.ffn_norm")
    by_hand = sum(weights[:, [k]] * v4_expert(x, 0, int(chosen[0, k])) for k in range(chosen.shape[1]))
    np.testing.assert_allclose(tokens(run, at + "routed_output"), by_hand, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(("layer", "choice"), [(0, "hash_idx"), (2, "topk_idx")])
def test_force_experts_on_v4_weighs_the_forced_experts_by_the_gates_scores(plain, layer, choice):
    """In a hash layer the forced choice stands for tid2eid's rows: the gate's scores still weigh
    the experts, normalised to sum 1 and times routed_scaling_factor, as in a score layer."""
    forced = [15, 2, 9, 4]
    run = stepper.run("tiny-v4", ids=IDS, decode=1, patch=stepper.force_experts(layer, forced))
    for phase in ("prefill", "decode0"):
        at = f"{phase}.layers.{layer}.ffn."
        assert np.all(run[at + f"gate.{choice}"] == forced)
        scores = run[at + "gate.scores"].astype(np.float64)[:, forced]  # [N, k]
        weights = scores / scores.sum(axis=1, keepdims=True) * V4.config.routed_scaling_factor
        np.testing.assert_allclose(run[at + "gate.weights"], weights, rtol=1e-5)
        x = tokens(run, f"{phase}.layers.{layer}.ffn_norm")
        by_hand = sum(weights[:, [k]] * v4_expert(x, layer, e) for k, e in enumerate(forced))
        np.testing.assert_allclose(tokens(run, at + "routed_output"), by_hand, rtol=1e-4, atol=1e-6)
    routed = f"prefill.layers.{layer}.ffn.routed_output"
    assert not np.allclose(run[routed], plain[routed])


def test_zero_router_bias_on_a_v4_score_layer_equals_weights_whose_bias_is_zero(plain):
    bias = "model.layers.2.mlp.gate.e_score_correction_bias"
    patched = stepper.run("tiny-v4", ids=IDS, decode=1, patch=stepper.zero_router_bias(2))
    zeroed = stepper.run("tiny-v4", ids=IDS, decode=1, weights=Changed(V4, {bias: np.zeros_like(V4.get(bias))}))
    assert patched.names == zeroed.names
    for name in patched.names:
        np.testing.assert_array_equal(patched[name], zeroed[name], err_msg=name)
    chosen = "prefill.layers.2.ffn.gate.topk_idx"
    assert not np.array_equal(patched[chosen], plain[chosen])
    everywhere = stepper.run("tiny-v4", ids=IDS, patch=stepper.zero_router_bias())  # the layers with a bias: 2, 3
    assert sorted(everywhere.patched["layers.*.ffn.gate.biased_scores"]) == [f"layers.{n}.ffn.gate.biased_scores"
                                                                            for n in (2, 3)]


def v4_groups(out: np.ndarray, layer: int) -> np.ndarray:
    """attn.o_groups by hand from output_turned_back [B, H, T, D]: group g's heads side by side times
    its block of o_a_proj.  -> [B, T, Go, o_lora]"""
    cfg = V4.config
    B, H, T, D = out.shape
    go, lora = cfg.o_groups, cfg.o_lora_rank
    grouped = out.astype(np.float64).transpose(0, 2, 1, 3).reshape(B, T, go, H * D // go)
    o_a = v4(f"model.layers.{layer}.self_attn.o_a_proj.weight")
    return np.stack([grouped[:, :, g] @ o_a[g * lora:(g + 1) * lora].T for g in range(go)], axis=2)


@pytest.mark.parametrize("layer", [0, 1, 2])  # sliding window only, CSA, HCA
def test_zero_head_on_v4_silences_that_heads_rows_before_the_grouped_output(plain, layer):
    head = 3
    run = stepper.run("tiny-v4", ids=IDS, decode=1, patch=stepper.zero_head(layer, head))
    for phase in ("prefill", "decode0"):
        at = f"{phase}.layers.{layer}.attn."
        for name in ("output", "output_turned_back"):
            assert np.all(run[at + name][:, head] == 0)
        np.testing.assert_allclose(run[at + "o_groups"], v4_groups(run[at + "output_turned_back"], layer),
                                   rtol=1e-4, atol=1e-6)
    at = f"prefill.layers.{layer}.attn."
    kept = np.delete(plain[at + "output"], head, axis=1)
    assert np.array_equal(np.delete(run[at + "output"], head, axis=1), kept)
    assert not np.allclose(run[at + "o_groups"], plain[at + "o_groups"])
    assert not np.allclose(run[f"prefill.layers.{layer}.ffn_streams"], plain[f"prefill.layers.{layer}.ffn_streams"])


def test_zero_head_on_a_kda_layer_silences_its_gated_output_and_o_projs_columns_for_it():
    """tiny-kimi-linear's layer 1 is a delta-attention (KDA) layer: the head's gated output is 0,
    and o_proj loses exactly that head's columns' part."""
    head = 2
    plain = stepper.run("tiny-kimi-linear", ids=IDS, decode=1)
    run = stepper.run("tiny-kimi-linear", ids=IDS, decode=1, patch=stepper.zero_head(1, head))
    for phase in ("prefill", "decode0"):
        assert np.all(run[f"{phase}.layers.1.self_attn.gated_output"][:, head] == 0)
    at = "prefill.layers.1.self_attn."
    v = plain[at + "gated_output"].shape[-1]
    cols = np.s_[head * v:(head + 1) * v]
    assert np.all(run[at + "attn_output"][..., cols] == 0)
    o_proj = KIMI.get("model.layers.1.self_attn.o_proj.weight").astype(np.float64)
    part = tokens(plain, at + "attn_output")[:, cols] @ o_proj[:, cols].T  # [N, d]
    np.testing.assert_allclose(tokens(plain, at + "o_proj") - tokens(run, at + "o_proj"), part, rtol=1e-4, atol=1e-6)
    assert np.abs(part).max() > 0.01
    assert list(run.patched) == ["layers.1.self_attn.gated_output"]  # not the MLA layers' attn_output


@pytest.mark.parametrize(("model", "helper", "said"), [
    ("tiny-v4", stepper.zero_router_bias(0), (
        "zero_router_bias(0) patches a router's bias (mlp.gate.scores_for_choice; DeepSeek-V4's score layers' "
        "ffn.gate.biased_scores), and layer 0 of this run of tiny-v4 has none: a hash-routed layer takes its experts "
        "from tid2eid's row for each token (ffn.gate.hash_idx), chosen by no score and no bias; "
        "layers with one: 2, 3")),
    ("tiny-v4", stepper.zero_head(1, 4), "zero_head: head 4 out of range: layer 1 has heads 0..3"),
    ("tiny-v4", stepper.zero_expert(0, 16), "zero_expert: expert 16 out of range: layer 0 has experts 0..15"),
    ("tiny-kimi-linear", stepper.zero_head(1, 4), "zero_head: head 4 out of range: layer 1 has heads 0..3"),
])
def test_what_a_v4_or_kda_layer_cannot_take_is_refused_in_one_line(model, helper, said):
    with pytest.raises(StepperError) as refused:
        stepper.run(model, ids=IDS, patch=helper)
    assert str(refused.value) == said


def test_the_helpers_combine_on_a_v4_hash_layer_in_either_order():
    patches = [stepper.zero_expert(0, 7), stepper.force_experts(0, [7, 0, 1, 2])]
    runs = [stepper.run("tiny-v4", ids=IDS, patch=order, keep="layers.0.ffn.*") for order in (patches, patches[::-1])]
    for run in runs:
        weights = run["layers.0.ffn.gate.weights"]
        assert (run["layers.0.ffn.gate.hash_idx"] == [7, 0, 1, 2]).all()
        assert (weights[:, 0] == 0).all() and (weights[:, 1:] > 0).all()
    assert stepper.diff(*runs).first is None


@pytest.mark.parametrize("model", ["tiny-mistral4", "tiny-axk1"])
def test_zero_router_bias_on_a_router_without_a_bias_is_refused_not_a_silent_no_op(model):
    """Mistral 4's and A.X-K1's routers choose by their scores alone: scores_for_choice is the scores,
    so the helper once ran the model unchanged and called it unbiased."""
    with pytest.raises(StepperError) as refused:
        stepper.run(model, ids=IDS, patch=stepper.zero_router_bias())
    assert str(refused.value) == ("zero_router_bias('*'): layers.1.mlp.gate.scores_for_choice is the scores "
                                  "themselves: this router has no bias to take away, or its bias is 0 (Mistral 4 "
                                  "and A.X-K1 have none)")


def test_a_helpers_function_under_a_pattern_of_ones_own_is_applied_not_dropped():
    """Only the patterns of the forms a run lacks are dropped: V4's head-silencing function, set by
    the user at another layer's attn.output, patches there too (it was once dropped silently)."""
    silence = stepper.zero_head(1, 2)["layers.1.attn.output"]
    run = stepper.run("tiny-v4", ids=IDS, patch={**stepper.zero_head(1, 2), "layers.2.attn.output": silence})
    assert run.patched == {"layers.1.attn.output": ["layers.1.attn.output"],
                           "layers.2.attn.output": ["layers.2.attn.output"]}
    assert np.all(run["layers.2.attn.output"][:, 2] == 0)
