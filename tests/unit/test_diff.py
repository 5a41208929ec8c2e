"""stepper.diff: two runs compared tensor by tensor with the comparison fixtures verify uses."""

import numpy as np
import pytest

import stepper
from stepper.errors import StepperError
from stepper.fixtures.run_diff import diff_tensors
from stepper.presets import preset
from stepper.views.diff_table import level, scope_note
from stepper.weights.seeded import SyntheticWeights

IDS = [17, 402, 999, 3, 256]


class BiasChanged:
    """The tiny model's weights with one router bias entry of one layer changed."""

    def __init__(self, layer: int, expert: int, by: float):
        self.base = SyntheticWeights(preset("tiny"), 0)
        self.config, self.expert, self.by = self.base.config, expert, by
        self.name = f"model.layers.{layer}.mlp.gate.e_score_correction_bias"

    def __getattr__(self, name):
        return getattr(self.base, name)

    def get(self, name):
        array = self.base.get(name)
        if name == self.name:
            array = array.copy()
            array[self.expert] += np.float32(self.by)
        return array


@pytest.fixture(scope="module")
def naive():
    return stepper.run("tiny", ids=IDS, decode=2, attn="naive")


def test_naive_against_absorbed_attention_is_within_round_off_everywhere(naive):
    absorbed = stepper.run("tiny", ids=IDS, decode=2, attn="absorb")
    d = stepper.diff(naive, absorbed)
    assert d.first is None and d.count("differs") == 0
    shared = set(naive.names) & set(absorbed.names)
    assert {r.name for r in d.rows} == shared and len(shared) > 200
    assert [r.name for r in d.rows] == [n for n in naive.names if n in shared]  # execution order
    for r in d.rows:
        if r.rel is not None:
            assert r.rel < 1e-5 and r.cosine > 1 - 1e-6, r.name  # float32 round-off
    assert d.count("close") > 100  # the attention really is computed another way
    assert ("prefill.layers.1.self_attn.key_states" in d.only_a
            and "decode0.layers.1.self_attn.q_nope_absorbed" in d.only_b)


def test_one_router_bias_entry_changed_first_differs_at_that_layers_scores_for_choice(naive):
    changed = stepper.run("tiny", ids=IDS, decode=2, attn="naive", weights=BiasChanged(1, 5, 0.3))
    d = stepper.diff(naive, changed)
    assert d.first.name == "prefill.layers.1.mlp.gate.scores_for_choice"
    row = d.first
    assert row.max_abs == pytest.approx(0.3, rel=1e-5)  # exactly the one entry's change, in every token
    assert row.detail.startswith(f"{len(IDS)} of {len(IDS) * naive.config.n_routed_experts} entries outside tolerance")
    before = [r for r in d.rows if r.index < row.index]
    assert before and all(r.status == "same" for r in before)  # scores, logits, attention: bit for bit


def test_changed_expert_choices_are_named_per_token():
    a = {"layers.1.mlp.gate.topk_idx": np.array([[1, 2, 3, 4], [5, 6, 7, 8]]),
         "layers.1.mlp.gate.topk_weight": np.array([[0.4, 0.3, 0.2, 0.1], [0.4, 0.3, 0.2, 0.1]], np.float32)}
    b = {"layers.1.mlp.gate.topk_idx": np.array([[4, 3, 2, 1], [5, 6, 7, 9]]),
         "layers.1.mlp.gate.topk_weight": np.array([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]], np.float32)}
    d = diff_tensors(a, b)
    idx, weight = d.rows
    assert (idx.status == "differs"
            and idx.detail == "experts changed for 1 of 2 tokens; token 1: [5, 6, 7, 8] -> [5, 6, 7, 9]")
    # token 0: the same experts in another order and the same weight per expert; token 1 differs only in its
    # last expert, whose weight is the same: paired by expert, the weights agree where the experts do
    assert weight.status == "close" and weight.max_abs == 0
    d2 = diff_tensors({"layers.1.mlp.gate.topk_idx": a["layers.1.mlp.gate.topk_idx"][:1]},
                      {"layers.1.mlp.gate.topk_idx": b["layers.1.mlp.gate.topk_idx"][:1]})
    assert d2.rows[0].status == "close" and d2.rows[0].detail == "same experts, another order"


def test_figures_of_one_tensor_by_hand():
    a = {"x": np.array([1.0, 2.0, -4.0], np.float32)}
    b = {"x": np.array([1.0, 2.5, -4.0], np.float32)}
    (row,) = diff_tensors(a, b).rows
    assert row.status == "differs" and row.max_abs == 0.5 and row.rel == 0.5 / 4
    assert row.cosine == pytest.approx((1 + 5 + 16) / (np.sqrt(21) * np.sqrt(1 + 6.25 + 16)))
    (same,) = diff_tensors(a, {"x": a["x"].copy()}).rows
    assert same.status == "same" and same.max_abs == 0
    (shape,) = diff_tensors(a, {"x": a["x"][:2]}).rows
    assert shape.status == "differs" and shape.detail == "shapes differ: A [3], B [2]"


def test_a_nan_is_named_with_its_index_and_the_figures_are_the_finite_entries():
    """A NaN in B is not an error of inf and a cosine of 0 (nor of 0 and 1 over the finite entries):
    it is named, counted and placed, and the figures are left blank."""
    a = {"h": np.arange(1, 13, dtype=np.float32).reshape(3, 4), "y": np.ones(2, np.float32)}
    b = {"h": a["h"].copy(), "y": np.ones(2, np.float32)}
    b["h"][1, 2], b["h"][2, 0] = np.nan, -np.inf
    d = diff_tensors(a, b)
    row = d.rows[0]
    assert (row.status, row.max_abs, row.rel, row.cosine) == ("differs", None, None, None)
    assert row.detail == row.nonfinite == "1 NaN and 1 inf where the reference is finite (first at [1,2])"
    b["h"][2, 0], b["h"][0, 1] = 9.0, 2.5
    (row, _) = diff_tensors(a, b).rows
    assert row.max_abs is None and row.detail == ("1 NaN where the reference is finite (first at [1,2]); "
                                                 "1 more of 12 entries outside tolerance (worst at [0,1])")
    assert level(row) == 1.0 and scope_note(d.rows) == "differs from h (NaN or inf)"


def test_diff_of_files_and_bad_sides(tmp_path, naive):
    d = stepper.diff("fixtures/tiny-prefill-decode", "fixtures/tiny-absorb")
    assert d.first is None and len(d.rows) > 200
    same = stepper.diff("fixtures/tiny-prefill-decode",
                        stepper.run("tiny", ids=[17, 402, 999, 3, 256, 77, 640], decode=2, attn="naive"))
    assert same.first is None and same.count("differs") == 0 and len(same.rows) == 312  # made on another machine
    with pytest.raises(StepperError, match="diff: b must be a stepper.Run, a dict of name -> NumPy array"):
        stepper.diff(naive, 3)
    assert stepper.load("fixtures/tiny-absorb")["decode1.logits"].shape == (1, 1, 1000)
