"""One decoder block: pre-norm attention and pre-norm FFN, each added to the residual stream.
In DeepSeek-V3.2 the Lightning Indexer runs first and hands attention its mask."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from stepper.model.attention import mla_attention
from stepper.model.cache import LayerCache
from stepper.model.indexer import index_mask
from stepper.model.layer_weights import LayerWeights
from stepper.model.mlp import dense_mlp
from stepper.model.moe import moe
from stepper.model.moe_output_norm import post_mlp_layernorm
from stepper.model.ops import rms_norm
from stepper.model.options import LayerOptions
from stepper.seams.trace import Emitter

# What a family's decoder layer is: (residual stream [B, T, d], the layer's weights (config and rope
# on them), its cache, the run's options, the emitter) -> the residual stream [B, T, d]
DecoderLayer = Callable[[np.ndarray, LayerWeights, LayerCache | None, LayerOptions, Emitter], np.ndarray]


def decoder_layer(hidden: np.ndarray, w: LayerWeights, cache: LayerCache | None, options: LayerOptions,
                  emit: Emitter) -> np.ndarray:
    """[B, T, d] residual stream in -> [B, T, d] out; w carries the config and the rotary tables."""
    cfg = w.cfg
    hidden = emit("hidden_states", hidden)
    x = emit("input_layernorm", rms_norm(hidden, w("input_layernorm.weight"), cfg.rms_norm_eps))
    cache = LayerCache() if cache is None else cache
    mask = index_mask(x, w, cache, options, emit) if cfg.has_indexer else None  # [B, T, S] or None
    hidden = emit("attn_residual", hidden + mla_attention(x, w, cache, options, emit, mask))

    x = emit("post_attention_layernorm", rms_norm(hidden, w("post_attention_layernorm.weight"), cfg.rms_norm_eps))
    ffn = moe(x, w, options, emit) if cfg.is_moe_layer(w.layer) else dense_mlp(x, w, emit)
    if cfg.moe_output_norm and cfg.is_moe_layer(w.layer):  # A.X-K1
        ffn = post_mlp_layernorm(ffn, w, cfg, emit)
    ffn = emit("mlp_output", ffn)
    return emit("output", hidden + ffn)
