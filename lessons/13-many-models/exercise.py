"""Lesson 13 (many-models): one router, configured four ways.

Write `route` below, then:

    stepper lesson check many-models   compares every tensor of the runs with stepper's (experts as sets)
    stepper run --use stepper-lessons/many-models.py --model tiny-mistral4 --show routing --only '*topk*'
                                       runs Mistral Small 4's tiny layers with your router

Keep the name, the signature and the emitted names: the interpreter calls route(x, gate, bias, cfg, emit)
and uses what it returns. The check runs it on tiny-v3 (DeepSeek-V3), tiny-glm4-flash (GLM-4.7-Flash),
tiny-mistral4 (Mistral Small 4) and tiny-glm5 (GLM-5).
"""

import numpy as np

from stepper.model.router import Routing


def route(x: np.ndarray, gate: np.ndarray, bias: np.ndarray | None, cfg, emit) -> Routing:
    """x [N, D] tokens, gate [E, D], bias [E] or None (Mistral 4 has none) -> the chosen experts and their weights.

    logits = x @ gate^T in float32 (emit mlp.gate.logits)
    cfg.scoring_func: 'sigmoid' (emit mlp.gate.scores) or 'softmax' over the experts (emit mlp.gate.softmax_scores)
    scores_for_choice = scores + bias, or the scores themselves when bias is None (emit it)
    group_scores [N, n_group]: each group's two best scores_for_choice, summed (emit it; n_group may be 1)
    group_mask [N, n_group]: 1.0 at the topk_group best groups (emit it); the other groups' experts -inf
    topk_idx [N, K] int64: the K best eligible, best first (ties: lower index)
    topk_weight [N, K]: the plain scores of the chosen, / their sum (+ 1e-20) if cfg.norm_topk_prob,
                        times cfg.routed_scaling_factor
    Return Routing(topk_idx, topk_weight). emit(name, array) reports a named tensor.
    """
    raise NotImplementedError("score (sigmoid or softmax), bias if there is one, groups, top-k, weights")
