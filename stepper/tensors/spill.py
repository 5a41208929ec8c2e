"""Tensors' chunks kept on disk while their range may still grow: a chunked prefill bins each
chunk's values against the range seen so far, and the chunks binned before the range was final
are binned again, against the final range, from the values written here as they came, rather
than by running their step again (stepper.prefill). The values go to one unnamed temporary file
(gone once closed, or when the process ends) and are read back a block at a time, so memory holds
one block of them: the peak of the prefill does not grow with the prompt. What is written stays
within a budget (half the free space of the temporary directory when the file is opened): a
tensor that would pass it is not written (`write` says so) and its chunks run again instead."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import numpy as np

from stepper.tensors.statistics import CHUNK, chunks, exact_dtype


class Spill:
    """The values of tensors' chunks, by name and chunk."""

    def __init__(self, budget: int | None = None):
        self.budget = budget  # bytes that may be written (None: half the free space, when the file is opened)
        self.file = None
        self.written = 0
        self.pieces: dict[str, list[tuple[int, int, int]]] = {}  # name -> (chunk, offset, bytes) of each written
        self.dtypes: dict[str, np.dtype] = {}  # of the values as `chunks` gives them: float32, or float64

    def write(self, name: str, k: int, array: np.ndarray) -> bool:
        """Chunk k of `name`'s values, as `statistics.chunks` gives them (float32 where that is
        exact). -> whether it was written (False: it would pass the budget; nothing is written)"""
        wide = exact_dtype(array.dtype)
        nbytes = int(np.prod(array.shape)) * wide.itemsize
        if self.file is None:
            self.file = tempfile.TemporaryFile(prefix="stepper-chunks-")  # noqa: SIM115 (open until `close`)
            self.budget = shutil.disk_usage(tempfile.gettempdir()).free // 2 if self.budget is None else self.budget
        if self.written + nbytes > self.budget:
            return False
        self.file.seek(self.written)
        for values in chunks(array):
            self.file.write(memoryview(np.ascontiguousarray(values)).cast("B"))
        self.pieces.setdefault(name, []).append((k, self.written, nbytes))
        self.dtypes[name] = wide
        self.written += nbytes
        return True

    def size(self, name: str, before: int) -> int:
        """How many values the chunks of `name` before chunk `before` hold."""
        return sum(nbytes for k, _, nbytes in self.pieces.get(name, []) if k < before) // self.dtypes[name].itemsize

    def values(self, name: str, before: int) -> Iterator[np.ndarray]:
        """The values of the chunks of `name` before chunk `before`, at most CHUNK at a time. -> [n] each"""
        dtype = self.dtypes.get(name)
        for _, offset, nbytes in (piece for piece in self.pieces.get(name, []) if piece[0] < before):
            for start in range(0, nbytes, CHUNK * dtype.itemsize):
                block = np.empty(min(nbytes - start, CHUNK * dtype.itemsize) // dtype.itemsize, dtype)
                self.file.seek(offset + start)
                if self.file.readinto(memoryview(block).cast("B")) != block.nbytes:
                    raise OSError(f"{self.file.name}: the chunks' values written there were cut short")
                yield block

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
