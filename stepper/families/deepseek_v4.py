"""The DeepSeek-V4 family (`deepseek_v4`: V4-Flash, V4-Pro): its config, its weights and the
model composed from parts.

    embed -> n streams -> layers (hc_pre, attn_norm, attention, hc_post,
                                  hc_pre, ffn_norm, MoE, hc_post)
          -> hc_head collapse -> final norm -> lm_head

Parts: stepper/model/hyper_connections.py (mHC), v4_router.py and clamped_experts.py (the MoE),
v4_layer.py (the layer and the two ends); the attention is handed in per layer (`Attention`:
layer, weights, emitter -> a function of the attention's input), so the composition does not
depend on which attention runs. The config lives in deepseek_v4_config.py, the names and shapes
of the tensors in deepseek_v4_weights.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import numpy as np

from stepper.errors import StepperError
from stepper.families.deepseek_v4_config import V4Config
from stepper.families.deepseek_v4_weights import EMBED, HC_HEAD, NORM, weight_shapes
from stepper.model.clamped_experts import MoeDims
from stepper.model.hyper_connections import HcDims
from stepper.model.layer_weights import LayerWeights
from stepper.model.transformer import lm_head
from stepper.model.v4_layer import Attend, V4LayerDims, v4_decoder_layer, v4_final, v4_streams
from stepper.model.v4_router import RouterDims
from stepper.seams.trace import Emitter
from stepper.weights.stored import Stored

Attention = Callable[[int, LayerWeights, Emitter], Attend]  # layer, its weights, its emitter -> attend


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


def checked_tid2eid(table: np.ndarray, experts: int, where: str) -> np.ndarray:
    """The hash table [V, k] as int64, every entry an expert (0 <= e < experts), else one line."""
    if not np.issubdtype(table.dtype, np.integer):
        raise StepperError(f"{where}: expected integer expert ids, found {table.dtype}")
    bad = np.argwhere((table < 0) | (table >= experts))
    if len(bad):
        token, slot = (int(i) for i in bad[0])
        raise StepperError(f"{where}: entry [{token}, {slot}] is {int(table[token, slot])}, expected an expert id "
                           f"in 0..{experts - 1} ({len(bad)} entries out of range)")
    return table.astype(np.int64, copy=False)


class V4Model:
    """The whole V4 model on a weight source, with the attention given per layer."""

    def __init__(self, weights, attention: Attention):
        self.weights = weights
        self.config: V4Config = weights.config
        self.attention = attention

    def embed(self, ids: np.ndarray) -> np.ndarray:
        """ids [B, T] -> [B, T, d], reading only these tokens' rows."""
        return np.asarray(self.weights.get_rows(EMBED, ids), dtype=np.float32)

    def start(self, ids: np.ndarray, emit: Emitter) -> np.ndarray:
        """The embedding of ids [B, T] copied into the hc_mult streams [B, T, n, d]."""
        return v4_streams(self.embed(ids), self.config.hc_mult, emit)

    def layer(self, i: int, streams: np.ndarray, ids: np.ndarray, emit: Emitter) -> np.ndarray:
        """Layer i on the streams [B, T, n, d]."""
        w = LayerWeights(self.weights, i)  # prefix model.layers.{i}.
        emit = emit.layer(i)
        return v4_decoder_layer(streams, ids, w, layer_dims(self.config, i), self.attention(i, w, emit), emit)

    def head(self, streams: np.ndarray, emit: Emitter) -> np.ndarray:
        """The streams collapsed, normed and multiplied by lm_head: [B, T, n, d] -> logits [B, T, V]."""
        get = self.weights.get
        head = {"hc_fn": get(HC_HEAD[0]), "hc_base": get(HC_HEAD[1]), "hc_scale": get(HC_HEAD[2]), "norm": get(NORM)}
        hidden = v4_final(streams, head, layer_dims(self.config, 0), emit)  # [B, T, d]
        return emit("logits", lm_head(hidden, self.weights))

    def forward(self, ids: np.ndarray, emit: Emitter, shown: range | None = None) -> np.ndarray | None:
        """ids [B, T] -> logits [B, T, V]. `shown` limits which layers emit: the layers before them
        run silently, the pass stops after the last one shown, and only a pass over every layer
        emits the embedding and the head and returns logits (else None)."""
        n = self.config.num_hidden_layers
        shown = range(n) if shown is None else shown
        whole = shown == range(n)
        streams = self.start(ids, emit if whole else emit.silent())
        for i in range(shown.stop):
            emit.progress("layers", i, shown.stop)
            streams = self.layer(i, streams, ids, emit if i in shown else emit.silent())
        return self.head(streams, emit) if whole else None
