"""A DeepSeek-V4 checkpoint (published, or as transformers saves it) not on this machine (`hf://ORG/NAME`,
`https://HOST/PATH/`), read as stepper.weights.remote reads any remote checkpoint: config.json and
the index whole, each shard's header in two range reads, and then only the bytes of the tensors a
run needs (with their `.scale` grids), fetched once they are checked; the embedding only its
prompt's rows, the `mtp.*` block never; for `stepper fp8 --weight`, one weight's scales and the
rows it shows (stored_rows). The cache folder is then read by PublishedCheckpoint as a
local folder is, with the same checks.

A remote folder cannot be listed: its shards are found through model.safetensors.index.json, or it
is one model.safetensors.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from stepper.errors import StepperError
from stepper.untrusted import shown
from stepper.weights import remote
from stepper.weights.checkpoint import INDEX, SINGLE
from stepper.weights.published import FP8_DTYPE, PublishedCheckpoint, is_published_v4, scale_of
from stepper.weights.remote import Reached, RemoteReads
from stepper.weights.safetensors_reader import SafetensorsFile
from stepper.weights.stored import Stored

EMBED = "embed.weight"  # read a prompt's rows at a time


def is_remote_published(model: str) -> bool:
    """Whether a remote checkpoint's config.json (fetched once into the cache) says DeepSeek-V4."""
    folder, _, _ = remote.config_folder(model)
    return is_published_v4(folder)


def open_published(where: str | Path, config: Any = None) -> PublishedCheckpoint:
    """A published V4 checkpoint: a folder, or a remote one (hf://, https://) from its headers alone.
    config: as PublishedCheckpoint takes it, or a function of config.json's path that reads it."""
    if isinstance(where, str) and remote.is_remote(where):
        return RemotePublishedCheckpoint(remote.reach(where), config)
    folder = Path(where)
    return PublishedCheckpoint(folder, config(folder / "config.json") if callable(config) else config)


class RemotePublishedCheckpoint(RemoteReads, PublishedCheckpoint):
    """A PublishedCheckpoint over the cache folder of a remote one (RemoteReads)."""

    def __init__(self, reached: Reached, config: Any = None):
        self.remote = reached
        if not (reached.folder / INDEX).exists() and SINGLE in reached.failures:  # a folder that cannot be listed
            raise StepperError(f"{shown(reached.origin.url(INDEX))}: no such file, and "
                               f"{reached.failures[SINGLE]}: a remote checkpoint's shards are found through its index")
        super().__init__(reached.folder, config(reached.folder / "config.json") if callable(config) else config)
        self.note_failures(self.unreadable)

    def fetch_for(self, layers: Iterable[int], with_globals: bool) -> None:
        """The tensors these layers (and the globals) read and their scales, fetched in merged
        ranges: all but the embedding, whose rows are fetched as a prompt asks for them."""
        needed = [name for name in self.required(layers, with_globals) if name != EMBED]
        self.fetch([n for name in needed for n in (name, scale_of(name)) if n in self.weight_map])

    def get_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Only the rows' bytes fetched (the embedding's prompt rows), unless the tensor is FP8."""
        stored = self.local(name)
        info = self.shard_of(stored).info(stored)
        if info.dtype == FP8_DTYPE or not info.shape:
            return super().get_rows(name, rows)
        return self.fetched_rows(stored, rows)

    def stored_rows(self, name: str, rows: range) -> Stored:
        """Tensor `name` as stored, checked from its header first, with its scales whole but of its
        bytes only rows `rows` fetched (those inside the tensor): what `stepper fp8 --weight` shows
        of one FP8 block or FP4 group. Only those rows are to be read: the others are not fetched."""
        name = self.local(name)
        self._keep_resident(name)
        self.check_stored(name)
        shard = self.shard_of(name)
        info = shard.info(name)
        if len(info.shape) != 2:  # not a weight matrix: fetched whole
            return self.stored(name)
        start, _ = shard.data_range(name)
        row_bytes = info.nbytes // info.shape[0]
        first, stop = min(max(rows.start, 0), info.shape[0]), min(max(rows.stop, 0), info.shape[0])
        if stop > first:
            self.remote.cached[self.weight_map[name]].ensure([(start + first * row_bytes, start + stop * row_bytes)])
        return self.stored_over(name, SafetensorsFile.get(shard, name))  # the mapped view, no fetch
