"""Patching: at a named tensor the model continues with a patch's result, and what follows is
computed from it; the helpers do what changed weights would do."""

import traceback
from pathlib import Path

import numpy as np
import pytest
from helpers.changed_weights import Changed

import stepper
from stepper.errors import StepperError
from stepper.model.ops import silu
from stepper.presets import preset
from stepper.seams.patching import Patcher, expression, parse_patch
from stepper.seams.trace import Emitter
from stepper.weights.seeded import SyntheticWeights

IDS = [3, 14, 15, 92]
WEIGHTS = SyntheticWeights(preset("tiny"), 0)


def w(name: str) -> np.ndarray:
    return WEIGHTS.get(name).astype(np.float64)


@pytest.fixture(scope="module")
def plain():
    return stepper.run("tiny", ids=IDS)


def expert_by_hand(x: np.ndarray, layer: int, e: int) -> np.ndarray:
    """down(silu(gate x) * up x) in float64.  [N, d] -> [N, d]"""
    p = f"model.layers.{layer}.mlp.experts.{e}."
    gate, up = x @ w(p + "gate_proj.weight").T, x @ w(p + "up_proj.weight").T
    return (silu(gate) * up) @ w(p + "down_proj.weight").T


def test_the_patched_tensor_is_what_the_next_op_is_computed_from(plain):
    def drop_first_position(weights, name):  # every query ignores position 0, not renormalised
        weights[..., 0] = 0
        return weights

    run = stepper.run("tiny", ids=IDS, patch={"layers.1.self_attn.attn_weights": drop_first_position})
    weights, values = run["layers.1.self_attn.attn_weights"], run["layers.1.self_attn.value_states"]
    assert np.all(weights[..., 0] == 0) and np.array_equal(weights[..., 1:],
                                                           plain["layers.1.self_attn.attn_weights"][..., 1:])
    by_hand = (weights.astype(np.float64) @ values).transpose(0, 2, 1, 3).reshape(1, len(IDS), -1)  # heads merged
    np.testing.assert_allclose(run["layers.1.self_attn.attn_output"], by_hand, rtol=1e-5, atol=1e-6)
    assert not np.allclose(run["layers.1.self_attn.attn_output"], plain["layers.1.self_attn.attn_output"])
    assert run.patched == {"layers.1.self_attn.attn_weights": ["layers.1.self_attn.attn_weights"]}


def test_a_patch_on_router_scores_reaches_scores_for_choice_as_scores_plus_bias(plain):
    run = stepper.run("tiny", ids=IDS, patch={"layers.2.mlp.gate.scores": lambda x, name: x * np.float32(0.5)})
    scores = run["layers.2.mlp.gate.scores"]
    np.testing.assert_array_equal(scores, plain["layers.2.mlp.gate.scores"] * np.float32(0.5))
    bias = WEIGHTS.get("model.layers.2.mlp.gate.e_score_correction_bias")
    np.testing.assert_array_equal(run["layers.2.mlp.gate.scores_for_choice"], scores + bias)


def test_zeroing_an_expert_gives_the_output_of_weights_without_that_expert(plain):
    e = int(plain["layers.1.mlp.gate.topk_idx"][0, 0])  # an expert token 0 chose
    patched = stepper.run("tiny", ids=IDS, patch=stepper.zero_expert(1, e))
    down = f"model.layers.1.mlp.experts.{e}.down_proj.weight"
    removed = stepper.run("tiny", ids=IDS, weights=Changed(WEIGHTS, {down: np.zeros_like(WEIGHTS.get(down))}))
    for name in ("layers.1.mlp.routed_output", "layers.1.output", "logits"):
        np.testing.assert_allclose(patched[name], removed[name], rtol=1e-6, atol=1e-6)
    assert not np.allclose(patched["layers.1.output"], plain["layers.1.output"])
    assert np.array_equal(patched["layers.1.mlp.gate.topk_idx"], plain["layers.1.mlp.gate.topk_idx"])


