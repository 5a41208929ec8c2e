"""DeepSeek-V4's mixture of experts: clamped SwiGLU experts, routed and shared.

Each expert (routed or shared) clamps its two input projections before the SwiGLU product, at
L = `swiglu_limit` (10 in V4):

    gate = min(w1 x, L)        up = clip(w3 x, -L, L)        out = w2 (silu(gate) * up)

How often the clamp bites is shown as counts: for each routed expert, how many of its gate
values were above L and how many of its up values were outside -L..L over the tokens it ran
on (`ffn.experts.clamp_counts` [E, 2]); the same for the shared expert
(`ffn.shared_experts.clamp_counts` [2]). Each chosen expert runs once, on the tokens that chose
it, and only chosen experts are read. Weights (transformers' names, relative to the layer):
`mlp.experts.{e}.{gate,up,down}_proj.weight` (the published w1, w3, w2) and
`mlp.shared_experts.{gate,up,down}_proj.weight`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepper.kernels.linear import linear
from stepper.model.layer_weights import LayerWeights
from stepper.model.ops import silu
from stepper.model.router import Routing
from stepper.model.v4_router import RouterDims, v4_route
from stepper.seams.trace import Emitter


@dataclass(frozen=True)
class MoeDims:
    router: RouterDims
    swiglu_limit: float  # L
    n_routed_experts: int  # E
    shared: bool  # n_shared_experts == 1


def v4_moe(x: np.ndarray, ids: np.ndarray, w: LayerWeights, dims: MoeDims, emit: Emitter) -> np.ndarray:
    """x [B, T, d] after ffn_norm, token ids [B, T] -> routed + shared output [B, T, d]."""
    B, T, d = x.shape
    tokens = x.reshape(B * T, d)  # [N, d]
    routing = v4_route(tokens, ids.reshape(-1), w, dims.router, emit)
    routed, counts = routed_experts(tokens, routing, w, dims.swiglu_limit, dims.n_routed_experts)  # [N, d], [E, 2]
    emit.shown("ffn.experts.clamp_counts", counts)
    routed = emit("ffn.routed_output", routed.reshape(B, T, d))  # [B, T, d]
    if not dims.shared:
        return routed
    out, counts = clamped_swiglu(x, expert_matrices(w, "mlp.shared_experts."), dims.swiglu_limit)  # [B, T, d], [2]
    emit.shown("ffn.shared_experts.clamp_counts", counts)
    return routed + emit("ffn.shared_output", out)


def routed_experts(tokens: np.ndarray, routing: Routing, w: LayerWeights, limit: float,
                   n_experts: int) -> tuple[np.ndarray, np.ndarray]:
    """The sum over k of topk_weight(n, k) * expert_k(x_n), each chosen expert run once on its
    tokens.  [N, d] -> [N, d], and the clamp counts [E, 2]."""
    out = np.zeros_like(tokens)
    counts = np.zeros((n_experts, 2), dtype=np.int64)
    for e in np.unique(routing.topk_idx):
        rows, ranks = np.nonzero(routing.topk_idx == e)  # the tokens that chose e (each at most once)
        y, counts[e] = clamped_swiglu(tokens[rows], expert_matrices(w, f"mlp.experts.{e}."), limit)  # its tokens x d
        out[rows] += y * routing.topk_weight[rows, ranks][:, None]
    return out, counts


def clamped_swiglu(x: np.ndarray, weights: tuple, limit: float) -> tuple[np.ndarray, np.ndarray]:
    """w2(silu(min(w1 x, L)) * clip(w3 x, -L, L)).  [..., d] -> [..., d], and [2] counts of the
    gate values above L and the up values outside -L..L."""
    gate_w, up_w, down_w = weights
    L = np.float32(limit)
    gate, up = linear(x, gate_w), linear(x, up_w)  # [..., moe_inter] each
    counts = np.array([np.count_nonzero(gate > L), np.count_nonzero(np.abs(up) > L)], dtype=np.int64)
    act = silu(np.minimum(gate, L)) * np.clip(up, -L, L)  # [..., moe_inter]
    return linear(act, down_w), counts


def expert_matrices(w: LayerWeights, prefix: str) -> tuple:
    """An expert's gate (w1), up (w3) and down (w2) as matrices to multiply with."""
    return (w.matrix(prefix + "gate_proj.weight"), w.matrix(prefix + "up_proj.weight"),
            w.matrix(prefix + "down_proj.weight"))
