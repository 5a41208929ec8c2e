"""Lesson 10 (three-routers): DeepSeek-V2's and V3's routers, chosen by the config.

Write `route` below, then:

    stepper lesson check three-routers  compares every tensor of the runs with stepper's (experts as sets)
    stepper run --use stepper-lessons/three-routers.py --model tiny-v2 --show routing --only '*topk*'
                                        runs the whole model with your router

Keep the name, the signature and the emitted names: the interpreter calls route(x, gate, bias, cfg, emit)
and uses what it returns.
"""

import numpy as np

from stepper.model.router import Routing


def route(x: np.ndarray, gate: np.ndarray, bias: np.ndarray | None, cfg, emit) -> Routing:
    """x [N, D] tokens, gate [E, D], bias [E] (noaux_tc only, else None) -> the chosen experts and their weights.

    cfg.scoring_func: 'sigmoid' (emit mlp.gate.scores) or 'softmax' over the experts (emit mlp.gate.softmax_scores)
    cfg.topk_method:
      'greedy'                 every expert may be chosen
      'noaux_tc'               scores_for_choice = scores + bias; group_scores = each group's two best, summed
      'group_limited_greedy'   group_max = each group's best score
      (with groups: group_mask [N, n_group] 1.0 at the topk_group best, the other groups' experts -inf)
    topk_idx [N, K] int64: the K best eligible, best first (ties: lower index)
    topk_weight [N, K]: the plain scores of the chosen, / their sum (+ 1e-20) if cfg.norm_topk_prob,
                        times cfg.routed_scaling_factor
    Return Routing(topk_idx, topk_weight). emit(name, array) reports a named tensor.
    """
    raise NotImplementedError("score, select, normalise: three small steps chosen by the config")
