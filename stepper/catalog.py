"""The tensor catalogue: what each named tensor is, its named dimensions and where the reference
computes it. The content is data (catalog.json, shipped in the package); this module reads it and
turns a tensor's shape into named dimensions for a given config."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache, cached_property
from importlib import resources
from typing import Any

from .config import Config

RUNTIME = "runtime"


@dataclass(frozen=True)
class Dim:
    symbol: str
    label: str
    size: int
    runtime: bool  # batch, positions, tokens: set by the run, not by the config

    def __str__(self) -> str:
        return f"{self.symbol}={self.size} {self.label}" if self.runtime else f"{self.size} {self.label}"


@dataclass(frozen=True)
class Catalog:
    raw: dict[str, Any]

    @property
    def entries(self) -> list[dict[str, Any]]:
        return self.raw["tensors"]

    def entry(self, key: str) -> dict[str, Any] | None:
        return self._by_name.get(key)

    def names(self) -> list[str]:
        return [e["name"] for e in self.entries]

    def dims(self, key: str, shape: tuple[int, ...], cfg: Config) -> list[Dim]:
        """Named dimensions of a tensor of this shape; unknown tensors get anonymous dims."""
        entry = self.entry(key)
        symbols = entry["dims"] if entry and len(entry["dims"]) == len(shape) else None
        if symbols is None:
            return [Dim(f"dim{i}", "", n, True) for i, n in enumerate(shape)]
        table = self.raw["dims"]
        return [Dim(s, table[s]["label"], n, table[s]["size"] == RUNTIME) for s, n in zip(symbols, shape)]

    def expected_size(self, symbol: str, cfg: Config) -> int | None:
        """The size a config gives a dimension symbol, or None for runtime dims."""
        expr = self.raw["dims"][symbol]["size"]
        return None if expr == RUNTIME else evaluate_size(expr, cfg)

    @cached_property
    def _by_name(self) -> dict[str, dict[str, Any]]:
        return {e["name"]: e for e in self.entries}


def evaluate_size(expr: str, cfg: Config) -> int:
    """'kv_lora_rank + qk_rope_head_dim' or 'num_attention_heads * v_head_dim' for a config."""
    total = 0
    for term in expr.split("+"):
        product = 1
        for factor in term.split("*"):
            factor = factor.strip()
            product *= int(factor) if factor.isdigit() else int(getattr(cfg, factor))
        total += product
    return total


def format_shape(dims: list[Dim]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


@cache
def load() -> Catalog:
    text = resources.files("stepper").joinpath("catalog.json").read_text(encoding="utf-8")
    return Catalog(json.loads(text))
