"""The expert groups a grouped router kept for each token (`stepper run --show routing`, under the
routing map, for a router with n_group > 1: DeepSeek-V3's, A.X-K1's, Mistral 4's, V2's).

Each row is a token, each column a group of E / G experts: '·' a group the router dropped (its
experts cannot be chosen), '○' a kept group none of the token's experts came from, a digit how
many of its k experts came from that kept group. The caption says how this router judged the
groups: the sum of each group's two best scores (biased, or the scores themselves when the router
has no bias), or V2's best score alone.
"""

from __future__ import annotations

import numpy as np
from rich.console import RenderableType
from rich.text import Text

from stepper.config import Config
from stepper.views.pictures import DIM, TOKEN_ROWS, Picture, caption, heat, line, pad_left

DROPPED, UNUSED = "·", "○"


def group_rule(cfg: Config) -> str:
    """How this config's router judges a group, in words."""
    if cfg.topk_method == "group_limited_greedy":
        return "a group scores as its best softmax score (V2)"
    scores = "sigmoid" if cfg.scoring_func == "sigmoid" else "softmax"
    biased = f"{scores} score + e_score_correction_bias" if cfg.router_bias else f"{scores} score, no bias"
    return f"a group scores as the sum of its two best ({biased})"


def group_map(group_mask: np.ndarray, topk_idx: np.ndarray, cfg: Config) -> RenderableType:
    """group_mask [N, G] (1 kept, 0 dropped) and topk_idx [N, k] as a token x group grid."""
    mask = np.asarray(group_mask)
    idx = np.asarray(topk_idx, dtype=np.int64)
    if mask.ndim != 2 or idx.ndim != 2 or mask.shape[0] != idx.shape[0]:
        raise ValueError(f"group_mask [N, G] and topk_idx [N, k] must have the same N, got {list(mask.shape)} "
                         f"and {list(idx.shape)}")
    per_group = cfg.n_routed_experts // mask.shape[1]
    chosen = np.stack([np.bincount(row // per_group, minlength=mask.shape[1]) for row in idx]) if idx.size else mask * 0
    return Picture(lambda width: draw_groups(mask > 0, chosen, cfg, per_group))


def draw_groups(kept: np.ndarray, chosen: np.ndarray, cfg: Config, per_group: int) -> list[Text]:
    n_tokens, groups = kept.shape
    margin = max(len("tok\\g"), len(str(n_tokens - 1))) + 1
    out = [line(("tok\\g".rjust(margin - 1) + " ", DIM), ("".join(str(g % 10) for g in range(groups)), DIM))]
    for t in range(min(n_tokens, TOKEN_ROWS)):
        cells = [(DROPPED, DIM) if not kept[t, g] else (UNUSED, "") if chosen[t, g] == 0
                 else (str(min(int(chosen[t, g]), 9)), heat(chosen[t, g] / max(cfg.num_experts_per_tok, 1)))
                 for g in range(groups)]
        out.append(line((pad_left(str(t), margin - 1) + " ", DIM), *cells))
    if n_tokens > TOKEN_ROWS:
        out.append(caption(f"… {n_tokens - TOKEN_ROWS} more tokens not shown (N={n_tokens})"))
    out.append(caption(f"{DROPPED} dropped group  {UNUSED} kept, none chosen  digit: experts chosen from it · "
                       f"{groups} groups of {per_group} experts, {cfg.topk_group} kept per token; {group_rule(cfg)}"))
    return out
