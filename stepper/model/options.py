"""The run's choices that change how a layer computes, not what it computes: one frozen object,
handed to every layer function beside its input, weights, cache and emitter.

- attention: "naive" up-projects the latent into per-head keys and values (the reference's
  lines); "absorb" folds kv_b into the query and attends over the latents (model.attention).
- index_scoring: DeepSeek-V3.2's indexer scores in float32 ("exact", transformers) or as
  DeepSeek's FP8 kernel does ("fp8", model.index_fp8).
- dispatch: the routed experts run once per chosen expert on its tokens ("grouped") or token
  by token ("per_token", the readable reference; model.moe).
- chunk: a prefill of more positions runs this many at a time (None: all at once).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

Attention = Literal["naive", "absorb"]
IndexScoring = Literal["exact", "fp8"]
Dispatch = Literal["grouped", "per_token"]


@dataclass(frozen=True)
class LayerOptions:
    attention: Attention = "naive"
    index_scoring: IndexScoring = "exact"
    dispatch: Dispatch = "grouped"
    chunk: int | None = None

    def __post_init__(self) -> None:
        for field, kind in (("attention", Attention), ("index_scoring", IndexScoring), ("dispatch", Dispatch)):
            if getattr(self, field) not in get_args(kind):
                raise ValueError(f"{field} must be one of {', '.join(get_args(kind))}, got {getattr(self, field)!r}")
        positive_int = isinstance(self.chunk, int) and not isinstance(self.chunk, bool) and self.chunk >= 1
        if self.chunk is not None and not positive_int:
            raise ValueError(f"chunk must be a positive number of positions or None, got {self.chunk!r}")
