"""DeepSeek-V4's decoder layer and the model's two ends, on `hc_mult` residual streams.

    streams --hc_pre--> x --attn_norm--> attention --hc_post--> attn_streams
    attn_streams --hc_pre--> x --ffn_norm--> MoE --hc_post--> ffn_streams (the next layer's streams)

The model starts from the embedding copied into the n streams and ends with the head's collapse
of the streams (hc_head), the final norm and lm_head. The attention and the FFN are handed in as
functions of their input (the family binds them to its weights, dims and cache), so this file
composes the residual and the norms whichever attention and FFN a layer has: V4's compressed
attention and hash- or score-routed MoE, or Hy4's MLA and DeepSeek-V3's MoE on independent
hyper-connections (model.hyper_connections). Names are DeepSeek's (attn_norm,
ffn_norm, hc_attn, hc_ffn, ffn), so that none is taken for one of the MLA family's tensors
(hidden_states, input_layernorm, mlp.*), whose shapes and formulas differ.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from stepper.model.clamped_experts import MoeDims, v4_moe
from stepper.model.hyper_connections import HcDims, expand, hc_head, hc_post, hc_pre
from stepper.model.layer_weights import LayerWeights
from stepper.model.ops import rms_norm
from stepper.seams.trace import Emitter

Block = Callable[[np.ndarray], np.ndarray]  # [B, T, d] after attn_norm (ffn_norm) -> [B, T, d]


@dataclass(frozen=True)
class V4LayerDims:
    hc: HcDims
    moe: MoeDims | None  # V4's MoE (None: the family's FFN is its own)
    norm_eps: float  # rms_norm_eps
    sites: tuple[str, str] = ("hc_attn", "hc_ffn")  # the hyper-connections' names (model.hyper_connections.WEIGHTS)


def v4_moe_block(ids: np.ndarray, w: LayerWeights, dims: V4LayerDims, emit: Emitter) -> Block:
    """V4's MoE on ffn_norm's output, routed by the scores or (hash layers) by the token ids [B, T]."""
    return lambda x: v4_moe(x, ids, w, dims.moe, emit)


def v4_decoder_layer(streams: np.ndarray, w: LayerWeights, dims: V4LayerDims, attend: Block, ffn: Block,
                     emit: Emitter) -> np.ndarray:
    """streams [B, T, n, d] -> streams [B, T, n, d]."""
    streams = emit("streams", streams)
    mixing = hc_pre(streams, w, dims.sites[0], dims.hc, emit)
    x = emit("attn_norm", rms_norm(mixing.x, w("input_layernorm.weight"), dims.norm_eps))  # [B, T, d]
    y = emit("attn_output", attend(x))  # [B, T, d]
    streams = emit("attn_streams", hc_post(y, streams, mixing))  # [B, T, n, d]

    mixing = hc_pre(streams, w, dims.sites[1], dims.hc, emit)
    x = emit("ffn_norm", rms_norm(mixing.x, w("post_attention_layernorm.weight"), dims.norm_eps))  # [B, T, d]
    y = emit("ffn_output", ffn(x))  # [B, T, d]
    return emit("ffn_streams", hc_post(y, streams, mixing))  # [B, T, n, d]


def v4_streams(embedding: np.ndarray, n: int, emit: Emitter) -> np.ndarray:
    """The embedding [B, T, d] copied into each of the n residual streams [B, T, n, d]."""
    return emit("embed_streams", expand(embedding, n))


def v4_final(streams: np.ndarray, head: dict[str, np.ndarray], dims: V4LayerDims, emit: Emitter) -> np.ndarray:
    """The streams [B, T, n, d] collapsed by the head's pre weights, then the final norm: [B, T, d]
    (lm_head follows). `head` holds hc_fn, hc_base, hc_scale and norm (the final norm's weight)."""
    collapsed = hc_head(streams, head["hc_fn"], head["hc_base"], head["hc_scale"], dims.hc, emit)  # [B, T, d]
    return emit("final_norm", rms_norm(collapsed, head["norm"], dims.norm_eps))
