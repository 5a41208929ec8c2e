"""The MoE router: score, select, normalise, each a small function chosen by the config.

- Scoring (`scoring_func`): DeepSeek-V3 and Kimi K2 score each expert with a sigmoid, independent
  affinities in (0, 1); DeepSeek-V2 with a softmax over the experts, which compete and sum to 1.
- Selection (`topk_method`):
  - `noaux_tc` (V3, K2): a learned bias, e_score_correction_bias, is added only to *choose*
    experts (it balances load without an auxiliary loss). Experts form n_group groups, a group
    scores as the sum of its two best biased scores, only the best topk_group groups stay
    eligible. Kimi K2 has a single group, so that step keeps everything.
  - `greedy` (V2-Lite): the k best scores.
  - `group_limited_greedy` (V2): a group scores as its single best expert's score; the k best
    of the topk_group best groups.
- Normalisation: the chosen experts' unbiased scores, divided by their sum when norm_topk_prob
  (V3, K2), times routed_scaling_factor (2.827 for K2, 2.5 for V3, 16 for V2, 1 for V2-Lite).

Shapes name the catalogue's dimensions: N tokens, d hidden, E routed experts, G expert groups,
k chosen experts per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepper.config import Config
from stepper.kernels.linear import linear
from stepper.model.ops import sigmoid, softmax
from stepper.seams.swap import exercise
from stepper.seams.trace import Emitter


@dataclass(frozen=True)
class Routing:
    topk_idx: np.ndarray  # [N, k] int64, best first
    topk_weight: np.ndarray  # [N, k] float32


@exercise
def route(x: np.ndarray, gate: np.ndarray, bias: np.ndarray | None, cfg: Config, emit: Emitter) -> Routing:
    """x [N, d], gate [E, d], bias [E] (noaux_tc with a bias, else None) -> the chosen experts and their weights."""
    x, gate = x.astype(np.float32, copy=False), gate.astype(np.float32, copy=False)  # copied only if not float32
    logits = emit("mlp.gate.logits", linear(x, gate))  # [N, E]
    scores = SCORING[cfg.scoring_func](logits, emit)  # [N, E]
    choice = SELECTION[cfg.topk_method](scores, bias, cfg, emit)  # [N, E], -inf where not eligible
    topk_idx = emit.choice("mlp.gate.topk_idx", top_k(choice, cfg.num_experts_per_tok), choice.shape[-1],
                           "experts")  # [N, k]
    weights = np.take_along_axis(scores, topk_idx, axis=1)  # [N, k], unbiased
    return Routing(topk_idx, emit("mlp.gate.topk_weight", normalise(weights, cfg)))


# Scoring: logits [N, E] -> scores [N, E]

def sigmoid_scores(logits: np.ndarray, emit: Emitter) -> np.ndarray:
    """Independent affinities in (0, 1) (V3, K2)."""
    return emit("mlp.gate.scores", sigmoid(logits))


def softmax_scores(logits: np.ndarray, emit: Emitter) -> np.ndarray:
    """A distribution over the experts, summing to 1 (V2)."""
    return emit("mlp.gate.softmax_scores", softmax(logits))


SCORING = {"sigmoid": sigmoid_scores, "softmax": softmax_scores}


# Selection: scores [N, E] -> the scores to choose by [N, E], -inf where an expert may not be chosen

def noaux_tc(scores: np.ndarray, bias: np.ndarray | None, cfg: Config, emit: Emitter) -> np.ndarray:
    """Biased scores, limited to the groups whose two best biased scores sum highest (V3, K2); a
    router without a bias (A.X-K1, Mistral 4) chooses by the scores themselves."""
    scores_for_choice = emit("mlp.gate.scores_for_choice", scores if bias is None else scores + bias)  # [N, E]
    group_scores = emit("mlp.gate.group_scores", top2_sum_per_group(scores_for_choice, cfg.n_group))  # [N, G]
    return keep_best_groups(scores_for_choice, group_scores, cfg, emit)


def greedy(scores: np.ndarray, bias: None, cfg: Config, emit: Emitter) -> np.ndarray:
    """Every expert is eligible: the k best scores win (V2-Lite)."""
    return scores


def group_limited_greedy(scores: np.ndarray, bias: None, cfg: Config, emit: Emitter) -> np.ndarray:
    """Scores limited to the groups whose best expert scores highest (V2)."""
    group_max = emit("mlp.gate.group_max", max_per_group(scores, cfg.n_group))  # [N, G]
    return keep_best_groups(scores, group_max, cfg, emit)


SELECTION = {"noaux_tc": noaux_tc, "greedy": greedy, "group_limited_greedy": group_limited_greedy}


def keep_best_groups(scores: np.ndarray, group_scores: np.ndarray, cfg: Config, emit: Emitter) -> np.ndarray:
    """scores [N, E] with the experts outside the topk_group best groups set to -inf (A.X-K2: 0.0,
    as its reference fills them; an expert there can then beat a kept one whose biased score is below 0)."""
    group_mask = emit("mlp.gate.group_mask", best_groups_mask(group_scores, cfg.topk_group))  # [N, G]
    eligible = np.repeat(group_mask > 0, cfg.router_experts // cfg.n_group, axis=1)  # [N, E]
    dropped = np.float32(0) if cfg.masked_groups_zero else np.float32(-np.inf)  # A.X-K2 fills 0.0
    return np.where(eligible, scores, dropped)  # [N, E]


def top2_sum_per_group(scores: np.ndarray, n_group: int) -> np.ndarray:
    """[N, E] -> [N, G]: each group's two best scores, summed."""
    grouped = scores.reshape(scores.shape[0], n_group, -1)  # [N, G, E/G]
    best_two = np.sort(grouped, axis=-1)[..., -2:]
    return best_two[..., 1] + best_two[..., 0]


def max_per_group(scores: np.ndarray, n_group: int) -> np.ndarray:
    """[N, E] -> [N, G]: each group's best score."""
    return scores.reshape(scores.shape[0], n_group, -1).max(axis=-1)


def best_groups_mask(group_scores: np.ndarray, topk_group: int) -> np.ndarray:
    """[N, G] -> [N, G] float32 with 1.0 on the topk_group best groups."""
    mask = np.zeros_like(group_scores)
    np.put_along_axis(mask, top_k(group_scores, topk_group), np.float32(1), axis=1)
    return mask


# Normalisation: the chosen experts' unbiased scores [N, k] -> their weights [N, k]

def normalise(weights: np.ndarray, cfg: Config) -> np.ndarray:
    """Divided by their sum (plus 1e-20) when norm_topk_prob, then times routed_scaling_factor."""
    if cfg.norm_topk_prob:
        weights = weights / (np.sum(weights, axis=1, keepdims=True) + np.float32(1e-20))
    return weights * np.float32(cfg.routed_scaling_factor)


def top_k(values: np.ndarray, k: int) -> np.ndarray:
    """Indices [N, k] of the k largest values per row, best first (ties: lower index first).
    [N, E] -> [N, k]; it also picks the topk_group best of the groups [N, G]."""
    return np.argsort(-values, axis=1, kind="stable")[:, :k].astype(np.int64)
