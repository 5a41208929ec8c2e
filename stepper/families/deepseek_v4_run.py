"""A run of DeepSeek-V4: the model (synthetic weights of a preset or config.json, or a published
checkpoint) on a prompt, then greedy decode steps with the caches, every named tensor to the sinks.

The attention of each layer is stepper.model.compressed_attention with the layer's `AttentionDims`
(`V4Config.dims`) and its own cache, which keeps the window, the compressors' unfinished windows
and their entries from one step to the next. With decode steps the prefill's names are prefixed
`prefill.` and step k's `decode{k}.`; `shown` limits which layers emit (every layer still runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stepper.errors import StepperError
from stepper.families.deepseek_v4 import V4Model
from stepper.families.deepseek_v4_checkpoint import V4Checkpoint
from stepper.families.deepseek_v4_config import V4Config, is_v4, load_v4_config, v4_preset
from stepper.families.deepseek_v4_synth import V4Synthetic
from stepper.model.compressed_attention import attention
from stepper.model.v4_attention_cache import V4AttentionCache
from stepper.presets import V4_PRESETS
from stepper.seams.trace import Emitter, Sink
from stepper.untrusted.jsonfile import read_json


def is_v4_model(model: str) -> bool:
    """A V4 preset, or a folder or config.json whose model_type is deepseek_v4."""
    if model in V4_PRESETS:
        return True
    path = Path(model)
    config = path / "config.json" if path.is_dir() else path
    if not config.is_file() or config.suffix != ".json":
        return False
    try:
        return is_v4(read_json(config, "a config.json"))
    except StepperError:
        return False  # the family that reads it says what is wrong


def open_v4(model: str, seed: int = 0):
    """The weights of a V4 preset (synthetic), config.json (synthetic) or checkpoint folder."""
    if model in V4_PRESETS:
        return V4Synthetic(v4_preset(model), seed)
    path = Path(model)
    if path.is_file():
        return V4Synthetic(load_v4_config(path), seed)
    if not any(path.glob("*.safetensors")):
        return V4Synthetic(load_v4_config(path / "config.json"), seed)
    return V4Checkpoint(path)


class V4Session:
    """The model with one attention cache per layer: each `step` continues where the last one ended."""

    def __init__(self, weights):
        self.config: V4Config = weights.config
        self.caches = [V4AttentionCache() for _ in range(self.config.num_hidden_layers)]
        self.model = V4Model(weights, self.attend)

    def attend(self, layer: int, w, emit: Emitter):
        dims, cache = self.config.dims(layer), self.caches[layer]
        return lambda x: attention(x, w, dims, cache, emit)

    def step(self, ids: np.ndarray, emit: Emitter, shown: range | None = None) -> np.ndarray:
        """ids [B, T], the next T positions -> logits [B, T, V]."""
        return self.model.forward(ids, emit, shown)


@dataclass(frozen=True)
class V4Result:
    config: V4Config
    prompt: tuple[int, ...]
    generated: tuple[int, ...]


def run_v4(weights, prompt: Sequence[int], decode: int, sinks: Sequence[Sink], shown: range | None = None) -> V4Result:
    """The prompt, then `decode` greedy steps, every named tensor to the sinks."""
    cfg = weights.config
    bad = [i for i in prompt if not 0 <= i < cfg.vocab_size]
    if bad:
        raise StepperError(f"token id {bad[0]} out of range: model {cfg.name} has vocab_size {cfg.vocab_size}")
    session, emit = V4Session(weights), Emitter(sinks)
    ids, generated = np.asarray([prompt], dtype=np.int64), []
    for step in range(decode + 1):
        phase = None if decode == 0 else "prefill" if step == 0 else f"decode{step - 1}"
        logits = session.step(ids, emit.phase(phase), shown)
        if step < decode:
            ids = np.argmax(logits[:, -1:], axis=-1)  # [1, 1], the greedy next token
            generated.append(int(ids[0, 0]))
    return V4Result(cfg, tuple(prompt), tuple(generated))


def seeded_prompt(cfg: V4Config, seed: int, length: int) -> tuple[int, ...]:
    return tuple(int(i) for i in np.random.default_rng(seed).integers(0, cfg.vocab_size, size=length))
