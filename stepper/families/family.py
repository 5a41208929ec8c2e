"""What a family of models is to stepper: the one record that says how its config.json is read,
which function computes one decoder layer, which catalogue part files explain what that layer
emits, and a miniature of its config that takes the same branches (from which `families.derive`
learns what a layer emits). The names and shapes of its layers' weights on disk are its config
class's to say (a `layer_shapes(layer)` method; weights.names, MLA's names without one).

The model around the layers is the family's too (`model`: stepper.model.stack.Model; MLA's
Transformer unless given), with its caches (`cache`), its weights (`synthetic`, `checkpoint`),
the shape of what flows between its layers (`stream`), what its cache costs a position
(`cache_bytes`), the sizes of its catalogue's runtime dims in a step (`runtime_sizes`), the decode
steps where those are widest (`decode_peaks`) and the run options it has no path for (`refuses`:
option -> why)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.abc import Traversable
from pathlib import Path
from typing import Any

from stepper.model.cache import KVCache, cache_bytes_per_token
from stepper.model.layer import DecoderLayer
from stepper.model.options import LayerOptions
from stepper.model.stack import Model
from stepper.model.transformer import Transformer
from stepper.weights.seeded import SyntheticWeights

ReadConfig = Callable[[dict[str, Any], str], Any]  # (config.json's dict, where it came from) -> a frozen config
# (config, layer) -> a tiny one-layer config whose layer 0 branches as `layer` does
Miniature = Callable[[Any, int], Any]
MakeModel = Callable[[Any, LayerOptions], Model]  # (weights, options) -> the model on them
# (config, layers run, positions cached, attention path, index scoring) -> bytes their caches hold
CacheBytes = Callable[[Any, Iterable[int], int, str, str], int]
# (config, layer or None, T new positions, S attended) -> the sizes of the catalogue's runtime dims in that step
RuntimeSizes = Callable[[Any, int | None, int, int], dict[str, int]]
# (config, layer or None, the first and the last decode step's S) -> the S of the decode steps whose runtime dims
# are wider somewhere than the last step's
DecodePeaks = Callable[[Any, int | None, int, int], tuple[int, ...]]
DEFAULT = LayerOptions()


def renamed(name: str, renames: tuple[tuple[str, str], ...]) -> str:
    """A tensor's name after each (pattern, replacement) of a family's renames of its files' names,
    in order (re.sub): Hy4's and Ling 3's read_name, Ling 3's write_name."""
    for pattern, replacement in renames:
        name = re.sub(pattern, replacement, name)
    return name


def around(model: type[Transformer], layer: DecoderLayer) -> MakeModel:
    """The builder of MLA's Transformer, or a family's subclass of it (what surrounds the layers:
    MiniCPM3's scalings, Youtu's zeroed pad row), around `layer`."""
    def build(weights: Any, options: LayerOptions) -> Transformer:
        built = model(weights, options.dispatch, options.index_scoring, layer)
        built.options = options
        return built
    return build


def mla_cache(cfg: Any) -> KVCache:
    """One LayerCache per layer (model.cache)."""
    return KVCache(cfg.num_hidden_layers)


def residual(cfg: Any) -> tuple[int | None, ...]:
    """What flows between MLA's layers: the residual stream [B, T, d] (None: any size)."""
    return (None, None, cfg.hidden_size)


def mla_cache_bytes(cfg: Any, layers: Iterable[int], positions: int, attn: str, index_scoring: str) -> int:
    """The latent cache of each layer run (and on the naive path its per-head keys and values too)."""
    per_position = cache_bytes_per_token(cfg, "absorb", index_scoring=index_scoring) + (
        cache_bytes_per_token(cfg, "naive") if attn == "naive" else 0)
    return per_position * positions * len(list(layers))


def no_runtime_sizes(cfg: Any, layer: int | None, t: int, s: int) -> dict[str, int]:
    """MLA's runtime dims are the batch and the positions alone (planning.memory sizes them)."""
    return {}


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # config.json's model_type values this family reads
    read_config: ReadConfig
    decoder_layer: DecoderLayer
    parts: tuple[Traversable, ...]  # catalogue part files (JSON): the entries of every tensor the layer emits
    miniature: Miniature
    model: MakeModel | None = None  # None: MLA's Transformer around `decoder_layer`
    cache: Callable[[Any], Any] = mla_cache  # config -> the caches a run keeps, `.layers[i]` layer i's
    synthetic: Callable[[Any, int], Any] = SyntheticWeights  # (config, seed) -> synthetic weights
    checkpoint: Callable[[Path], Any] | None = None  # a checkpoint folder's weights; None: weights.checkpoint's
    stream: Callable[[Any], tuple[int | None, ...]] = residual  # the shape of a layer's input (None: any size)
    cache_bytes: CacheBytes = mla_cache_bytes
    runtime_sizes: RuntimeSizes = no_runtime_sizes  # the sizes of its own runtime dims (planning.memory)
    decode_peaks: DecodePeaks = lambda cfg, layer, first, last: ()  # none: its runtime dims grow with S
    refuses: tuple[tuple[str, str], ...] = ()  # (a RunSpec option it has no path for, why; {option}: spelled)
    no_seeded_cache: Callable[[Any, int], str] = lambda cfg, layer: ""  # why layer's cache cannot be seeded (cache_len)
    chunk_multiple: int = 1  # a chunked prefill's chunks are whole multiples of this many positions
    published_name: Callable[[str], str] = lambda name: name  # a parameter's name in the family's own checkpoints

    def build(self, weights: Any, options: LayerOptions = DEFAULT) -> Model:
        """The family's model on these weights."""
        return (self.model or around(Transformer, self.decoder_layer))(weights, options)
