"""The interpreter's driver: resolve what the user asked for, then run prefill and decode steps.

A run is described by a `RunSpec` (model, layers, tokens, positions, decode steps, seed) and
reports every named tensor to the given sinks. With decode steps, the prefill's names are
prefixed `prefill.` and step k's `decode{k}.`; each step feeds the greedy (argmax) token of the
previous one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import Config, load_config
from .errors import StepperError
from .model import KVCache, Transformer
from .presets import PRESETS, preset
from .trace import Emitter, Sink
from .weights import SyntheticWeights, WeightSource


@dataclass(frozen=True)
class RunSpec:
    model: str = "tiny"
    layers: tuple[int, int] | None = None  # [first, stop); None = the whole model
    ids: tuple[int, ...] | None = None  # None = `prompt_len` ids drawn from the seed
    prompt_len: int = 7
    start_pos: int = 0
    decode: int = 0
    seed: int = 0


@dataclass(frozen=True)
class RunResult:
    config: Config
    prompt: tuple[int, ...]
    generated: tuple[int, ...]


def load_model(model: str, seed: int) -> WeightSource:
    """A preset name, or a config.json (or a directory holding one), with synthetic weights."""
    if model in PRESETS:
        return SyntheticWeights(preset(model), seed)
    path = Path(model)
    if path.is_dir():
        if any(path.glob("*.safetensors")):
            raise StepperError(
                f"{path}: reading checkpoint weights is not supported yet; "
                "point --model at its config.json to run that shape with synthetic weights"
            )
        path = path / "config.json"
    elif not path.exists():
        raise StepperError(f"unknown model '{model}': expected one of {', '.join(PRESETS)} or a config.json path")
    return SyntheticWeights(load_config(path), seed)


def prompt_ids(spec: RunSpec, cfg: Config) -> tuple[int, ...]:
    if spec.ids is None:
        if spec.prompt_len < 1:
            raise StepperError(f"--prompt-len must be at least 1, got {spec.prompt_len}")
        rng = np.random.default_rng([spec.seed, 1])
        return tuple(int(i) for i in rng.integers(0, cfg.vocab_size, spec.prompt_len))
    if not spec.ids:
        raise StepperError("--ids is empty: give at least one token id")
    bad = [i for i in spec.ids if not 0 <= i < cfg.vocab_size]
    if bad:
        raise StepperError(f"token id {bad[0]} out of range: model {cfg.name} has vocab_size {cfg.vocab_size}")
    return spec.ids


def layer_range(spec: RunSpec, cfg: Config) -> range:
    n = cfg.num_hidden_layers
    if spec.layers is None:
        return range(n)
    first, stop = spec.layers
    if not (0 <= first < stop <= n):
        last = f"{first}" if stop == first + 1 else f"{first}:{stop}"
        raise StepperError(f"layer {last} out of range: model {cfg.name} has layers 0..{n - 1}")
    return range(first, stop)


def check_positions(spec: RunSpec, cfg: Config, prompt_len: int) -> None:
    if spec.start_pos < 0:
        raise StepperError(f"--start-pos must be >= 0, got {spec.start_pos}")
    if spec.decode < 0:
        raise StepperError(f"--decode must be >= 0, got {spec.decode}")
    end = spec.start_pos + prompt_len + spec.decode
    if end > cfg.max_position_embeddings:
        raise StepperError(
            f"positions up to {end - 1} exceed max_position_embeddings ({cfg.max_position_embeddings}) of model {cfg.name}"
        )


def run(spec: RunSpec, sinks: Iterable[Sink], weights: WeightSource | None = None) -> RunResult:
    """Run the prefill and `spec.decode` greedy decode steps, emitting to `sinks`."""
    weights = weights or load_model(spec.model, spec.seed)
    cfg = weights.config
    layers = layer_range(spec, cfg)
    prompt = prompt_ids(spec, cfg)
    check_positions(spec, cfg, len(prompt))

    model = Transformer(weights)
    emit = Emitter(sinks)
    cache = KVCache(cfg.num_hidden_layers)
    phased = spec.decode > 0
    ids = np.array([prompt], dtype=np.int64)  # [B=1, T]
    positions = spec.start_pos + np.arange(len(prompt))
    generated: list[int] = []
    for step in range(spec.decode + 1):
        phase = None if not phased else ("prefill" if step == 0 else f"decode{step - 1}")
        needs_logits = step < spec.decode or layers == range(cfg.num_hidden_layers)
        logits = model.forward(ids, positions, emit.phase(phase), cache, layers, to_logits=needs_logits)
        if step < spec.decode:
            token = int(np.argmax(logits[0, -1]))
            generated.append(token)
            ids = np.array([[token]], dtype=np.int64)
            positions = positions[-1:] + 1
    return RunResult(cfg, prompt, tuple(generated))