def test_forcing_the_chosen_experts_changes_routed_output_as_computed_by_hand(plain):
    forced = [4, 9, 30, 17]
    run = stepper.run("tiny", ids=IDS, patch=stepper.force_experts(1, forced))
    cfg = run.config
    assert np.all(run["layers.1.mlp.gate.topk_idx"] == forced)
    x = run["layers.1.post_attention_layernorm"].reshape(len(IDS), -1).astype(np.float64)  # [N, d]
    scores = 1 / (1 + np.exp(-(x @ w("model.layers.1.mlp.gate.weight").T)))  # [N, E]
    weights = scores[:, forced] / scores[:, forced].sum(axis=1, keepdims=True) * cfg.routed_scaling_factor  # [N, k]
    by_hand = sum(weights[:, [k]] * expert_by_hand(x, 1, e) for k, e in enumerate(forced))  # [N, d]
    np.testing.assert_allclose(run["layers.1.mlp.gate.topk_weight"], weights, rtol=1e-5)
    np.testing.assert_allclose(run["layers.1.mlp.routed_output"].reshape(len(IDS), -1), by_hand, rtol=1e-4, atol=1e-5)
    assert not np.allclose(run["layers.1.mlp.routed_output"], plain["layers.1.mlp.routed_output"])


def test_forcing_experts_per_token_and_refusing_a_wrong_choice():
    per_token = np.array([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]])
    run = stepper.run("tiny", ids=IDS, patch=stepper.force_experts(2, per_token), keep="topk_idx")
    assert np.array_equal(run["layers.2.mlp.gate.topk_idx"], per_token)
    with pytest.raises(StepperError, match="names expert 32; the layer has experts 0..31"):
        stepper.run("tiny", ids=IDS, patch=stepper.force_experts(1, [1, 2, 3, 32]))
    with pytest.raises(StepperError, match="names one of its experts twice in one row"):
        stepper.run("tiny", ids=IDS, patch=stepper.force_experts(1, [1, 2, 2, 3]))
    with pytest.raises(StepperError, match="names expert -1; the layer has experts 0..31$"):
        stepper.run("tiny", ids=IDS, patch=stepper.force_experts(1, [1, 2, 3, -1]))
    with pytest.raises(StepperError, match=r"got experts of shape \[3\]"):
        stepper.run("tiny", ids=IDS, patch=stepper.force_experts(1, [1, 2, 3]))


@pytest.mark.parametrize("made, said", [
    (lambda: stepper.zero_expert(1, 2.5), "zero_expert: expert must be a whole number >= 0, got 2.5"),  # zeroed none
    (lambda: stepper.zero_head(1, "2"), "zero_head: head must be a whole number >= 0, got '2'"),  # failed in the run
    (lambda: stepper.zero_expert(1.0, 2), "zero_expert: layer must be a whole number >= 0, got 1.0"),
    (lambda: stepper.zero_head(True, 1), "zero_head: layer must be a whole number >= 0, got True"),
    (lambda: stepper.force_experts(-1, [1, 2, 3, 4]), "force_experts: layer must be a whole number >= 0, got -1"),
])
def test_a_helpers_layer_expert_or_head_is_a_whole_number(made, said):
    with pytest.raises(StepperError) as refused:
        made()
    assert str(refused.value) == said


