"""Writes safetensors files one tensor at a time, so memory holds one tensor, not the file.

The header (names, dtypes, shapes, byte offsets) is known before any data exists: each entry
brings a function that makes its array when its turn comes. The header is padded with spaces
to a multiple of 8 bytes, as the reference writer does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from stepper.files import new_file

ITEM_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E8M0": 1, "I64": 8, "I32": 4, "I8": 1, "U8": 1}


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str  # safetensors dtype name
    shape: tuple[int, ...]
    make: Callable[[], np.ndarray | Iterable[np.ndarray]]  # the array, or its blocks in C order

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * ITEM_SIZE[self.dtype]


def header_bytes(entries: list[Entry], metadata: dict[str, str] | None) -> bytes:
    header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for e in entries:
        header[e.name] = {"dtype": e.dtype, "shape": list(e.shape), "data_offsets": [offset, offset + e.nbytes]}
        offset += e.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)


def write_safetensors(path: Path, entries: Iterable[Entry], metadata: dict[str, str] | None = None) -> None:
    """A new file (one already at `path` is not replaced: stepper.files.new_file)."""
    with new_file(path) as f:
        write_safetensors_into(f, entries, metadata)


def write_safetensors_into(f: BinaryIO, entries: Iterable[Entry], metadata: dict[str, str] | None = None,
                           seen: Any = None) -> bytes:
    """The file's bytes written into f; each also given to `seen` (a hashlib object: its update) as
    it is written. -> the header (after its 8 bytes of length)"""
    entries = list(entries)
    header = header_bytes(entries, metadata)
    for part in (len(header).to_bytes(8, "little"), header):
        f.write(part)
        if seen is not None:
            seen.update(part)
    for e in entries:
        made = e.make()
        if isinstance(made, np.ndarray):
            array = np.ascontiguousarray(made).reshape(made.shape)  # a scalar stays one: ascontiguousarray makes it [1]
            if array.shape != e.shape or array.nbytes != e.nbytes:
                raise ValueError(f"{e.name}: made {array.shape} ({array.nbytes} bytes), header says {e.shape}")
            write_block(f, array, seen)  # raw bytes, no copy
        else:  # the tensor's blocks in C order, one at a time
            written = sum(write_block(f, block, seen) for block in made)
            if written != e.nbytes:
                raise ValueError(f"{e.name}: made {written} bytes in blocks, header says {e.nbytes}")
    return header


def write_block(f, block: np.ndarray, seen: Any = None) -> int:
    block = np.ascontiguousarray(block)
    block.tofile(f)
    if seen is not None:
        seen.update(block.reshape(-1).view(np.uint8))
    return block.nbytes
