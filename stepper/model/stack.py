"""The model around a family's decoder layers, as a run sees it: `Model`.

A run (stepper.session), the layer sequence learned from code (families.derive), the debugger,
the API's patching and `stepper diff` drive any family's model through these few methods; the
family (stepper.families.family.Family) says which model runs and which caches it keeps.

    start(ids, positions, emit)  -> (stream, context)   the embedding, as the layers take it
    context(ids, positions, emit) -> context            what a lone layer needs beside its input
    layer(i, stream, context, cache, emit, attn) -> stream
    head(stream, emit) -> logits [B, T, V]
    forward(ids, positions, emit, cache, layers_shown, to_logits, attn) -> logits or None
    lone_input(ids, seed, step, first) -> stream           a lone layer's input, any span of it

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

    def lone_input(self, ids: np.ndarray, seed: int, step: int, first: int = 0) -> np.ndarray:
        """A lone layer's synthetic input stream for tokens ids [B, T], the step's positions
        first..first+T-1 (a chunk of a prefill's: the same rows as the whole prompt's)."""
        ...

    def forward(self, ids: np.ndarray, positions: np.ndarray, emit: Emitter, cache: Any = None,
                layers_shown: range | None = None, to_logits: bool = True, attn: str = "naive") -> np.ndarray | None:
        """ids [B, T] at positions [T] -> logits [B, T, V] (None when the pass stops after the
        last layer shown)."""
        ...


SEEDED_ROWS = 1024  # a lone layer's seeded input is drawn this many positions at a time


def seeded_input(seed: int, step: int, first: int, length: int, row: tuple[int, ...]) -> np.ndarray:
    """Standard normal rows, one of shape `row` per position ([B, T, d], V4's [B, T, n, d]; B = 1),
    for the step's positions first..first+length-1 of a lone layer without an embedding table:
    each block of SEEDED_ROWS positions is drawn from its own stream (the first from the step's),
    so a chunk's rows are the whole prompt's, made alone."""
    blocks = range(first // SEEDED_ROWS, -(-(first + length) // SEEDED_ROWS))
    parts = []
    for k in blocks:
        rng = np.random.default_rng([seed, 3, step, k] if k else [seed, 3, step])
        drawn = min(SEEDED_ROWS, first + length - k * SEEDED_ROWS)  # a stream's rows are a prefix of its block
        parts.append(rng.standard_normal((1, drawn, *row), dtype=np.float32))
    skip = first - blocks.start * SEEDED_ROWS
    return np.concatenate(parts, axis=1)[:, skip:skip + length]
