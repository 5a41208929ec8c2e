"""What a family of models is to stepper: the one record that says how its config.json is read,
which function computes one decoder layer, which catalogue part files explain what that layer
emits, and a miniature of its config that takes the same branches (from which `families.derive`
learns what a layer emits). The names and shapes of its layers' weights on disk are its config
class's to say (a `layer_shapes(layer)` method; weights.names, MLA's names without one)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib.abc import Traversable
from typing import Any

from stepper.model.layer import DecoderLayer

ReadConfig = Callable[[dict[str, Any], str], Any]  # (config.json's dict, where it came from) -> a frozen config
# (config, layer) -> a tiny one-layer config whose layer 0 branches as `layer` does
Miniature = Callable[[Any, int], Any]


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # config.json's model_type values this family reads
    read_config: ReadConfig
    decoder_layer: DecoderLayer
    parts: tuple[Traversable, ...]  # catalogue part files (JSON): the entries of every tensor the layer emits
    miniature: Miniature
