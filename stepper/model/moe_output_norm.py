"""A.X-K1's one change to DeepSeek-V3's layer: an RMSNorm on the MoE's output (routed experts plus
the shared expert) before it joins the residual stream. Dense layers do not use it, although the
published checkpoints store its weight in every layer (`model.layers.N.post_mlp_layernorm.weight`;
transformers' save_pretrained writes it in the MoE layers alone: families/axk1.py)."""

from __future__ import annotations

import numpy as np

from stepper.config import Config
from stepper.model.layer_weights import LayerWeights
from stepper.model.ops import rms_norm
from stepper.seams.trace import Emitter


def post_mlp_layernorm(moe_output: np.ndarray, w: LayerWeights, cfg: Config, emit: Emitter) -> np.ndarray:
    """RMSNorm(routed_output + shared_output) with eps rms_norm_eps.  [B, T, d] -> [B, T, d]"""
    normed = rms_norm(moe_output, w("post_mlp_layernorm.weight"), cfg.rms_norm_eps)
    return emit("mlp.post_mlp_layernorm", normed)
