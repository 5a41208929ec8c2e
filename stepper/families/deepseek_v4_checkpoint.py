"""A published DeepSeek-V4 checkpoint read by the model's names.

The model asks for transformers' module names (`model.layers.3.self_attn.q_a_proj.weight`); each is
mapped to DeepSeek's stored name (deepseek_v4_weights.published_name: `layers.3.attn.wq_a.weight`)
and read by stepper.weights.published.PublishedCheckpoint, which pairs FP8 and FP4 weights with
their E8M0 scales, finds the 5+5-digit shards and keeps the `mtp.*` block apart as unused. The
config is V4's own (config.json read field by field). A remote checkpoint (hf://ORG/NAME,
https://HOST/PATH/) is read from its headers, and fetches only what a run checks
(stepper.weights.remote_published). A hash layer's `tid2eid` is checked when read:
an entry past the experts is one line naming the file, the tensor and the experts there are.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from stepper.errors import StepperError
from stepper.families.deepseek_v4_config import load_v4_config
from stepper.families.deepseek_v4_weights import published_name
from stepper.weights.published_audit import checked_tid2eid
from stepper.weights.remote_published import open_published
from stepper.weights.stored import Stored


class V4Checkpoint:
    def __init__(self, where: str | Path):
        self.published = open_published(where, load_v4_config)
        self.config = self.published.config
        self.path = self.published.path  # a remote one's cache folder
        if hasattr(self.published, "transfer"):  # a remote one: what a run fetched, for the run's footer
            self.transfer, self.note = self.published.transfer, self.published.note

    @property
    def label(self) -> str:
        """How messages name the checkpoint: its folder, or the remote one as the user wrote it."""
        return self.published.label.rstrip("/")

    @property
    def shards(self) -> dict:
        """The shard files, by name (what a fixture's provenance lists)."""
        return self.published.shards

    def get(self, name: str) -> np.ndarray:
        stored = published_name(name)
        array = self.published.get(stored)
        if stored.endswith("tid2eid"):
            where = self.published.on_disk(f"{self.label}/{self.published.weight_map[stored]}: tensor '{stored}'")
            return checked_tid2eid(array, self.config.n_routed_experts, where)
        return array

    def stored(self, name: str) -> Stored:
        """The tensor as its shard stores it (FP8 and FP4 with their scales): what a fixture hashes."""
        return self.published.stored(published_name(name))

    def get_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        if name.endswith("tid2eid"):
            return self.get(name)[rows]  # the whole table checked: a few MB, read once per layer and step
        return self.published.get_rows(published_name(name), rows)

    def matrix(self, name: str):
        return self.published.matrix(published_name(name))

    def row_bands(self, name: str, rows: int) -> Iterator[Stored]:
        return self.published.row_bands(published_name(name), rows)

    def has(self, name: str) -> bool:
        return self.published.has(published_name(name))

    def check(self, layers: Iterable[int], with_globals: bool) -> None:
        """Every tensor these layers (and the globals) need is there, of its dtype, shape and grid
        (stepper.weights.published), else one line: the first problem, named in the checkpoint's
        folder (a missing tensor is in no shard), and how many more `stepper inspect` lists; then
        their bytes made readable (a remote checkpoint fetches them)."""
        layers = list(layers)
        problems = self.published.problems(layers, with_globals)
        if problems:
            first = problems[0]
            more = f" (and {len(problems) - 1} more: stepper inspect lists them)" if len(problems) > 1 else ""
            raise StepperError(f"{self.label}{'/' if first.file else ': '}{first.text}{more}")
        self.published.fetch_for(layers, with_globals)

    @property
    def unused(self) -> dict[str, str]:
        """The stored tensors no run reads (the MTP block), by name, with their shards."""
        return self.published.unused
