"""The whole model: embedding, rotary tables, the decoder layers, final norm and lm_head.

`Transformer.forward` runs T new tokens at given positions, extending a `KVCache` when one is
passed, so a prefill followed by decode steps equals one uncached pass over the same positions.
"""

from __future__ import annotations

import numpy as np

from ..config import Config
from ..ops import linear, rms_norm, rope_inv_freq, rope_tables, yarn_mscale
from ..trace import Emitter
from ..weights import WeightSource
from .attention import HeadCache, Rope
from .layer import decoder_layer
from .layer_weights import LayerWeights


class KVCache:
    """One HeadCache per layer, and the number of positions already cached."""

    def __init__(self, num_layers: int):
        self.layers = [HeadCache() for _ in range(num_layers)]

    @property
    def length(self) -> int:
        keys = self.layers[0].key_states
        return 0 if keys is None else keys.shape[2]


class Transformer:
    def __init__(self, weights: WeightSource):
        self.weights = weights
        self.config: Config = weights.config
        cfg = self.config
        yarn = cfg.rope_scaling
        self.inv_freq = rope_inv_freq(cfg.qk_rope_head_dim, cfg.rope_theta, yarn)  # [R/2]
        self.rope_mscale = 1.0 if yarn is None else (
            yarn_mscale(yarn.factor, yarn.mscale) / yarn_mscale(yarn.factor, yarn.mscale_all_dim)
        )
        self.softmax_scale = cfg.qk_head_dim**-0.5
        if yarn is not None and yarn.mscale_all_dim:
            self.softmax_scale *= yarn_mscale(yarn.factor, yarn.mscale_all_dim) ** 2

    def rope(self, positions: np.ndarray, emit: Emitter) -> Rope:
        cos, sin = rope_tables(positions, self.inv_freq, self.rope_mscale)  # [T, R/2]
        emit("rope_cos", np.concatenate([cos, cos], axis=-1))  # the reference's cat(freqs, freqs) layout
        emit("rope_sin", np.concatenate([sin, sin], axis=-1))
        return Rope(cos, sin, self.softmax_scale)

    def forward(
        self,
        ids: np.ndarray,
        positions: np.ndarray,
        emit: Emitter,
        cache: KVCache | None = None,
        layers: range | None = None,
        to_logits: bool = True,
    ) -> np.ndarray | None:
        """ids [B, T] at positions [T] -> logits [B, T, vocab].

        `layers` limits which layers emit; the layers before them run silently, so every layer
        sees its true input. With `to_logits` false the pass stops after the last shown layer
        and returns None; otherwise the remaining layers, the final norm and lm_head run too
        (emitted only when every layer is shown).
        """
        cfg = self.config
        shown = range(cfg.num_hidden_layers) if layers is None else layers
        whole = shown == range(cfg.num_hidden_layers)
        top = emit if whole else emit.silent()
        hidden = self.embed(ids)  # [B, T, D]
        top("embed", hidden)
        rope = self.rope(positions, top)
        last = cfg.num_hidden_layers if to_logits else shown.stop
        for i in range(last):
            layer_emit = emit.layer(i) if i in shown else emit.silent()
            hidden = decoder_layer(
                hidden, LayerWeights(self.weights, i), cfg, rope, None if cache is None else cache.layers[i], layer_emit
            )
        if not to_logits:
            return None
        hidden = rms_norm(hidden, self.weights.get("model.norm.weight"), cfg.rms_norm_eps)
        top("norm", hidden)
        logits = linear(hidden, self.weights.get("lm_head.weight"))
        top("logits", logits)
        return logits

    def embed(self, ids: np.ndarray) -> np.ndarray:
        return self.weights.get("model.embed_tokens.weight")[ids]
