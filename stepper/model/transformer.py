"""The whole model: embedding, rotary tables, the decoder layers, final norm and lm_head.

The pieces are separate methods so a session can run the whole model (`forward`) or one layer
alone on a given residual stream (`layer`). A `KVCache` passed along is extended in place, so a
prefill followed by decode steps equals one uncached pass over the same positions.

Weights are asked for when a layer runs and dropped when it returns, and lm_head multiplies one
block of vocabulary rows at a time, so a pass over all of a full-size model's layers holds about
one layer's largest weight at a time.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from stepper.config import Config
from stepper.kernels.linear import linear_in_row_blocks
from stepper.model import synthetic_cache
from stepper.model.cache import KVCache
from stepper.model.layer import DecoderLayer, decoder_layer
from stepper.model.layer_weights import LayerWeights
from stepper.model.ops import rms_norm
from stepper.model.options import Attention, Dispatch, IndexScoring, LayerOptions
from stepper.model.query_scale import llama4_query_scale
from stepper.model.rope import Rope, longrope_inv_freq, rope_inv_freq, rope_tables, yarn_cos_sin_scale, yarn_mscale
from stepper.model.stack import seeded_input
from stepper.seams.trace import Emitter
from stepper.weights.names import EMBED, ROTARY_ALPHA, head_weight
from stepper.weights.source import WeightSource

HEAD_ROWS = 4096  # vocabulary rows multiplied at a time: for Kimi K2, 4096 x 7168 float32 is 117 MB


def lm_head(hidden: np.ndarray, weights: WeightSource, rows: int = HEAD_ROWS) -> np.ndarray:
    """linear(hidden, lm_head): [B, T, d] -> logits [B, T, V], lm_head read a band of `rows`
    vocabulary rows at a time, so all of it (for Kimi K2 163840 x 7168, 4.7 GB in float32) never
    exists at once. With tied embeddings (Youtu, MiniCPM3) lm_head is the embedding matrix."""
    name = head_weight(weights.config)
    # the next `rows` rows of lm_head [V, d], one after another
    bands = (band.matrix(name) for band in weights.row_bands(name, rows))
    return linear_in_row_blocks(hidden, bands, weights.config.vocab_size)


class Transformer:
    def __init__(self, weights: WeightSource, dispatch: Dispatch = "grouped", index_scoring: IndexScoring = "exact",
                 layer: DecoderLayer = decoder_layer):
        self.weights = weights
        # how MoE layers run their routed experts (model.moe) and DeepSeek-V3.2's indexer scores (model.indexer)
        self.options = LayerOptions(dispatch=dispatch, index_scoring=index_scoring)
        self.config: Config = weights.config
        self.decoder_layer = layer  # the config's family's (stepper.families), MLA's unless given
        # float32 memory the layers decode weights into, and what it holds (LayerWeights.float32)
        self.scratch: dict = {}
        cfg = self.config
        yarn = cfg.rope_scaling
        self.inv_freq = rope_inv_freq(cfg.qk_rope_head_dim, cfg.rope_theta, yarn)  # [rope/2]
        self.rope_mscale = 1.0 if yarn is None else yarn_cos_sin_scale(yarn)
        self.softmax_scale = cfg.qk_head_dim**-0.5
        if yarn is not None and yarn.mscale_all_dim:
            self.softmax_scale *= yarn_mscale(yarn.factor, yarn.mscale_all_dim) ** 2
        if cfg.longrope is not None:  # MiniCPM3: frequencies chosen per call (longrope_inv_freq)
            self.rope_mscale = cfg.longrope.attention_factor

    @property
    def dispatch(self) -> str:
        return self.options.dispatch

    @property
    def index_scoring(self) -> str:
        return self.options.index_scoring

    def embed(self, ids: np.ndarray) -> np.ndarray:
        """ids [B, T] -> [B, T, d], reading only the rows of these tokens."""
        return np.asarray(self.weights.get_rows(EMBED, ids), dtype=np.float32)  # [B, T, d]

    def rope(self, positions: np.ndarray, emit: Emitter) -> Rope:
        """The rotary tables of positions [T]. They are shown in the reference's cat(freqs, freqs)
        layout [T, rope]; the model goes on with the first half of what is shown, [T, rope/2].
        A config whose class says `rotary = False` (Kimi Linear: no layer rotates) has none."""
        cfg = self.config
        if not cfg.rotary:
            none = np.zeros((len(positions), 0), np.float32)  # [T, 0]
            return Rope(none, none, self.softmax_scale, rotates=False)
        inv_freq = self.inv_freq if cfg.longrope is None else longrope_inv_freq(
            cfg.qk_rope_head_dim, cfg.rope_theta, cfg.longrope, positions)  # [rope/2]
        if cfg.lerope:  # Mistral Large 4: each frequency times exp of its learned alpha
            inv_freq = inv_freq * np.exp(self.weights.get(ROTARY_ALPHA).astype(np.float64)).astype(np.float32)
        cos, sin = rope_tables(positions, inv_freq, self.rope_mscale)  # [T, rope/2]
        half = cos.shape[-1]
        cos = emit("rope_cos", np.concatenate([cos, cos], axis=-1))[:, :half]
        sin = emit("rope_sin", np.concatenate([sin, sin], axis=-1))[:, :half]
        scale = cfg.query_scale  # Mistral 4: queries scaled by position (model.query_scale)
        logs = np.log(positions.astype(np.float32) + np.float32(1)) if cfg.learned_query_scale else None  # [T]
        return Rope(cos, sin, self.softmax_scale, None if scale is None else llama4_query_scale(positions, scale),
                    cfg.rope_interleave, log_positions=logs)

    def context(self, ids: np.ndarray, positions: np.ndarray, emit: Emitter) -> Rope:
        """What every layer of a step shares: the rotary tables of positions [T] (ids unused)."""
        return self.rope(positions, emit)

    def lone_input(self, ids: np.ndarray, seed: int, step: int, first: int = 0) -> np.ndarray:
        """A lone layer's synthetic input [B, T, d] at the step's positions first..: the tokens'
        embeddings as the first layer takes them (MiniCPM3's times scale_emb; nothing emitted), or
        seeded vectors without an embedding table."""
        if self.weights.has(EMBED):
            return self.embedded(ids, Emitter())
        return seeded_input(seed, step, first, ids.shape[1], (self.config.hidden_size,))

    def seed_cache(self, cache: KVCache, layer: int, sample: np.ndarray, positions: np.ndarray, seed: int,
                   per_head: bool, emit: Emitter) -> None:
        """Layer `layer`'s cache as if it had seen `positions` [N] (model.synthetic_cache), with the
        statistics of its latents for the sample input [1, T, d]; per_head: also the naive path's
        per-head keys and values."""
        rope = self.rope(positions, Emitter())
        w = LayerWeights(self.weights, layer, self.scratch)
        synthetic_cache.fill(cache.layers[layer], w, self.config, sample, rope, seed, per_head,
                             self.index_scoring, emit)

    def layer(
        self, i: int, hidden: np.ndarray, rope: Rope, cache: KVCache | None, emit: Emitter, attn: Attention = "naive"
    ) -> np.ndarray:
        """Decoder layer i (its family's decoder layer) on the residual stream [B, T, d], with attn
        "naive" or "absorb"."""
        layer_cache = None if cache is None else cache.layers[i]
        w = LayerWeights(self.weights, i, self.scratch, rope)
        if layer_cache is not None:  # the layer before's cache: GLM-5's shared layer attends where it chose
            layer_cache.previous = cache.layers[i - 1] if i > 0 else None
            # the cache of the layer whose latent it reads (Mistral Large 4), extended by it this step
            layer_cache.kv_source = cache.layers[self.config.kv_source(i)] if self.config.kv_shared(i) else None
        options = dataclasses.replace(self.options, attention=attn)
        return self.decoder_layer(hidden, w, layer_cache, options, emit.layer(i))

    def start(self, ids: np.ndarray, positions: np.ndarray, emit: Emitter) -> tuple[np.ndarray, Rope]:
        """The first layer's input [B, T, d] for ids [B, T] and the rotary tables of positions [T]."""
        return self.embedded(ids, emit), self.rope(positions, emit)

    def embedded(self, ids: np.ndarray, emit: Emitter) -> np.ndarray:
        """The embedding of ids [B, T] as the first layer takes it: [B, T, d] (a family's model
        may scale it: families.minicpm3)."""
        return emit("embed", self.embed(ids))

    def head(self, hidden: np.ndarray, emit: Emitter) -> np.ndarray:
        """Final norm and lm_head (Mistral Large 4: then capped, c tanh(logits / c)): [B, T, d] -> logits [B, T, V]."""
        logits = self.logits(self.final_norm(hidden, emit))
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = emit("logits_uncapped", logits)
            logits = np.float32(cap) * np.tanh(logits / np.float32(cap))
        return emit("logits", logits)

    def final_norm(self, hidden: np.ndarray, emit: Emitter) -> np.ndarray:
        """The last layer's stream, normalised as lm_head takes it: [B, T, d] -> [B, T, d]."""
        return emit("norm", rms_norm(hidden, self.weights.get("model.norm.weight"), self.config.rms_norm_eps))

    def logits(self, normed: np.ndarray) -> np.ndarray:
        """lm_head on the final norm: [B, T, d] -> [B, T, V]."""
        return lm_head(normed, self.weights)

    def forward(
        self,
        ids: np.ndarray,
        positions: np.ndarray,
        emit: Emitter,
        cache: KVCache | None = None,
        layers_shown: range | None = None,
        to_logits: bool = True,
        attn: Attention = "naive",
    ) -> np.ndarray | None:
        """ids [B, T] at positions [T] -> logits [B, T, V].

        `layers_shown` limits which layers emit; the layers before them run silently, so every layer
        sees its true input, and the embedding, rope tables, norm and logits are emitted only
        when every layer is shown. Without `to_logits` the pass stops after the last shown
        layer and returns None.
        """
        n = self.config.num_hidden_layers
        layers = range(n) if layers_shown is None else layers_shown
        whole = emit if layers == range(n) else emit.silent()  # what the model emits outside the layers
        hidden, rope = self.start(ids, positions, whole)
        for i in range(n if to_logits else layers.stop):
            emit.progress("layers", i, n if to_logits else layers.stop)
            hidden = self.layer(i, hidden, rope, cache, emit if i in layers else emit.silent(), attn)
        return self.head(hidden, whole) if to_logits else None
