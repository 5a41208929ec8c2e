"""The synthetic full-size checkpoints the layer scenarios read: written once into the work
directory, dropped from the page cache and read back as stepper reads them, so that every run
finds them cached the same way."""

from __future__ import annotations

import mmap
import os
import time
from pathlib import Path

import numpy as np

from stepper import files
from stepper.config import Config
from stepper.presets import PRESETS
from stepper.weights.checkpoint import INDEX
from stepper.weights.safetensors_reader import advise_checkpoint_map
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.synth_checkpoint import synth_checkpoint

FILL_BYTES = 1 << 26  # what fill_page_cache reads or maps at a time


def fill_page_cache(checkpoint: Path) -> float:
    """Read every shard of the checkpoint once, so the timed runs find it in the page cache;
    returns the seconds taken. (A machine whose memory reclaim drops file pages nobody has read
    for a while, as the one docs/performance.md's figures come from does after about a minute, has
    otherwise lost part of a cache filled by hand before `stepper bench` by the time a scenario
    runs.) The pages are read as the checkpoint reader reads them, through a map advised by
    `advise_checkpoint_map`, so that what was dropped comes back in 2 MB folios: `read()` brings
    back the start of each stretch it finds missing in smaller ones."""
    start = time.perf_counter()
    for shard in sorted(checkpoint.glob("*.safetensors")):
        with open(shard, "rb", buffering=0) as f:
            if os.fstat(f.fileno()).st_size == 0:
                continue
            view = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            if advise_checkpoint_map(view) == mmap.PAGESIZE:  # a fault would read one page: read() instead
                read_through(f)
            else:
                touch_through(view)
            view.close()
    return time.perf_counter() - start


def read_through(f) -> None:
    chunk = bytearray(FILL_BYTES)
    while f.readinto(chunk):
        pass


def touch_through(view: mmap.mmap) -> None:
    """Fault in every page of the map, a chunk at a time, letting each chunk go after."""
    pages = np.frombuffer(view, np.uint8)
    for first in range(0, pages.size, FILL_BYTES):
        int(pages[first : first + FILL_BYTES : mmap.PAGESIZE].sum())
        view.madvise(mmap.MADV_DONTNEED, first, min(FILL_BYTES, pages.size - first))
    del pages


def forget_page_cache(checkpoint: Path) -> None:
    """Let the page cache drop the checkpoint's pages (those no process maps), so that the
    scenarios after it find the checkpoint as a first read from disk leaves it, whatever read or
    mapped it before: in large folios. The same bytes cached as 4 KB pages, as earlier versions of
    the reader left them, cost ten times as much to map (`advise_checkpoint_map`)."""
    if not hasattr(os, "posix_fadvise"):
        return
    for shard in sorted(checkpoint.glob("*.safetensors")):
        with open(shard, "rb", buffering=0) as f:
            os.fsync(f.fileno())  # pages not yet written back are not dropped
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def bench_config(model: str, experts: int | None) -> Config:
    raw = dict(PRESETS[model])
    if experts is not None:
        raw.update(n_routed_experts=experts, _name_or_path=f"{model}-{experts}-experts")
    return Config.from_hf(raw, f"bench {model}")


def ensure_checkpoint(workdir: Path, cfg: Config, layers: range, seed: int = 0) -> Path:
    """The synthetic checkpoint of these layers, written once into workdir and reused."""
    folder = workdir / f"{cfg.name}-layers{layers.start}-{layers.stop - 1}-seed{seed}"
    if not (folder / INDEX).exists():
        files.make_folder(workdir)
        synth_checkpoint(SyntheticWeights(cfg, seed), folder, layers, force=True)
    return folder


def bench_checkpoints(workdir: Path) -> list[Path]:
    """The checkpoints the bench wrote into workdir. All are dropped from the page cache before
    the full-size MoE layer's is read back: 24 GB held its 16 GB beside the others' pages and
    the libraries only in part, and decode steps read 25-36 pages from disk while timed in two
    runs of three."""
    return sorted(folder for folder in workdir.iterdir() if (folder / INDEX).exists())
