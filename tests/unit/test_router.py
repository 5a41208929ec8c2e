"""The router against hand-derived choices: the bias changes a choice, the group limit changes one."""

import math

import numpy as np
import pytest

from stepper.model.router import route
from stepper.trace import Emitter, Recorder


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