def test_zeroing_a_head_gives_the_output_of_o_proj_without_that_heads_columns(plain):
    cfg = plain.config
    run = stepper.run("tiny", ids=IDS, patch=stepper.zero_head(1, 2))
    v = cfg.v_head_dim
    out = run["layers.1.self_attn.attn_output"]
    assert np.all(out[..., 2 * v:3 * v] == 0)
    assert np.array_equal(np.delete(out, np.s_[2 * v:3 * v], -1),
                          np.delete(plain["layers.1.self_attn.attn_output"], np.s_[2 * v:3 * v], -1))
    o = "model.layers.1.self_attn.o_proj.weight"
    without = WEIGHTS.get(o).copy()
    without[:, 2 * v:3 * v] = 0
    removed = stepper.run("tiny", ids=IDS, weights=Changed(WEIGHTS, {o: without}))
    np.testing.assert_allclose(run["layers.1.self_attn.o_proj"], removed["layers.1.self_attn.o_proj"],
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(run["logits"], removed["logits"], rtol=1e-5, atol=1e-5)
    with pytest.raises(StepperError, match="head 4 out of range: layer 1 has heads 0..3"):
        stepper.run("tiny", ids=IDS, patch=stepper.zero_head(1, 4))


def test_zeroing_the_router_bias_equals_weights_whose_bias_is_zero(plain):
    bias = "model.layers.1.mlp.gate.e_score_correction_bias"
    patched = stepper.run("tiny", ids=IDS, decode=1, patch=stepper.zero_router_bias(1))
    zeroed = stepper.run("tiny", ids=IDS, decode=1, weights=Changed(WEIGHTS, {bias: np.zeros_like(WEIGHTS.get(bias))}))
    assert patched.names == zeroed.names
    for name in patched.names:
        np.testing.assert_array_equal(patched[name], zeroed[name], err_msg=name)
    assert patched.patched["layers.1.mlp.gate.scores_for_choice"] == ["prefill.layers.1.mlp.gate.scores_for_choice",
                                                                     "decode0.layers.1.mlp.gate.scores_for_choice"]
    assert not np.array_equal(patched["prefill.layers.1.mlp.gate.topk_idx"], stepper.run(
        "tiny", ids=IDS, decode=1, keep="topk_idx")["prefill.layers.1.mlp.gate.topk_idx"])


def test_a_patch_on_a_name_never_emitted_is_an_error_before_the_run():
    calls = []
    with pytest.raises(StepperError, match=r"patch= layers.0.mlp.gate.topk_idx: matches no tensor of this run"):
        stepper.run("tiny", ids=IDS, patch={"layers.0.mlp.gate.topk_idx": lambda x, n: calls.append(n)})  # dense layer
    with pytest.raises(StepperError, match="did you mean"):
        stepper.run("tiny", ids=IDS, patch={"layers.1.self_attn.attn_weight": lambda x, n: x})
    with pytest.raises(StepperError, match="zero_expert: expert 40 out of range"):
        stepper.run("tiny", ids=IDS, patch=stepper.zero_expert(1, 40))
    assert calls == []


@pytest.mark.parametrize("fn, got", [
    (lambda x, n: x.astype(np.float64), r"float64\[1, 4, 4, 4\]"),
    (lambda x, n: x[..., :2], r"float32\[1, 4, 4, 2\]"),
    (lambda x, n: 0.0, "float"),
])
def test_a_patch_of_another_shape_or_dtype_is_one_clear_error(fn, got):
    with pytest.raises(StepperError, match=rf"patch \*.attn_weights on layers.0.self_attn.attn_weights returned {got}; "
                                           r"expected an array of the tensor's shape and dtype, float32\[1, 4, 4, 4\]"):
        stepper.run("tiny", ids=IDS, patch={"*.attn_weights": fn})


def test_patches_apply_in_order_none_leaves_a_tensor_and_the_copy_is_the_patchs_own(plain):
    seen = []

    def watch(x, name):
        seen.append(name)  # None: the tensor goes on as it was

    def plus_one_in_place(x, name):
        x += np.float32(1)  # a copy: changing it in place reaches no tensor that shares k_pe's memory (kv_a)
        return x

    run = stepper.run("tiny", ids=IDS, patch=[{"layers.1.self_attn.k_pe": watch},
                                              {"layers.1.*k_pe": plus_one_in_place},
                                              {"layers.1.self_attn.k_pe": lambda x, n: x * np.float32(2)}])
    assert seen == ["layers.1.self_attn.k_pe"]
    np.testing.assert_array_equal(run["layers.1.self_attn.k_pe"],
                                  (plain["layers.1.self_attn.k_pe"] + np.float32(1)) * np.float32(2))
    np.testing.assert_array_equal(run["layers.1.self_attn.kv_a"], plain["layers.1.self_attn.kv_a"])


# ---------------------------------------------------------------------------------------------
# NAME=EXPR


@pytest.mark.parametrize("expr, expected", [
    ("0", lambda x: np.zeros_like(x)),
    ("x*0.5", lambda x: x * np.float32(0.5)),
    ("x+1e-3", lambda x: x + np.float32(1e-3)),
    ("-x / 2", lambda x: -x / np.float32(2)),
    ("x[..., 1]=0", lambda x: np.concatenate([x[..., :1], np.zeros_like(x[..., 1:2]), x[..., 2:]], -1)),
    ("x[1]=1.5", lambda x: np.stack([x[0], np.full_like(x[1], 1.5)])),
    ("x[0, -1] = x[0, -1]*2", lambda x: np.stack([np.concatenate([x[0, :-1], x[0, -1:] * 2]), x[1]])),
    ("x[:, ::2]=nan", lambda x: np.where(np.arange(3) % 2 == 0, np.nan, x).astype(np.float32)),
])
def test_expressions_read_by_hand(expr, expected):
    x = np.arange(6, dtype=np.float32).reshape(2, 3) + np.float32(0.25)
    got = expression(expr)(x.copy(), "t")
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_array_equal(got, expected(x))


@pytest.mark.parametrize("text, message", [
    ("attn_weights", "expected NAME=EXPR"),
    ("attn_weights=", "expected NAME=EXPR"),
    ("attn_weights=__import__('os').system('true')", "is not allowed"),
    ("attn_weights=x.sum()", "is not allowed"),
    ("attn_weights=x[y]=0", "index 'y' is not allowed"),
    ("attn_weights=x[0]=0; x[1]=1", "expected a number"),
    ("attn_weights=y=0", "expected a number"),
    ("attn_weights=x ** 2", "is not allowed"),
    ("attn_weights=x[", "expected a number"),
])
def test_expressions_outside_the_form_are_refused_naming_the_option(text, message):
    with pytest.raises(StepperError, match=message) as e:
        parse_patch(text)
    assert str(e.value).startswith("--patch attn_weights")


def test_an_expression_that_does_not_fit_the_tensor_is_one_line_naming_it():
    fn = expression("x[..., 7]=0", "--patch attn_weights=")
    with pytest.raises(StepperError,
                       match=r"--patch attn_weights=x\[..., 7\]=0 on t float32\[2, 3\]: index 7 is out of bounds"):
        fn(np.zeros((2, 3), np.float32), "t")
    with pytest.raises(StepperError, match="it gives float64 values for a tensor of int64"):
        expression("x*0.5")(np.zeros((2, 3), np.int64), "t")


def test_a_patch_may_be_an_expression_as_the_command_line_takes_it(plain):
    run = stepper.run("tiny", ids=IDS, keep="layers.1.self_attn.k_pe", patch={"layers.1.self_attn.k_pe": "x[..., 0]=0"})
    expected = plain["layers.1.self_attn.k_pe"].copy()
    expected[..., 0] = 0
    np.testing.assert_array_equal(run["layers.1.self_attn.k_pe"], expected)
    with pytest.raises(StepperError, match="patch= layers.1.self_attn.k_pe=x.y: 'x.y' is not allowed"):
        stepper.run("tiny", ids=IDS, patch={"layers.1.self_attn.k_pe": "x.y"})


def test_the_patcher_is_a_sink_of_the_emit_seam():
    patcher = Patcher([("k_pe", expression("x+1"))])
    out = Emitter([patcher]).layer(3)("self_attn.k_pe", np.zeros(2, np.float32))
    assert out.tolist() == [1, 1] and patcher.applied == {"k_pe": ["layers.3.self_attn.k_pe"]}


@pytest.mark.parametrize(("model", "name", "expr", "message"), [
    ("tiny-v4", "layers.2.ffn.gate.topk_idx", "x+100",
     r"layers.2.ffn.gate.topk_idx names expert 1\d\d; the layer has experts 0..15$"),
    ("tiny-v4", "layers.2.ffn.gate.topk_idx", "x[..., 0]=-1", "names expert -1; the layer has experts 0..15$"),
    ("tiny-v4", "layers.2.ffn.gate.topk_idx", "x[..., 1]=x[..., 0]", "names one of its experts twice in one row"),
    ("tiny-v4", "layers.1.ffn.gate.hash_idx", "x+100", "layers.1.ffn.gate.hash_idx names expert 1"),
    ("tiny-v4", "layers.1.attn.chosen", "x+1000",
     r"layers.1.attn.chosen names entry 9\d\d; the layer has entries 0..9 \(-1: none\)$"),
    ("tiny-v4", "layers.1.attn.indexer.chosen", "x+1000",  # upstream of attn.chosen: it crashed in a gather
     r"layers.1.attn.indexer.chosen names entry 9\d\d; the layer has entries 0..9 \(-1: none\)$"),
    ("tiny-v4", "layers.1.attn.indexer.chosen", "x*0-5", r"names entry -5; the layer has entries 0..9"),
    ("tiny-v32", "layers.0.self_attn.indexer.topk_idx", "x+1000",
     r"names position 10\d\d; the layer has positions 0..39 \(-1: none\)$"),
    ("tiny-glm5", "layers.0.self_attn.indexer.topk_idx", "x[..., 1]=x[..., 0]", "names one of its positions twice"),
])
def test_a_patched_choice_of_another_family_is_checked_before_the_model_reads_it(model, name, expr, message):
    """Every tensor of indices the model reads (experts, positions, compressed entries) is checked
    where it is made, as MLA's router choice is: one clear error, never NumPy's IndexError."""
    with pytest.raises(StepperError, match=message):
        stepper.run(model, prompt_len=40, patch={name: expr}, keep=name)


def test_longcat_patches_may_choose_its_zero_experts():
    """LongCat-Flash's router chooses among its routed experts and its zero (identity) experts: a
    patch may name any of them, and one the model made itself goes through unchanged."""
    plain = stepper.run("tiny-longcat", prompt_len=40, keep="layers.1.mlp.*")
    idx = plain["layers.1.mlp.gate.topk_idx"]
    assert idx.max() >= 8  # the model chose a zero expert (8..11) itself
    same = stepper.run("tiny-longcat", prompt_len=40, patch={"layers.1.mlp.gate.topk_idx": lambda a, n: a.copy()},
                       keep="layers.1.mlp.*")
    assert stepper.diff(plain, same).first is None
    with pytest.raises(StepperError, match="names expert 12; the layer has experts 0..11$"):
        stepper.run("tiny-longcat", prompt_len=40, patch={"layers.1.mlp.gate.topk_idx": "x[..., 0]=12"})


def test_the_helpers_combine_in_either_order():
    """zero_expert watches the choice the model goes on with, so forcing expert 27 first or second
    gives the same run: its weight 0 in every row."""
    patches = [stepper.zero_expert(1, 27), stepper.force_experts(1, [27, 0, 1, 2])]
    runs = [stepper.run("tiny", ids=IDS, patch=order, keep="layers.1.mlp.*") for order in (patches, patches[::-1])]
    for run in runs:
        assert (run["layers.1.mlp.gate.topk_idx"] == [27, 0, 1, 2]).all()
        weights = run["layers.1.mlp.gate.topk_weight"]
        assert (weights[:, 0] == 0).all() and (weights[:, 1:] > 0).all()
    assert stepper.diff(*runs).first is None


def test_a_function_that_changes_its_copy_and_returns_none_is_refused():
    def zeroed_in_place(x, name):
        x[...] = 0

    with pytest.raises(StepperError, match="changed its copy in place and returned None.*return the array"):
        stepper.run("tiny", ids=IDS, patch={"layers.1.self_attn.k_pe": zeroed_in_place})
    looked = stepper.run("tiny", ids=IDS, patch={"layers.1.self_attn.k_pe": lambda x, name: None}, keep="k_pe")
    assert looked["layers.1.self_attn.k_pe"].any()  # a function that only looks leaves the tensor as it was


def test_an_error_of_a_patch_function_is_raised_from_its_own_frames_naming_the_tensor_it_was_given():
    """A notebook shows the user's mistake under the stepper.run line, at their function's line,
    with the tensor it was called on: not under twenty frames of the model around it."""
    def scaled(x, name):
        return x / x.shape[9]  # a mistake: k_pe has 4 axes

    with pytest.raises(IndexError) as raised:
        stepper.run("tiny", ids=IDS, patch={"*k_pe": scaled})
    assert raised.value.__notes__ == ["in patch *k_pe on layers.0.self_attn.k_pe float32[1, 1, 4, 16]"]
    frames = [(Path(frame.filename).name, frame.name) for frame in traceback.extract_tb(raised.value.__traceback__)]
    assert frames[1:] == [("api.py", "run"), (Path(__file__).name, "scaled")]  # after the test's own line


@pytest.mark.parametrize(("model", "name"), [
    ("tiny-kimi-linear", "layers.0.self_attn.delta"),
    ("tiny-kimi-linear", "layers.0.self_attn.state_per_token"),
    ("tiny-v4", "layers.2.attn.sink_mass"),
])
def test_a_tensor_shown_only_is_refused_as_a_patch_not_patched_for_nothing(model, name):
    """A figure the model shows but does not go on with (each token's write, the sink's share) would
    change nothing downstream if patched: the patch is refused, naming it."""
    with pytest.raises(StepperError, match=rf"^patch {name}: {name} is shown only; the model does not read it back"):
        stepper.run(model, prompt_len=40, patch={name: "x*0"})


@pytest.mark.parametrize("model", ["tiny-mistral4", "tiny-longcat", "tiny-kimi-linear", "tiny-glm5"])
def test_the_helpers_patch_every_mla_familys_router(model):
    """zero_expert and force_experts read and patch mlp.gate.* as every MLA family's router emits it
    (Mistral 4's and LongCat's softmax scores, LongCat's zero experts, Kimi Linear's MoE)."""
    k = {"tiny-longcat": 3, "tiny-glm5": 2}.get(model, 4)
    forced = list(range(1, k + 1))
    run = stepper.run(model, ids=IDS, patch=[stepper.force_experts(1, forced), stepper.zero_expert(1, 1)],
                      keep="layers.1.mlp.gate.*")
    assert (run["layers.1.mlp.gate.topk_idx"] == forced).all()
    weights = run["layers.1.mlp.gate.topk_weight"]
    assert (weights[:, 0] == 0).all() and (weights[:, 1:] != 0).any()


ROUTER = ("a MoE router (mlp.gate.topk_idx and topk_weight; DeepSeek-V4's ffn.gate.hash_idx or topk_idx, "
          "and weights)")
HEADS = ("an attention's heads (MLA's self_attn.attn_output, DeepSeek-V4's attn.output, "
         "a KDA layer's self_attn.gated_output)")


@pytest.mark.parametrize(("model", "helper", "said"), [
    ("tiny-minicpm3", stepper.zero_expert(1, 0), (f"zero_expert(1, 0) patches {ROUTER}, and layer 1 of this run of "
     "tiny-minicpm3 has none")),
    # a layer of another kind than the model's others: the layers that have what the helper patches
    ("tiny-kimi-linear", stepper.zero_expert(0, 0), (f"zero_expert(0, 0) patches {ROUTER}, and layer 0 of this run "
     "of tiny-kimi-linear has none; layers with one: 1, 2, 3")),
    ("tiny-v4", stepper.force_experts(4, [0, 1, 2, 3]), (f"force_experts(4, ...) patches {ROUTER}, and layer 4 of "
     "this run of tiny-v4 has none; layers with one: 0, 1, 2, 3")),
    ("tiny-longcat", stepper.zero_head(5, 0), (f"zero_head(5, 0) patches {HEADS}, and layer 5 of this run of "
     "tiny-longcat has none; layers with one: 0, 1")),
    ("tiny-minicpm3", stepper.zero_router_bias(), ("zero_router_bias('*') patches a router's bias "
     "(mlp.gate.scores_for_choice; DeepSeek-V4's score layers' ffn.gate.biased_scores), and this run of "
     "tiny-minicpm3 has none")),
])
def test_a_helper_a_model_has_no_tensors_for_says_what_it_patches(model, helper, said):
    """And where it would find them: a Kimi Linear run once said only 'no layers.0.mlp.gate.logits' of
    its dense layer, leaving the user to find which of its layers have a router."""
    with pytest.raises(StepperError) as refused:
        stepper.run(model, ids=IDS, patch=helper)
    assert str(refused.value) == said


def test_force_experts_refuses_experts_that_are_not_whole_numbers():
    with pytest.raises(StepperError, match=r"^force_experts: experts are whole numbers \(expert indices\), got float"):
        stepper.force_experts(1, [0.9, 1, 2, 3])
