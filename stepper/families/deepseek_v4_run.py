"""A run of DeepSeek-V4: the model on a prompt (its weights: synthetic, deepseek_v4_synth, or a
published checkpoint, deepseek_v4_checkpoint; stepper.session opens either), then greedy decode
steps with the caches, every named tensor to the sinks.

The attention of each layer is stepper.model.compressed_attention with the layer's `AttentionDims`
(`V4Config.dims`) and its own cache, which keeps the window, the compressors' unfinished windows
and their entries from one step to the next. With decode steps the prefill's names are prefixed
`prefill.` and step k's `decode{k}.`; `shown` limits which layers emit (those before it run
silently, and the pass stops after its last layer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from stepper.errors import StepperError
from stepper.families.deepseek_v4 import V4Model
from stepper.families.deepseek_v4_config import V4Config
from stepper.model.compressed_attention import attention
from stepper.model.v4_attention_cache import V4AttentionCache
from stepper.seams.trace import Emitter, Sink


class V4Session:
    """The model with one attention cache per layer: each `step` continues where the last one ended."""

    def __init__(self, weights):
        self.config: V4Config = weights.config
        self.caches = [V4AttentionCache() for _ in range(self.config.num_hidden_layers)]
        self.model = V4Model(weights, self.attend)

    def attend(self, layer: int, w, emit: Emitter):
        dims, cache = self.config.dims(layer), self.caches[layer]
        return lambda x: attention(x, w, dims, cache, emit)

    def step(self, ids: np.ndarray, emit: Emitter, shown: range | None = None) -> np.ndarray | None:
        """ids [B, T], the next T positions -> logits [B, T, V] (None when `shown` stops early)."""
        return self.model.forward(ids, emit, shown)


@dataclass(frozen=True)
class V4Result:
    config: V4Config
    prompt: tuple[int, ...]
    generated: tuple[int, ...]


def run_v4(weights, prompt: Sequence[int], decode: int, sinks: Sequence[Sink], shown: range | None = None,
           seed: int = 0) -> V4Result:
    """The prompt, then `decode` steps, every named tensor to the sinks: each step feeds the greedy
    token, or, when the pass stops before the last layer (no logits), one drawn from the seed."""
    cfg = weights.config
    bad = [i for i in prompt if not 0 <= i < cfg.vocab_size]
    if bad:
        raise StepperError(f"token id {bad[0]} out of range: model {cfg.name} has vocab_size {cfg.vocab_size}")
    session, emit = V4Session(weights), Emitter(sinks)
    ids, generated = np.asarray([prompt], dtype=np.int64), []
    drawn = np.random.default_rng([seed, 2]).integers(0, cfg.vocab_size, decode)  # tokens when there are no logits
    for step in range(decode + 1):
        phase = None if decode == 0 else "prefill" if step == 0 else f"decode{step - 1}"
        logits = session.step(ids, emit.phase(phase), shown)
        if step < decode:
            token = int(drawn[step]) if logits is None else int(np.argmax(logits[0, -1]))  # greedy
            ids = np.array([[token]], dtype=np.int64)  # [1, 1]
            generated.append(token)
    return V4Result(cfg, tuple(prompt), tuple(generated))
