"""Lesson 7 (moe-routing): the aux-loss-free MoE router of DeepSeek-V3 and Kimi K2.

Write `route` below, then:

    stepper lesson check moe-routing   compares every tensor of the runs with stepper's (experts as sets)
    stepper run --use stepper-lessons/moe-routing.py --model tiny-v3 --show routing --only '*topk*'
                                       runs the whole model with your router

Keep the name, the signature and the emitted names: the interpreter calls route(x, gate, bias, cfg, emit)
and uses what it returns. The check compares the tensors you emit with the golden ones, in this order:
mlp.gate.logits, mlp.gate.scores, mlp.gate.scores_for_choice, mlp.gate.group_scores, mlp.gate.group_mask,
mlp.gate.topk_idx, mlp.gate.topk_weight.
"""

import numpy as np

from stepper.model.router import Routing


def route(x: np.ndarray, gate: np.ndarray, bias: np.ndarray, cfg, emit) -> Routing:
    """x [N, D] tokens, gate [E, D], bias [E] (e_score_correction_bias) -> the chosen experts and their weights.

    cfg.n_routed_experts (E), cfg.n_group, cfg.topk_group, cfg.num_experts_per_tok (K), cfg.norm_topk_prob,
    cfg.routed_scaling_factor. emit(name, array) reports a named tensor.

      logits = x @ gate^T; scores = sigmoid(logits); scores_for_choice = scores + bias
      group_scores [N, n_group] = the sum of the two best scores_for_choice in each group of E / n_group experts
      group_mask [N, n_group] float32 = 1.0 at each token's topk_group best groups, else 0.0
      topk_idx [N, K] int64 = the K best scores_for_choice among the kept groups' experts, best first
      topk_weight [N, K] = the chosen experts' plain scores / their sum (+ 1e-20) (if norm_topk_prob),
                           times routed_scaling_factor
    """
    raise NotImplementedError("score, bias, group, choose, weigh: one emit per step")
