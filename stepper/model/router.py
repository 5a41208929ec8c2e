"""The aux-loss-free MoE router ("noaux_tc") of DeepSeek-V3 and Kimi K2.

Each token scores every routed expert with a sigmoid. A learned bias, e_score_correction_bias,
is added only to *choose* experts (it balances load without an auxiliary loss); the weights come
from the unbiased scores. Choice is group-limited: experts form n_group groups, a group's score
is the sum of its two best biased scores, only the best topk_group groups stay eligible. Kimi K2
has a single group, so that step keeps everything. The chosen experts' scores are normalised to
sum 1 and multiplied by routed_scaling_factor.

Shapes name the catalogue's dimensions: N tokens, d hidden, E routed experts, G expert groups,
k chosen experts per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepper.config import Config
from stepper.kernels.linear import linear
from stepper.model.ops import sigmoid
from stepper.swap import exercise
from stepper.trace import Emitter


@dataclass(frozen=True)
class Routing:
    topk_idx: np.ndarray  # [N, k] int64, best first
    topk_weight: np.ndarray  # [N, k] float32


@exercise
def route(x: np.ndarray, gate: np.ndarray, bias: np.ndarray, cfg: Config, emit: Emitter) -> Routing:
    """x [N, d], gate [E, d], bias [E] -> the chosen experts and their weights."""
    logits = emit("mlp.gate.logits", linear(x.astype(np.float32), gate.astype(np.float32)))  # [N, E]
    scores = emit("mlp.gate.scores", sigmoid(logits))  # [N, E]
    scores_for_choice = emit("mlp.gate.scores_for_choice", scores + bias)  # [N, E], selection only

    group_scores = emit("mlp.gate.group_scores", top2_sum_per_group(scores_for_choice, cfg.n_group))  # [N, G]
    group_mask = emit("mlp.gate.group_mask", best_groups_mask(group_scores, cfg.topk_group))  # [N, G]

    eligible = np.repeat(group_mask > 0, cfg.n_routed_experts // cfg.n_group, axis=1)  # [N, E]
    masked = np.where(eligible, scores_for_choice, np.float32(-np.inf))  # [N, E]
    topk_idx = emit("mlp.gate.topk_idx", top_k(masked, cfg.num_experts_per_tok))  # [N, k]

    weights = np.take_along_axis(scores, topk_idx, axis=1)  # [N, k], unbiased
    if cfg.norm_topk_prob:
        weights = weights / (np.sum(weights, axis=1, keepdims=True) + np.float32(1e-20))
    weights = emit("mlp.gate.topk_weight", weights * np.float32(cfg.routed_scaling_factor))  # [N, k]
    return Routing(topk_idx, weights)


def top2_sum_per_group(scores: np.ndarray, n_group: int) -> np.ndarray:
    """[N, E] -> [N, G]: each group's two best scores, summed."""
    grouped = scores.reshape(scores.shape[0], n_group, -1)  # [N, G, E/G]
    best_two = np.sort(grouped, axis=-1)[..., -2:]
    return best_two[..., 1] + best_two[..., 0]


def best_groups_mask(group_scores: np.ndarray, topk_group: int) -> np.ndarray:
    """[N, G] -> [N, G] float32 with 1.0 on the topk_group best groups."""
    mask = np.zeros_like(group_scores)
    np.put_along_axis(mask, top_k(group_scores, topk_group), np.float32(1), axis=1)
    return mask


def top_k(values: np.ndarray, k: int) -> np.ndarray:
    """Indices [N, k] of the k largest values per row, best first (ties: lower index first).
    [N, E] -> [N, k]; it also picks the topk_group best of the groups [N, G]."""
    return np.argsort(-values, axis=1, kind="stable")[:, :k].astype(np.int64)
