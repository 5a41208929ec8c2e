"""The DeepSeek-V4 family (`deepseek_v4`: V4-Flash, V4-Pro): its config, its weights and the
model composed from parts.

    embed -> n streams -> layers (hc_pre, attn_norm, attention, hc_post,
                                  hc_pre, ffn_norm, MoE, hc_post)
          -> hc_head collapse -> final norm -> lm_head

Parts: stepper/model/hyper_connections.py (mHC), v4_router.py and clamped_experts.py (the MoE),
v4_layer.py (the layer and the two ends); the attention is handed in per layer (`Attention`: layer, weights,
cache, dims, emitter -> a function of the attention's input; model.compressed_attention unless
given), so the composition does not depend on which attention runs. The config lives in
deepseek_v4_config.py, the names and shapes of the tensors in deepseek_v4_weights.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from stepper.errors import StepperError
from stepper.families.deepseek_v4_config import V4Config
from stepper.families.deepseek_v4_weights import EMBED, head_weights, weight_shapes
from stepper.model.clamped_experts import MoeDims
from stepper.model.compressed_attention import AttentionDims, attention
from stepper.model.hyper_connections import HcDims, expand, hc_pre
from stepper.model.layer_weights import LayerWeights
from stepper.model.ops import rms_norm
from stepper.model.options import LayerOptions
from stepper.model.stack import seeded_input
from stepper.model.transformer import lm_head
from stepper.model.v4_attention_cache import V4AttentionCache
from stepper.model.v4_layer import Block, V4LayerDims, v4_decoder_layer, v4_final, v4_moe_block, v4_streams
from stepper.model.v4_router import RouterDims
from stepper.model.v4_synthetic_cache import seeded_cache
from stepper.seams.trace import Emitter
from stepper.weights.published_audit import checked_tid2eid
from stepper.weights.stored import Stored

DEFAULT = LayerOptions()
# layer, its weights, its cache (None: a fresh one), its dims, its emitter -> attend
Attention = Callable[[int, LayerWeights, V4AttentionCache | None, AttentionDims, Emitter], Block]


def layer_dims(cfg: V4Config, layer: int) -> V4LayerDims:
    """What the layer's residual and MoE need of the config."""
    hc = HcDims(cfg.hc_mult, cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.rms_norm_eps)
    router = RouterDims(cfg.num_experts_per_tok, cfg.routed_scaling_factor, cfg.is_hash_layer(layer))
    moe = MoeDims(router, cfg.swiglu_limit, cfg.n_routed_experts, cfg.n_shared_experts > 0)
    return V4LayerDims(hc, moe, cfg.rms_norm_eps)


class V4Arrays:
    """V4 weights already in memory by the model's names (float32, tid2eid int64), each checked
    against the config's shape when read; a tid2eid entry past the experts is refused."""

    def __init__(self, config: V4Config, arrays: Mapping[str, np.ndarray], source: str = "weights"):
        self.config = config
        self.arrays = arrays
        self.source = source
        self.shapes = weight_shapes(config)

    def get(self, name: str) -> np.ndarray:
        if name not in self.arrays:
            raise StepperError(f"{self.source}: tensor '{name}' is missing")
        array = np.asarray(self.arrays[name])
        if array.shape != self.shapes.get(name):
            raise StepperError(f"{self.source}: tensor '{name}' has shape {list(array.shape)}, "
                               f"expected {list(self.shapes.get(name, ()))}")
        if name.endswith("tid2eid"):
            return checked_tid2eid(array, self.config.n_routed_experts, f"{self.source}: tensor '{name}'")
        return array.astype(np.float32, copy=False)

    def get_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        return self.get(name)[rows]

    def matrix(self, name: str) -> np.ndarray:
        return self.get(name)

    def row_bands(self, name: str, rows: int) -> Iterator[Stored]:
        return Stored("F32", self.get(name)).row_bands(rows)

    def has(self, name: str) -> bool:
        return name in self.arrays


@dataclass(frozen=True)
class V4Step:
    """What every layer of a step shares: the tokens' ids [B, T] (a hash-routed layer takes its
    experts from tid2eid[id]). Positions are the caches' own (each attention counts what it saw)."""

    ids: np.ndarray


class V4Caches:
    """One attention cache per layer (model.v4_attention_cache): the window, the compressors'
    unfinished windows and entries, the indexer's keys."""

    def __init__(self, config: V4Config):
        self.layers = [V4AttentionCache() for _ in range(config.num_hidden_layers)]

    def length(self, layer: int = 0) -> int:
        return self.layers[layer].seen


def compressed(layer: int, w: LayerWeights, cache: V4AttentionCache | None, dims: AttentionDims,
               emit: Emitter) -> Block:
    """The layer's own attention (model.compressed_attention) on its cache."""
    return lambda x: attention(x, w, dims, cache, emit)


