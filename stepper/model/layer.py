"""One decoder block: pre-norm attention and pre-norm FFN, each added to the residual stream.
In DeepSeek-V3.2 the Lightning Indexer runs first and hands attention its mask.

The block is written as its steps (`pre_norm_block`: `attention_block`, `ffn_output`,
`layer_output`), which the MLA families of issue 33 reuse: GLM-5's shared layers, A.X-K2's gated
norms and MiniCPM3's scaled branches are branches of these steps; LongCat-Flash's layer
(model.longcat) composes them in another order; Kimi Linear's (model.kimi_linear_layer) hands the
block its own attention. Each named tensor has one site."""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce

import numpy as np

from stepper.model.attention import mla_attention
from stepper.model.cache import LayerCache
from stepper.model.gated_norm import gated_input_norm, gated_post_attention_norm, is_gated, norm_weight
from stepper.model.indexer import index_mask, reused_index_mask
from stepper.model.layer_weights import LayerWeights
from stepper.model.mlp import dense_mlp
from stepper.model.moe import moe
from stepper.model.moe_output_norm import post_mlp_layernorm
from stepper.model.ops import rms_norm
from stepper.model.options import LayerOptions
from stepper.model.scalings import scaled_branch
from stepper.seams.trace import Emitter

# What a family's decoder layer is: (residual stream [B, T, d], the layer's weights (config and rope
# on them), its cache, the run's options, the emitter) -> the residual stream [B, T, d]
DecoderLayer = Callable[[np.ndarray, LayerWeights, LayerCache | None, LayerOptions, Emitter], np.ndarray]


def decoder_layer(hidden: np.ndarray, w: LayerWeights, cache: LayerCache | None, options: LayerOptions,
                  emit: Emitter) -> np.ndarray:
    """[B, T, d] residual stream in -> [B, T, d] out; w carries the config and the rotary tables."""
    cfg = w.cfg
    cache = LayerCache() if cache is None else cache

    def ffn(x: np.ndarray) -> np.ndarray:  # [B, T, d] -> [B, T, d]
        return moe(x, w, options, emit) if cfg.is_moe_layer(w.layer) else dense_mlp(x, w, emit)

    return pre_norm_block(hidden, w, emit, mla_step(w, cache, options, emit), ffn)


Sublayer = Callable[[np.ndarray], np.ndarray]  # a normed stream [B, T, d] -> the branch added to it [B, T, d]


def mla_step(w: LayerWeights, cache: LayerCache, options: LayerOptions, emit: Emitter) -> Sublayer:
    """MLA on the layer's normed stream, under the indexer's mask where the layer has one: its own
    choice (V3.2), or the choice GLM-5's shared layer reuses from the layer before."""
    cfg = w.cfg

    def attention(x: np.ndarray) -> np.ndarray:  # [B, T, d] -> [B, T, d]
        mask = None  # [B, T, S]
        if cfg.index_reused(w.layer):
            mask = reused_index_mask(cache, x.shape[1], w.layer, emit)
        elif cfg.has_indexer:
            mask = index_mask(x, w, cache, options, emit)
        return mla_attention(x, w, cache, options, emit, mask)
    return attention


def pre_norm_block(hidden: np.ndarray, w: LayerWeights, emit: Emitter, attention: Sublayer,
                   ffn: Sublayer) -> np.ndarray:
    """The residual stream through a block: attention on its RMSNorm, added; the FFN on the next
    RMSNorm, added (every family whose block is this shape: MLA's, Kimi Linear's).  [B, T, d] -> [B, T, d]"""
    hidden = layer_input(hidden, emit)
    hidden, x = attention_block(hidden, w, emit, attention)  # [B, T, d] twice
    return layer_output(emit, hidden, ffn_output(ffn(x), w, emit))


def layer_input(hidden: np.ndarray, emit: Emitter) -> np.ndarray:
    """The residual stream entering the layer.  [B, T, d]"""
    return emit("hidden_states", hidden)


def attention_block(hidden: np.ndarray, w: LayerWeights, emit: Emitter,
                    attention: Sublayer) -> tuple[np.ndarray, np.ndarray]:
    """Pre-norm attention added to the stream, and the stream's post-attention norm (what the FFN
    reads).  [B, T, d] -> [B, T, d] twice"""
    cfg = w.cfg
    x = emit("input_layernorm", rms_norm(hidden, w(norm_weight(cfg, w.layer, "input_layernorm")), cfg.rms_norm_eps))
    if is_gated(cfg, w.layer, "input_layernorm"):
        x = gated_input_norm(x, w, emit)
    attn_out = attention(x)  # [B, T, d]
    if cfg.has_mup_scalings:
        attn_out = emit("attn_scaled", scaled_branch(attn_out, cfg))
    hidden = emit("attn_residual", hidden + attn_out)

    x = rms_norm(hidden, w(norm_weight(cfg, w.layer, "post_attention_layernorm")), cfg.rms_norm_eps)
    x = emit("post_attention_layernorm", x)
    if is_gated(cfg, w.layer, "post_attention_layernorm"):
        x = gated_post_attention_norm(x, w, emit)
    return hidden, x


def ffn_output(ffn: np.ndarray, w: LayerWeights, emit: Emitter) -> np.ndarray:
    """The FFN's output, the branch added to the stream (A.X-K1: normed after the MoE; MiniCPM3:
    scaled).  [B, T, d]"""
    if w.cfg.moe_output_norm and w.cfg.is_moe_layer(w.layer):  # A.X-K1
        ffn = post_mlp_layernorm(ffn, w, w.cfg, emit)
    ffn = emit("mlp_output", ffn)
    return emit("mlp_scaled", scaled_branch(ffn, w.cfg)) if w.cfg.has_mup_scalings else ffn


def layer_output(emit: Emitter, hidden: np.ndarray, *branches: np.ndarray) -> np.ndarray:
    """The stream plus the branches, added left to right.  [B, T, d]"""
    return emit("output", reduce(np.add, branches, hidden))
