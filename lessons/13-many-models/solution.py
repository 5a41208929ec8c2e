"""Lesson 13 (many-models): one router, configured four ways."""

import numpy as np

from stepper.kernels.linear import linear
from stepper.model.ops import sigmoid, softmax
from stepper.model.router import Routing


def route(x: np.ndarray, gate: np.ndarray, bias: np.ndarray | None, cfg, emit) -> Routing:
    """x [N, D] tokens, gate [E, D], bias [E] or None -> the chosen experts and their weights."""
    logits = linear(x.astype(np.float32), gate.astype(np.float32))  # [N, E]
    emit("mlp.gate.logits", logits)
    if cfg.scoring_func == "softmax":  # Mistral 4
        scores = softmax(logits)  # [N, E], each row sums to 1
        emit("mlp.gate.softmax_scores", scores)
    else:  # DeepSeek-V3, GLM-4.7-Flash, GLM-5
        scores = sigmoid(logits)  # [N, E], each in (0, 1)
        emit("mlp.gate.scores", scores)

    choice = scores if bias is None else scores + bias  # [N, E]: the bias chooses, never weighs
    emit("mlp.gate.scores_for_choice", choice)
    best_two = np.sort(choice.reshape(choice.shape[0], cfg.n_group, -1), axis=-1)[..., -2:]  # [N, G, 2]
    group_scores = best_two[..., 1] + best_two[..., 0]  # [N, G]
    emit("mlp.gate.group_scores", group_scores)
    group_mask = np.zeros_like(group_scores)
    np.put_along_axis(group_mask, top_k(group_scores, cfg.topk_group), np.float32(1), axis=1)  # [N, G]
    emit("mlp.gate.group_mask", group_mask)
    eligible = np.repeat(group_mask > 0, cfg.n_routed_experts // cfg.n_group, axis=1)  # [N, E]
    choice = np.where(eligible, choice, np.float32(-np.inf))

    topk_idx = top_k(choice, cfg.num_experts_per_tok)  # [N, K]
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