def lone_streams(model, ids: np.ndarray, seed: int, step: int, first: int = 0) -> np.ndarray:
    """A lone layer's synthetic streams [B, T, n, d] at the step's positions first..: the tokens'
    embeddings in every stream, or seeded vectors without an embedding table (V4's model, Hy4's)."""
    cfg = model.config
    if model.weights.has(EMBED):
        return expand(model.embed(ids), cfg.hc_mult)
    return seeded_input(seed, step, first, ids.shape[1], (cfg.hc_mult, cfg.hidden_size))


class V4Model:
    """The whole V4 model on a weight source (stepper.model.stack.Model): the hc_mult streams
    [B, T, n, d] flow between the layers. `attention` (default: the compressed attention of each
    layer on its cache) may be given, e.g. a reference's, to check the rest of the layer alone.
    The new tokens' positions are the caches': a step's positions begin where its caches end."""

    def __init__(self, weights, options: LayerOptions = DEFAULT, attention: Attention = compressed):
        self.weights = weights
        self.config: V4Config = weights.config
        self.options = options  # one attention path, no dispatch choice: kept for the protocol
        self.attention = attention

    def embed(self, ids: np.ndarray) -> np.ndarray:
        """ids [B, T] -> [B, T, d], reading only these tokens' rows."""
        return np.asarray(self.weights.get_rows(EMBED, ids), dtype=np.float32)

    def start(self, ids: np.ndarray, positions: np.ndarray, emit: Emitter) -> tuple[np.ndarray, V4Step]:
        """The embedding of ids [B, T] copied into the hc_mult streams [B, T, n, d]."""
        return v4_streams(self.embed(ids), self.config.hc_mult, emit), V4Step(ids)

    def context(self, ids: np.ndarray, positions: np.ndarray, emit: Emitter) -> V4Step:
        return V4Step(ids)

    def lone_input(self, ids: np.ndarray, seed: int, step: int, first: int = 0) -> np.ndarray:
        """A lone layer's synthetic streams [B, T, n, d] (lone_streams)."""
        return lone_streams(self, ids, seed, step, first)

    def layer(self, i: int, streams: np.ndarray, context: V4Step, cache: V4Caches | None, emit: Emitter,
              attn: str = "naive") -> np.ndarray:
        """Layer i on the streams [B, T, n, d] (attn: V4 has one attention path)."""
        w = LayerWeights(self.weights, i)  # prefix model.layers.{i}.
        emit = emit.layer(i)
        attend = self.attention(i, w, None if cache is None else cache.layers[i], self.config.dims(i), emit)
        dims = layer_dims(self.config, i)
        return v4_decoder_layer(streams, w, dims, attend, v4_moe_block(context.ids, w, dims, emit), emit)

    def seed_cache(self, cache: V4Caches, layer: int, sample: np.ndarray, positions: np.ndarray, seed: int,
                   per_head: bool, emit: Emitter) -> None:
        """Layer `layer`'s cache as if it had seen positions 0..N-1 (model.v4_synthetic_cache), with
        the statistics of its attention's input for the sample streams [1, t, n, d]."""
        w = LayerWeights(self.weights, layer)
        mixing = hc_pre(sample, w, "hc_attn", layer_dims(self.config, layer).hc, Emitter())
        x = rms_norm(mixing.x, w("input_layernorm.weight"), self.config.rms_norm_eps)  # [1, t, d]
        cache.layers[layer] = seeded_cache(x, w, self.config.dims(layer), len(positions), seed)

    def head(self, streams: np.ndarray, emit: Emitter) -> np.ndarray:
        """The streams collapsed, normed and multiplied by lm_head: [B, T, n, d] -> logits [B, T, V]."""
        hidden = v4_final(streams, head_weights(self.weights.get), layer_dims(self.config, 0), emit)  # [B, T, d]
        return emit("logits", lm_head(hidden, self.weights))

    def forward(self, ids: np.ndarray, positions: np.ndarray, emit: Emitter, cache: V4Caches | None = None,
                layers_shown: range | None = None, to_logits: bool = True, attn: str = "naive") -> np.ndarray | None:
        """ids [B, T] -> logits [B, T, V]. `layers_shown` limits which layers emit: the layers
        before them run silently, and the embedding and the head emit only when every layer is
        shown; without `to_logits` the pass stops after the last layer shown (-> None)."""
        n = self.config.num_hidden_layers
        layers = range(n) if layers_shown is None else layers_shown
        whole = emit if layers == range(n) else emit.silent()
        last = n if to_logits else layers.stop
        streams, context = self.start(ids, positions, whole)
        for i in range(last):
            emit.progress("layers", i, last)
            streams = self.layer(i, streams, context, cache, emit if i in layers else emit.silent(), attn)
        return self.head(streams, whole) if to_logits else None
