"""The mixture of experts: routed SwiGLU experts weighted by the router, plus shared experts.

This is the readable reference: each token runs through each of its chosen experts in turn.
Only the experts some token chose are ever read from the weight source.
"""

from __future__ import annotations

import numpy as np

from ..config import Config
from ..ops import swiglu
from ..trace import Emitter
from .layer_weights import LayerWeights
from .router import Routing, route


def moe(x: np.ndarray, w: LayerWeights, cfg: Config, emit: Emitter) -> np.ndarray:
    """[B, T, D] -> routed_output + shared_output [B, T, D]."""
    B, T, D = x.shape
    tokens = x.reshape(B * T, D)  # [N, D]
    routing = route(tokens, w("mlp.gate.weight"), w("mlp.gate.e_score_correction_bias"), cfg, emit)
    routed = routed_experts(tokens, routing, w).reshape(B, T, D)
    emit("mlp.routed_output", routed)
    if cfg.n_shared_experts == 0:
        return routed
    shared = swiglu(x, *expert_weights(w, "mlp.shared_experts."))
    emit("mlp.shared_output", shared)
    return routed + shared


def routed_experts(tokens: np.ndarray, routing: Routing, w: LayerWeights) -> np.ndarray:
    """sum_k weight[n, k] * expert_{idx[n, k]}(x_n), token by token.  [N, D] -> [N, D]"""
    chosen = {int(e): expert_weights(w, f"mlp.experts.{e}.") for e in np.unique(routing.topk_idx)}
    out = np.zeros_like(tokens)
    for n, x_n in enumerate(tokens):
        for e, weight in zip(routing.topk_idx[n], routing.topk_weight[n]):
            out[n] += swiglu(x_n, *chosen[int(e)]) * weight
    return out


def expert_weights(w: LayerWeights, prefix: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return w(prefix + "gate_proj.weight"), w(prefix + "up_proj.weight"), w(prefix + "down_proj.weight")
