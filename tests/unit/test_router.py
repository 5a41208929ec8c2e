"""The router against hand-derived choices: the bias changes a choice, the group limit changes one,
softmax and sigmoid scores choose differently, a group's best expert and its top-2 sum keep different groups."""

import dataclasses
import math

import numpy as np
import pytest

from stepper.errors import StepperError
from stepper.model.router import route
from stepper.seams.trace import Emitter, Recorder


def logit(p: float) -> float:
    return math.log(p / (1 - p))


def run_router(scores, bias, cfg):
    """Route one token whose sigmoid scores are `scores` (identity gate, x = logits)."""
    x = np.array([[logit(p) for p in scores]], np.float32)  # [N=1, E]
    gate = np.eye(len(scores), dtype=np.float32)  # [E, D=E]
    rec = Recorder()
    routing = route(x, gate, np.array(bias, np.float32), cfg, Emitter([rec]))
    return routing, {e.key: e.array for e in rec.events}


def test_bias_changes_the_choice_but_not_the_weights(make_config):
    cfg = make_config(n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, routed_scaling_factor=2.827)
    scores = [0.9, 0.8, 0.7, 0.1]
    unbiased, _ = run_router(scores, [0, 0, 0, 0], cfg)
    assert unbiased.topk_idx.tolist() == [[0, 1]]
    np.testing.assert_allclose(unbiased.topk_weight, [[0.9 / 1.7 * 2.827, 0.8 / 1.7 * 2.827]], rtol=1e-6)

    # bias +0.25 lifts expert 2 to 0.95 for choosing; its weight still comes from its score 0.7
    biased, seen = run_router(scores, [0, 0, 0.25, 0], cfg)
    assert biased.topk_idx.tolist() == [[2, 0]]
    np.testing.assert_allclose(biased.topk_weight, [[0.7 / 1.6 * 2.827, 0.9 / 1.6 * 2.827]], rtol=1e-6)
    np.testing.assert_allclose(seen["mlp.gate.scores_for_choice"], [[0.9, 0.8, 0.95, 0.1]], rtol=1e-6)
    assert biased.topk_weight.sum() == pytest.approx(2.827, rel=1e-6)


def test_group_limit_changes_the_choice(make_config):
    cfg = make_config(n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2, routed_scaling_factor=2.5)
    # groups of 2: sums of their top-2 are 1.0, 1.25, 0.9, 0.6 -> keep groups 0 and 1
    scores = [0.9, 0.1, 0.65, 0.6, 0.85, 0.05, 0.3, 0.3]
    routing, seen = run_router(scores, [0] * 8, cfg)
    np.testing.assert_allclose(seen["mlp.gate.group_scores"], [[1.0, 1.25, 0.9, 0.6]], rtol=1e-6)
    np.testing.assert_array_equal(seen["mlp.gate.group_mask"], [[1, 1, 0, 0]])
    # without the group limit expert 4 (0.85) would be second; it sits in a dropped group
    assert routing.topk_idx.tolist() == [[0, 2]]
    np.testing.assert_allclose(routing.topk_weight, [[0.9 / 1.55 * 2.5, 0.65 / 1.55 * 2.5]], rtol=1e-6)

    ungrouped = make_config(n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1)
    assert run_router(scores, [0] * 8, ungrouped)[0].topk_idx.tolist() == [[0, 4]]


def test_dropped_groups_lose_even_against_negative_biased_scores(make_config):
    # kept experts with negative biased scores must still win over experts of dropped groups
    cfg = make_config(n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1)
    routing, seen = run_router([0.5, 0.4, 0.1, 0.1], [-0.2, -0.6, -0.9, -0.9], cfg)
    np.testing.assert_array_equal(seen["mlp.gate.group_mask"], [[1, 0]])
    assert routing.topk_idx.tolist() == [[0, 1]]


def test_weights_are_not_normalised_when_norm_topk_prob_is_false(make_config):
    cfg = make_config(n_routed_experts=4, num_experts_per_tok=2, norm_topk_prob=False, routed_scaling_factor=2.0)
    routing, _ = run_router([0.9, 0.8, 0.7, 0.1], [0, 0, 0, 0], cfg)
    np.testing.assert_allclose(routing.topk_weight, [[1.8, 1.6]], rtol=1e-6)


# The three routers: DeepSeek-V2's softmax with greedy or group-limited greedy choice, against
# V3's sigmoid with the bias and top-2 group sums. Logits are given directly (identity gate).

def run_logits(logits, cfg, bias=None):
    x = np.array([logits], np.float32)  # [N=1, E]
    rec = Recorder()
    routing = route(x, np.eye(len(logits), dtype=np.float32), None if bias is None else np.array(bias, np.float32),
                    cfg, Emitter([rec]))
    return routing, {e.key: e.array for e in rec.events}


def softmax_of(logits):
    e = [math.exp(v) for v in logits]
    return [v / sum(e) for v in e]


