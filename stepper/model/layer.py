"""One decoder block: pre-norm attention and pre-norm FFN, each added to the residual stream.
In DeepSeek-V3.2 the Lightning Indexer runs first and hands attention its mask.

The block is written as its steps (`attention_block`, `ffn_output`, `layer_output`), which
LongCat-Flash's layer (model.longcat) composes in another order: each named tensor has one site."""

from __future__ import annotations

from functools import reduce

import numpy as np

from stepper.config import Config
from stepper.model.attention import mla_attention
from stepper.model.cache import LayerCache
from stepper.model.gated_norm import gated_input_norm, gated_post_attention_norm, is_gated, norm_weight
from stepper.model.indexer import index_mask, reused_index_mask
from stepper.model.layer_weights import LayerWeights
from stepper.model.mlp import dense_mlp
from stepper.model.moe import moe
from stepper.model.ops import rms_norm
from stepper.model.rope import Rope
from stepper.model.scalings import scaled_branch
from stepper.seams.trace import Emitter


def decoder_layer(
    hidden: np.ndarray, w: LayerWeights, cfg: Config, rope: Rope, cache: LayerCache | None, emit: Emitter,
    attn: str = "naive", dispatch: str = "grouped", index_scoring: str = "exact", previous: LayerCache | None = None,
) -> np.ndarray:
    """[B, T, d] residual stream in -> [B, T, d] out; index_scoring "exact" or "fp8" (model.indexer);
    previous: the layer before's cache, whose index choice a GLM-5 "shared" layer reuses."""
    hidden = layer_input(hidden, emit)
    hidden, x = attention_block(hidden, w, cfg, rope, cache, emit, attn, index_scoring, previous)  # [B, T, d] twice
    ffn = moe(x, w, cfg, emit, dispatch) if cfg.is_moe_layer(w.layer) else dense_mlp(x, w, emit)
    return layer_output(emit, hidden, ffn_output(ffn, cfg, emit))


def layer_input(hidden: np.ndarray, emit: Emitter) -> np.ndarray:
    """The residual stream entering the layer.  [B, T, d]"""
    return emit("hidden_states", hidden)


def attention_block(
    hidden: np.ndarray, w: LayerWeights, cfg: Config, rope: Rope, cache: LayerCache | None, emit: Emitter,
    attn: str = "naive", index_scoring: str = "exact", previous: LayerCache | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Pre-norm attention added to the stream, and the stream's post-attention norm (what the FFN
    reads).  [B, T, d] -> [B, T, d] twice"""
    x = emit("input_layernorm", rms_norm(hidden, w(norm_weight(cfg, w.layer, "input_layernorm")), cfg.rms_norm_eps))
    if is_gated(cfg, w.layer, "input_layernorm"):
        x = gated_input_norm(x, w, emit)
    cache = LayerCache() if cache is None else cache
    mask = None  # [B, T, S]: the indexer's choice, or the one GLM-5 reuses from the layer before
    if cfg.index_reused(w.layer):
        mask = reused_index_mask(previous, cache, x.shape[1], w.layer, emit)
    elif cfg.has_indexer:
        mask = index_mask(x, w, cfg, rope, cache, emit, index_scoring)
    attn_out = mla_attention(x, w, cfg, rope, cache, emit, attn, mask)  # [B, T, d]
    if cfg.has_mup_scalings:
        attn_out = emit("attn_scaled", scaled_branch(attn_out, cfg))
    hidden = emit("attn_residual", hidden + attn_out)

    x = rms_norm(hidden, w(norm_weight(cfg, w.layer, "post_attention_layernorm")), cfg.rms_norm_eps)
    x = emit("post_attention_layernorm", x)
    if is_gated(cfg, w.layer, "post_attention_layernorm"):
        x = gated_post_attention_norm(x, w, emit)
    return hidden, x


def ffn_output(ffn: np.ndarray, cfg: Config, emit: Emitter) -> np.ndarray:
    """The FFN's output, the branch added to the stream (MiniCPM3: scaled).  [B, T, d]"""
    ffn = emit("mlp_output", ffn)
    return emit("mlp_scaled", scaled_branch(ffn, cfg)) if cfg.has_mup_scalings else ffn


def layer_output(emit: Emitter, hidden: np.ndarray, *branches: np.ndarray) -> np.ndarray:
    """The stream plus the branches, added left to right.  [B, T, d]"""
    return emit("output", reduce(np.add, branches, hidden))
