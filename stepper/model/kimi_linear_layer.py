"""Kimi Linear's decoder block: pre-norm attention (KDA in the layers `kda_layers` names, MLA without
RoPE in the others) and pre-norm FFN (the dense SwiGLU before `first_k_dense_replace`, Kimi's MoE
after), each added to the residual stream.

The published checkpoint keeps the MoE under `block_sparse_moe` with its experts' projections as
w1 (gate), w3 (up), w2 (down); the MoE part asks for them by the names every family's MoE uses
(`mlp.gate.weight`, `mlp.experts.E.gate_proj.weight`), and `published` reads those under the
published names. The tensors are emitted under `mlp.*`, as transformers names the module.
"""

from __future__ import annotations

import numpy as np

from stepper.model.cache import LayerCache
from stepper.model.kda import KdaCache, kda_attention
from stepper.model.layer_weights import LayerWeights
from stepper.model.mla_nope import mla_nope_attention
from stepper.model.mlp import dense_mlp
from stepper.model.moe import moe
from stepper.model.ops import rms_norm
from stepper.model.options import LayerOptions
from stepper.seams.trace import Emitter

EXPERT_WEIGHTS = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}  # the MoE part's name -> published


def decoder_layer(hidden: np.ndarray, w: LayerWeights, cache: LayerCache | None, options: LayerOptions,
                  emit: Emitter) -> np.ndarray:
    """[B, T, d] residual stream in -> [B, T, d] out; w carries the config."""
    cfg, w = w.cfg, published(w)
    cache = LayerCache() if cache is None else cache
    hidden = emit("hidden_states", hidden)
    x = emit("input_layernorm", rms_norm(hidden, w("input_layernorm.weight"), cfg.rms_norm_eps))
    if cfg.is_kda_layer(w.layer):
        cache.recurrent = KdaCache() if cache.recurrent is None else cache.recurrent
        attention = kda_attention(x, w, cache.recurrent, options, emit)
    else:
        attention = mla_nope_attention(x, w, cache, options, emit)
    hidden = emit("attn_residual", hidden + attention)
    x = emit("post_attention_layernorm", rms_norm(hidden, w("post_attention_layernorm.weight"), cfg.rms_norm_eps))
    ffn = moe(x, w, options, emit) if cfg.is_moe_layer(w.layer) else dense_mlp(x, w, emit)
    ffn = emit("mlp_output", ffn)
    return emit("output", hidden + ffn)


def on_disk(name: str) -> str:
    """The published name of a layer-relative name the parts ask for: the MoE's `mlp.gate.*`,
    `mlp.experts.E.gate_proj.weight`, `mlp.shared_experts.*` live under `block_sparse_moe`."""
    if not name.startswith(("mlp.gate.", "mlp.experts.", "mlp.shared_experts.")):
        return name
    name = "block_sparse_moe." + name.removeprefix("mlp.")
    if name.startswith("block_sparse_moe.experts."):
        head, projection, tail = name.rsplit(".", 2)
        name = f"{head}.{EXPERT_WEIGHTS[projection]}.{tail}"
    return name


class PublishedLayerWeights(LayerWeights):
    """A layer's weights asked for by the parts' names, read under the published ones (on_disk)."""

    def __call__(self, name: str) -> np.ndarray:
        return super().__call__(on_disk(name))

    def matrix(self, name: str):
        return super().matrix(on_disk(name))


def published(w: LayerWeights) -> PublishedLayerWeights:
    return PublishedLayerWeights(w.source, w.layer, w.scratch, w.rope)
