"""DeepSeek-V4's router: sqrt-softplus scores; experts chosen by a hash of the token or by score.

    logits = x @ gate^T                         [N, E]
    scores = sqrt(softplus(logits))             [N, E]   (`scoring_func: sqrtsoftplus`)

- Hash layers (the first `num_hash_layers`): the experts are a fixed table's row for the token,
  `tid2eid[token_id]` [N, k]; the learned gate only weighs them.
- Score layers: the top k of scores + bias (the bias, `e_score_correction_bias`, only chooses).

Either way the weights are the chosen experts' unbiased scores divided by their sum (+ 1e-20),
times `routed_scaling_factor`. Tensors are emitted under DeepSeek's module name, `ffn.gate.*`.
Weights (transformers' names, relative to the layer):
`mlp.gate.weight` [E, d], `mlp.gate.tid2eid` [V, k] (hash layers) or
`mlp.gate.e_score_correction_bias` [E] (score layers).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepper.kernels.linear import linear
from stepper.model.layer_weights import LayerWeights
from stepper.model.router import Routing, top_k
from stepper.seams.trace import Emitter


@dataclass(frozen=True)
class RouterDims:
    top_k: int  # num_experts_per_tok
    routed_scaling_factor: float
    hashed: bool  # this layer takes its experts from tid2eid


def sqrt_softplus(logits: np.ndarray) -> np.ndarray:
    """sqrt(log(1 + exp(logits))), computed without overflow.  [N, E] -> [N, E]"""
    return np.sqrt(np.logaddexp(np.float32(0), logits))


def v4_route(x: np.ndarray, ids: np.ndarray, w: LayerWeights, dims: RouterDims, emit: Emitter) -> Routing:
    """x [N, d], token ids [N] -> the chosen experts [N, k] and their weights [N, k]."""
    logits = emit("ffn.gate.logits", linear(x, w("mlp.gate.weight")))  # [N, E]
    scores = emit("ffn.gate.scores", sqrt_softplus(logits))  # [N, E]
    if dims.hashed:
        chosen = emit.choice("ffn.gate.hash_idx", w.source.get_rows(w.prefix + "mlp.gate.tid2eid", ids),
                             scores.shape[-1], "experts")  # [N, k]
    else:
        biased = emit("ffn.gate.biased_scores", scores + w("mlp.gate.e_score_correction_bias"))  # [N, E]
        chosen = emit.choice("ffn.gate.topk_idx", top_k(biased, dims.top_k), scores.shape[-1],
                             "experts")  # [N, k], best first
    weights = np.take_along_axis(scores, chosen, axis=1)  # [N, k], unbiased
    weights = weights / (weights.sum(axis=1, keepdims=True) + np.float32(1e-20))  # [N, k], summing to 1
    weights = weights * np.float32(dims.routed_scaling_factor)
    return Routing(chosen, emit("ffn.gate.weights", weights.astype(np.float32)))
