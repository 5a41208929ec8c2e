"""One decoder block: pre-norm attention and pre-norm FFN, each added to the residual stream."""

from __future__ import annotations

import numpy as np

from stepper.config import Config
from stepper.model.attention import LayerCache, Rope, mla_attention
from stepper.model.layer_weights import LayerWeights
from stepper.model.mlp import dense_mlp
from stepper.model.moe import moe
from stepper.model.ops import rms_norm
from stepper.trace import Emitter


def decoder_layer(
    hidden: np.ndarray, w: LayerWeights, cfg: Config, rope: Rope, cache: LayerCache | None, emit: Emitter,
    attn: str = "naive", dispatch: str = "grouped",
) -> np.ndarray:
    """[B, T, D] residual stream in -> [B, T, D] out."""
    emit("hidden_states", hidden)
    x = rms_norm(hidden, w("input_layernorm.weight"), cfg.rms_norm_eps)
    emit("input_layernorm", x)
    hidden = hidden + mla_attention(x, w, cfg, rope, cache, emit, attn)
    emit("attn_residual", hidden)

    x = rms_norm(hidden, w("post_attention_layernorm.weight"), cfg.rms_norm_eps)
    emit("post_attention_layernorm", x)
    ffn = moe(x, w, cfg, emit, dispatch) if cfg.is_moe_layer(w.layer) else dense_mlp(x, w, emit)
    emit("mlp_output", ffn)
    hidden = hidden + ffn
    emit("output", hidden)
    return hidden
