"""The model around a family's decoder layers, as a run sees it: `Model`.

A run (stepper.session), the layer sequence learned from code (families.derive), the debugger,
the API's patching and `stepper diff` drive any family's model through these few methods; the
family (stepper.families.family.Family) says which model runs and which caches it keeps.

    start(ids, positions, emit)  -> (stream, context)   the embedding, as the layers take it
    context(ids, positions, emit) -> context            what a lone layer needs beside its input
    layer(i, stream, context, cache, emit, attn) -> stream
    head(stream, emit) -> logits [B, T, V]
    forward(ids, positions, emit, cache, layers_shown, to_logits, attn) -> logits or None

What flows between layers (the stream) is the family's: MLA's residual [B, T, d]
(model.transformer.Transformer), DeepSeek-V4's hc_mult streams [B, T, n, d]
(families.deepseek_v4.V4Model). The context is what every layer of a step shares: MLA's rotary
tables, V4's token ids (its hash-routed layers choose experts by them).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from stepper.seams.trace import Emitter


class Model(Protocol):
    config: Any
    weights: Any

    def start(self, ids: np.ndarray, positions: np.ndarray, emit: Emitter) -> tuple[np.ndarray, Any]:
        """ids [B, T] at positions [T] -> the first layer's input stream, and the step's context."""
        ...

    def context(self, ids: np.ndarray, positions: np.ndarray, emit: Emitter) -> Any:
        """The step's context alone, for a layer run on a given stream."""
        ...

    def layer(self, i: int, stream: np.ndarray, context: Any, cache: Any, emit: Emitter,
              attn: str = "naive") -> np.ndarray:
        """Decoder layer i on the stream, its cache (cache.layers[i]) extended in place."""
        ...

    def head(self, stream: np.ndarray, emit: Emitter) -> np.ndarray:
        """The last layer's stream -> logits [B, T, V]."""
        ...

    def lone_input(self, ids: np.ndarray, seed: int, step: int) -> np.ndarray:
        """A lone layer's synthetic input stream for tokens ids [B, T]."""
        ...

    def forward(self, ids: np.ndarray, positions: np.ndarray, emit: Emitter, cache: Any = None,
                layers_shown: range | None = None, to_logits: bool = True, attn: str = "naive") -> np.ndarray | None:
        """ids [B, T] at positions [T] -> logits [B, T, V] (None when the pass stops after the
        last layer shown)."""
        ...
