"""A checkpoint written again as transformers' save_pretrained writes one: every shard's tensors
read, some renamed or changed by the caller, saved beside the same config.json as one
model.safetensors."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes  # noqa: F401  (safetensors.numpy reads BF16 through it)
import numpy as np
from safetensors.numpy import load_file, save_file


def stored_tensors(published: Path) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint's shards, by its stored name."""
    return {name: a for shard in sorted(published.glob("*.safetensors")) for name, a in load_file(shard).items()}


def saved_as_one_file(published: Path, folder: Path, tensors: dict[str, np.ndarray]) -> Path:
    """`tensors` as one model.safetensors in a new `folder`, with `published`'s config.json. -> folder"""
    folder.mkdir()
    (folder / "config.json").write_bytes((published / "config.json").read_bytes())
    save_file(tensors, str(folder / "model.safetensors"))
    return folder