def test_v2_greedy_takes_the_best_softmax_scores_unnormalised(make_config):
    cfg = make_config("tiny-v2", n_routed_experts=4, num_experts_per_tok=2, routed_scaling_factor=16.0)
    logits = [1.0, 2.0, 0.0, 1.5]
    routing, seen = run_logits(logits, cfg)
    p = softmax_of(logits)  # 0.2312, 0.6285, 0.0851, ... sums to 1
    np.testing.assert_allclose(seen["mlp.gate.softmax_scores"], [p], rtol=1e-6)
    assert "mlp.gate.scores" not in seen and "mlp.gate.scores_for_choice" not in seen
    assert routing.topk_idx.tolist() == [[1, 3]]
    # norm_topk_prob is false: the two chosen keep their share of all 4, times 16
    np.testing.assert_allclose(routing.topk_weight, [[p[1] * 16, p[3] * 16]], rtol=1e-6)


def test_softmax_and_sigmoid_choose_differently_under_the_same_group_rule(make_config):
    # two groups of two, keep one, groups scored by their top-2 sum (noaux_tc, no bias):
    # group 0 logits (3, -3), group 1 logits (1, 1)
    logits = [3.0, -3.0, 1.0, 1.0]
    v3 = make_config("tiny-v3", n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1)
    sigmoid_routing, seen = run_logits(logits, v3, bias=[0, 0, 0, 0])
    # sigmoid sums: 0.9526 + 0.0474 = 1.0 against 0.7311 * 2 = 1.4621 -> group 1
    s = [1 / (1 + math.exp(-v)) for v in logits]
    np.testing.assert_allclose(seen["mlp.gate.group_scores"], [[s[0] + s[1], s[2] + s[3]]], rtol=1e-6)
    assert sigmoid_routing.topk_idx.tolist() == [[2, 3]]
    # softmax sums, over the common denominator: e^3 + e^-3 = 20.14 against 2e = 5.44 -> group 0
    softmax_cfg = dataclasses.replace(v3, scoring_func="softmax")
    softmax_routing, seen = run_logits(logits, softmax_cfg, bias=[0, 0, 0, 0])
    p = softmax_of(logits)
    np.testing.assert_allclose(seen["mlp.gate.group_scores"], [[p[0] + p[1], p[2] + p[3]]], rtol=1e-6)
    assert softmax_routing.topk_idx.tolist() == [[0, 1]]


def test_group_max_and_top2_sum_keep_different_groups(make_config):
    # softmax scores 0.40 0.01 | 0.30 0.29 (the logits are their logs): group 0 has the best expert
    # (the max rule keeps it), group 1 the best pair (the top-2 sum keeps it)
    probs = [0.40, 0.01, 0.30, 0.29]
    logits = [math.log(v) for v in probs]  # softmax gives probs back (they sum to 1)
    v2 = make_config("deepseek-v2", n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1,
                     routed_scaling_factor=1.0)
    by_max, seen = run_logits(logits, v2)
    np.testing.assert_allclose(seen["mlp.gate.group_max"], [[0.40, 0.30]], rtol=1e-5)
    np.testing.assert_array_equal(seen["mlp.gate.group_mask"], [[1, 0]])
    assert "mlp.gate.group_scores" not in seen
    assert by_max.topk_idx.tolist() == [[0, 1]]  # group 0 kept: 0.40 and its weak 0.01
    np.testing.assert_allclose(by_max.topk_weight, [[0.40, 0.01]], rtol=1e-5)
    # the same scores with V3's group rule (top-2 sums 0.41 against 0.59) keep group 1
    by_sum, seen = run_logits(logits, dataclasses.replace(v2, topk_method="noaux_tc", norm_topk_prob=False),
                              bias=[0, 0, 0, 0])
    np.testing.assert_allclose(seen["mlp.gate.group_scores"], [[0.41, 0.59]], rtol=1e-5)
    assert by_sum.topk_idx.tolist() == [[2, 3]]
    # and ungrouped greedy takes the two best overall, across both groups
    greedy, _ = run_logits(logits, dataclasses.replace(v2, topk_method="greedy"))
    assert greedy.topk_idx.tolist() == [[0, 2]]


def test_v2_configs_are_refused_with_the_field_named(make_config):
    with pytest.raises(StepperError, match=r"field 'topk_method' must be 'greedy' or 'group_limited_greedy' "
                                           r"for model_type deepseek_v2, got 'noaux_tc'"):
        make_config("tiny-v2", topk_method="noaux_tc")
    with pytest.raises(StepperError, match=r"field 'scoring_func' must be 'softmax' for model_type deepseek_v2"):
        make_config("tiny-v2", scoring_func="sigmoid")
    with pytest.raises(StepperError, match=r"field 'scoring_func' must be 'sigmoid' for model_type deepseek_v3, "
                                           r"got 'softmax'"):
        make_config("tiny-v3", scoring_func="softmax")
    with pytest.raises(StepperError, match=r"field 'norm_topk_prob' must be false for deepseek_v2"):
        make_config("tiny-v2", norm_topk_prob=True)
    # group_limited_greedy scores a group by one expert: groups of one are fine, unlike noaux_tc's top-2
    assert make_config("deepseek-v2", n_routed_experts=8, n_group=8, topk_group=6, num_experts_per_tok=6).n_group == 8
    with pytest.raises(StepperError, match=r"field 'n_group' leaves 1 expert per group"):
        make_config("tiny-v3", n_routed_experts=8, n_group=8, topk_group=4, num_experts_per_tok=2)
