"""Lesson 7 (moe-routing): the aux-loss-free MoE router of DeepSeek-V3 and Kimi K2."""

import numpy as np

from stepper.kernels.linear import linear
from stepper.model.ops import sigmoid
from stepper.model.router import Routing


def route(x: np.ndarray, gate: np.ndarray, bias: np.ndarray, cfg, emit) -> Routing:
    """x [N, D] tokens, gate [E, D], bias [E] (e_score_correction_bias) -> the chosen experts and their weights."""
    logits = linear(x.astype(np.float32), gate.astype(np.float32))  # [N, E]
    emit("mlp.gate.logits", logits)
    scores = sigmoid(logits)
    emit("mlp.gate.scores", scores)
    scores_for_choice = scores + bias  # [N, E]: chooses, never weighs
    emit("mlp.gate.scores_for_choice", scores_for_choice)

    grouped = scores_for_choice.reshape(scores_for_choice.shape[0], cfg.n_group, -1)  # [N, G, E/G]
    best_two = np.sort(grouped, axis=-1)[..., -2:]
    group_scores = best_two[..., 1] + best_two[..., 0]  # [N, G]
    emit("mlp.gate.group_scores", group_scores)
    group_mask = np.zeros_like(group_scores)
    np.put_along_axis(group_mask, top_k(group_scores, cfg.topk_group), np.float32(1), axis=1)  # [N, G]
    emit("mlp.gate.group_mask", group_mask)

    eligible = np.repeat(group_mask > 0, cfg.n_routed_experts // cfg.n_group, axis=1)  # [N, E]
    masked = np.where(eligible, scores_for_choice, np.float32(-np.inf))
    topk_idx = top_k(masked, cfg.num_experts_per_tok)  # [N, K]
    emit("mlp.gate.topk_idx", topk_idx)

    weights = np.take_along_axis(scores, topk_idx, axis=1)  # [N, K]: the plain scores
    if cfg.norm_topk_prob:
        weights = weights / (np.sum(weights, axis=1, keepdims=True) + np.float32(1e-20))
    weights = weights * np.float32(cfg.routed_scaling_factor)
    emit("mlp.gate.topk_weight", weights)
    return Routing(topk_idx, weights)


def top_k(values: np.ndarray, k: int) -> np.ndarray:
    """Indices [N, k] of the k largest values per row, best first (ties: lower index first)."""
    return np.argsort(-values, axis=1, kind="stable")[:, :k].astype(np.int64)
