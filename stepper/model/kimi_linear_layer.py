"""The hybrid decoder block of Kimi Linear and Ling 3 (stepper.families.bailing_hybrid): pre-norm
attention (KDA in the layers the config calls delta-attention layers, MLA in the others: without
RoPE in Kimi Linear, whose model makes no rotary tables, with it in Ling 3) and pre-norm FFN (the
dense SwiGLU in the config's dense layers, the MoE in the others), each added to the stream.

Kimi Linear's published checkpoint keeps the MoE under `block_sparse_moe` with its experts'
projections as w1 (gate), w3 (up), w2 (down); the MoE part asks for them by the names every
family's MoE uses (`mlp.gate.weight`, `mlp.experts.E.gate_proj.weight`), and `published` reads
those under the published names. The tensors are emitted under `mlp.*`, as transformers names the module.
"""

from __future__ import annotations

import numpy as np

from stepper.model.attention import mla_attention
from stepper.model.cache import KdaCache, LayerCache
from stepper.model.kda import kda_attention
from stepper.model.layer import pre_norm_block
from stepper.model.layer_weights import LayerWeights
from stepper.model.mlp import dense_mlp
from stepper.model.moe import moe
from stepper.model.options import LayerOptions
from stepper.seams.trace import Emitter

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")  # an expert's, as the MoE part asks for them


def decoder_layer(hidden: np.ndarray, w: LayerWeights, cache: LayerCache | None, options: LayerOptions,
                  emit: Emitter) -> np.ndarray:
    """[B, T, d] residual stream in -> [B, T, d] out; w carries the config. Kimi Linear's layer:
    the hybrid layer on its weights under the published names."""
    return hybrid_layer(hidden, published(w), cache, options, emit)


def hybrid_layer(hidden: np.ndarray, w: LayerWeights, cache: LayerCache | None, options: LayerOptions,
                 emit: Emitter) -> np.ndarray:
    """KDA or MLA (as the config says of the layer), then the dense MLP or the MoE; weights asked
    for by the parts' names (Ling 3's layer as it is: stepper.families.bailing_hybrid).
    [B, T, d] -> [B, T, d]"""
    cfg = w.cfg
    cache = LayerCache() if cache is None else cache

    def attention(x: np.ndarray) -> np.ndarray:  # [B, T, d] -> [B, T, d]
        if not cfg.is_kda_layer(w.layer):
            return mla_attention(x, w, cache, options, emit)  # Kimi Linear: no RoPE, w.rope rotates nothing
        cache.recurrent = KdaCache() if cache.recurrent is None else cache.recurrent
        return kda_attention(x, w, cache.recurrent, options, emit)

    def ffn(x: np.ndarray) -> np.ndarray:  # [B, T, d] -> [B, T, d]
        return moe(x, w, options, emit) if cfg.is_moe_layer(w.layer) else dense_mlp(x, w, emit)

    return pre_norm_block(hidden, w, emit, attention, ffn)


def on_disk(name: str, cfg) -> str:
    """The published name of a layer-relative name the parts ask for: the MoE's `mlp.gate.*`,
    `mlp.experts.E.gate_proj.weight`, `mlp.shared_experts.*` live under the config's moe_prefix
    (`block_sparse_moe.`, each expert's projections named its expert_names: w1, w3, w2), the dense
    MLP's `mlp.*_proj` under its dense_mlp (`block_sparse_moe.` as transformers saves it)."""
    if not name.startswith(("mlp.gate.", "mlp.experts.", "mlp.shared_experts.")):
        return cfg.dense_mlp + name.removeprefix("mlp.") if name.startswith("mlp.") else name
    name = cfg.moe_prefix + name.removeprefix("mlp.")
    if name.startswith(cfg.moe_prefix + "experts."):
        head, projection, tail = name.rsplit(".", 2)
        name = f"{head}.{dict(zip(PROJECTIONS, cfg.expert_names))[projection]}.{tail}"
    return name


class PublishedLayerWeights(LayerWeights):
    """A layer's weights asked for by the parts' names, read under the published ones (on_disk)."""

    def __call__(self, name: str) -> np.ndarray:
        return super().__call__(on_disk(name, self.cfg))

    def matrix(self, name: str):
        return super().matrix(on_disk(name, self.cfg))


def published(w: LayerWeights) -> PublishedLayerWeights:
    return PublishedLayerWeights(w.source, w.layer, w.scratch, w.rope)
