"""A tensor's chunks kept on disk while its range may still grow: a chunked prefill bins each
chunk's values against the range seen so far, and the chunks binned before the range was final
are binned again, against the final range, from the values written here as they came, rather
than by running their step again (stepper.prefill). The values are written to an unnamed
temporary file (gone once closed, or when the process ends) and read back a block at a time, so
memory holds one block of them: the peak of the prefill does not grow with the prompt."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator

import numpy as np

from stepper.tensors.statistics import CHUNK, chunks


class Spill:
    """The values of one tensor's chunks, in the order they came: chunk k's are those between the
    ends of chunks k - 1 and k."""

    def __init__(self) -> None:
        self.file = tempfile.TemporaryFile(prefix="stepper-chunks-")  # noqa: SIM115 (open until `close`)
        self.ends: list[int] = []  # bytes written once each chunk was
        self.dtype = np.dtype(np.float32)  # of the values as `chunks` gives them: float32, or float64

    def write(self, array: np.ndarray) -> None:
        """The next chunk's values, as `statistics.chunks` gives them (float32 where that is exact)."""
        for values in chunks(array):
            self.dtype = values.dtype
            self.file.write(memoryview(np.ascontiguousarray(values)).cast("B"))
        self.ends.append(self.file.tell())

    def size(self, first: int) -> int:
        """How many values the first `first` chunks hold."""
        return (self.ends[first - 1] if first else 0) // self.dtype.itemsize

    def values(self, first: int) -> Iterator[np.ndarray]:
        """The values of the first `first` chunks, at most CHUNK at a time. -> [n] each"""
        left = self.size(first)
        self.file.seek(0)
        while left:
            block = np.empty(min(left, CHUNK), self.dtype)
            if self.file.readinto(memoryview(block).cast("B")) != block.nbytes:
                raise OSError(f"{self.file.name}: the chunks' values written there were cut short")
            left -= block.size
            yield block

    def close(self) -> None:
        self.file.close()
