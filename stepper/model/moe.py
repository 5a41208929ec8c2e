"""The mixture of experts: routed SwiGLU experts weighted by the router, plus shared experts.

Two ways to run the routed experts, equal to float32 round-off:

- `per_token` (the readable reference): each token runs through each of its chosen experts.
- `grouped` (the default): each chosen expert runs once, on the batch of tokens that chose it,
  and the results are scattered back with their weights. The expert's FP8 weights are decoded
  tile by tile inside the products and dropped afterwards, so memory holds one expert at a time
  whatever the prompt length.

Only the experts some token chose are ever read from the weight source. Where the config sets a
`swiglu_limit` (Hy4) the routed experts clamp their gate and up projections first (DeepSeek-V4's
experts: model.clamped_experts), each chosen expert run once on its tokens whatever the dispatch.
"""

from __future__ import annotations

import numpy as np

from stepper.config import Config
from stepper.kernels import experts
from stepper.model import clamped_experts
from stepper.model.layer_weights import LayerWeights
from stepper.model.ops import swiglu
from stepper.model.options import LayerOptions
from stepper.model.router import Routing, route
from stepper.seams.trace import Emitter
from stepper.weights.names import router_names


def moe(x: np.ndarray, w: LayerWeights, options: LayerOptions, emit: Emitter) -> np.ndarray:
    """[B, T, d] -> routed_output + shared_output [B, T, d]; the options' dispatch "grouped" or
    "per_token". w carries the config."""
    cfg = w.cfg
    B, T, d = x.shape
    tokens = x.reshape(B * T, d)  # [N, d]
    gate, bias_name = router_names(cfg)
    bias = w(bias_name) if cfg.topk_method == "noaux_tc" and cfg.router_bias else None  # [E], V3 and K2
    # the router's weight as float32 in kept memory: stepping a layer decodes its BF16 once
    routing = route(tokens, w.float32(gate), bias, cfg, emit)
    routing, zero_weight = without_zero_experts(routing, cfg)  # LongCat: [N] the weight its zero experts got
    if cfg.swiglu_limit is not None:  # Hy4: each chosen expert clamped, once on its tokens; [N, d], [E, 2]
        routed, counts = clamped_experts.routed_experts(tokens, routing, w, cfg.swiglu_limit, cfg.n_routed_experts)
        emit.shown("mlp.experts.clamp_counts", counts)  # [E, 2]: gate values above the limit, up values outside it
        shared = None  # the shared expert, unclamped, made below
    elif options.dispatch == "grouped":  # [N, d], and the shared expert's [N, d] made beside them
        routed, shared = grouped_with_shared(tokens, routing, w, emit, cfg.n_shared_experts > 0)
    else:
        routed, shared = per_token_experts(tokens, routing, w), None  # [N, d]
    if cfg.zero_experts:
        identity = emit("mlp.zero_expert_output", (tokens * zero_weight[:, None]).reshape(B, T, d))  # [B, T, d]
        routed = routed + identity.reshape(B * T, d)
    routed = emit("mlp.routed_output", routed.reshape(B, T, d))  # [B, T, d]
    if cfg.n_shared_experts == 0:
        return routed
    if shared is None:
        shared = swiglu(x, *expert_matrices(w, "mlp.shared_experts."))
    shared = emit("mlp.shared_output", shared.reshape(B, T, d))  # [B, T, d]
    return routed + shared


def without_zero_experts(routing: Routing, cfg: Config) -> tuple[Routing, np.ndarray]:
    """LongCat's zero experts (indices from n_routed_experts on) return their input: the routing
    among the real experts (-1, weight 0, where a zero expert was chosen), and the weight each
    token's zero experts got, summed [N]."""
    zero = routing.topk_idx >= cfg.n_routed_experts  # [N, k]
    real = Routing(np.where(zero, -1, routing.topk_idx), np.where(zero, np.float32(0), routing.topk_weight))
    return real, np.sum(np.where(zero, routing.topk_weight, np.float32(0)), axis=1)


def per_token_experts(tokens: np.ndarray, routing: Routing, w: LayerWeights) -> np.ndarray:
    """The sum over k of topk_weight(n, k) * expert_topk_idx(n, k)(x_n), token by token.  [N, d] -> [N, d]"""
    chosen = {int(e): expert_arrays(w, f"mlp.experts.{e}.") for e in np.unique(routing.topk_idx) if e >= 0}
    out = np.zeros_like(tokens)
    for n, x_n in enumerate(tokens):
        for e, weight in zip(routing.topk_idx[n], routing.topk_weight[n]):
            if e >= 0:  # -1: a zero expert (without_zero_experts)
                out[n] += swiglu(x_n, *chosen[int(e)]) * weight
    return out


def grouped_experts(tokens: np.ndarray, routing: Routing, w: LayerWeights, emit: Emitter) -> np.ndarray:
    """Each chosen expert once on its tokens, scattered back with the weights.  [N, d] -> [N, d]"""
    return grouped_with_shared(tokens, routing, w, emit, False)[0]


def grouped_with_shared(tokens: np.ndarray, routing: Routing, w: LayerWeights, emit: Emitter,
                        with_shared: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """grouped_experts, and with_shared the shared expert on every token made beside them
    (kernels.experts lets two cores share the lot).  [N, d] -> [N, d], and the shared expert's
    [N, d] (None without)"""
    out = np.zeros_like(tokens)
    chosen = np.unique(routing.topk_idx[routing.topk_idx >= 0])  # -1: a zero expert (without_zero_experts)
    picked = [np.nonzero(routing.topk_idx == e) for e in chosen]  # (rows, ranks): the tokens that chose e, once each
    # swiglu(tokens[rows], ...) * weights[:, None], each row weighed before down instead
    groups = [(rows, routing.topk_weight[rows, ranks]) for rows, ranks in picked]
    prefixes = [f"mlp.experts.{e}." for e in chosen]
    if with_shared:
        groups.append((np.arange(len(tokens)), None))  # every token, unweighted
        prefixes.append("mlp.shared_experts.")

    def progress(done: int) -> None:
        emit.progress(f"layer {w.layer} experts", min(done, len(chosen)), len(chosen))

    ys = experts.swiglus(tokens, groups, lambda i: expert_matrices(w, prefixes[i]), progress)
    for (rows, _), y in zip(groups[: len(chosen)], ys):
        out[rows] += y
    shared = next(ys) if with_shared else None
    progress(len(chosen))
    return out, shared


def expert_arrays(w: LayerWeights, prefix: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An expert's gate, up [moe_inter, d] and down [d, moe_inter] as float32 arrays."""
    return w(prefix + "gate_proj.weight"), w(prefix + "up_proj.weight"), w(prefix + "down_proj.weight")


def expert_matrices(w: LayerWeights, prefix: str) -> tuple:
    """An expert's gate, up and down as matrices to multiply with (FP8 ones stay FP8)."""
    return (w.matrix(prefix + "gate_proj.weight"), w.matrix(prefix + "up_proj.weight"),
            w.matrix(prefix + "down_proj.weight"))
