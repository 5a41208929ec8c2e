"""`stepper inspect --stats`: the decoded statistics of each listed tensor.

A tensor is read a batch of rows at a time with plain sequential reads and each batch decoded (FP8
with `fp8.dequantize` and its scales, whole scale blocks at a time; FP8 without fitting scales as
its bare code values; FP4 with `fp4.dequantize_fp4` and its group scales), so a large tensor never
needs a float64 copy of itself; the batches' statistics are then combined (`summary.combine`).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np
from rich.console import Console

from stepper import fp4, fp8, int4
from stepper.errors import StepperError
from stepper.views import summary
from stepper.views.inspect import FP8_DTYPE, Source, Tensor
from stepper.views.sinks import styles
from stepper.views.summary import Stats
from stepper.weights.safetensors_reader import SafetensorsFile, dtype_of

AS_FLOAT32 = ("BF16", "F16", "F32", "F8_E5M2")  # decoded as float32, as Checkpoint.get does
BATCH_VALUES = 1 << 20  # elements decoded at a time for statistics (small enough to stay in cache)


def with_stats(source: Source, tensors: list[Tensor], progress: bool, plain: bool = False) -> list[Tensor]:
    """The tensors with their decoded statistics; a progress bar on stderr if asked (gone when done)."""
    if not progress:
        return [replace(t, stats=tensor_stats(source, t, lambda n: None)) for t in tensors]
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn  # only for --stats

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True, **styles(plain)), transient=True) as bar:
        task = bar.add_task("statistics", total=sum(t.part.nbytes for t in tensors))
        done = []
        for t in tensors:
            bar.update(task, description=t.name)
            done.append(replace(t, stats=tensor_stats(source, t, lambda n: bar.advance(task, n))))
        return done


def tensor_stats(source: Source, tensor: Tensor, advance: Callable[[int], None]) -> Stats:
    parts = []
    for batch, nbytes in decoded_row_batches(source, tensor):
        parts.append(summary.stats(batch))
        advance(nbytes)
    return summary.combine(parts)


def decoded_row_batches(source: Source, tensor: Tensor) -> Iterator[tuple[np.ndarray, int]]:
    """The tensor's values, a batch of rows at a time (whole FP8 scale blocks), with their byte size."""
    part = tensor.part
    if len(part.shape) == 0 or 0 in part.shape:
        data = source.array(part.name)
        yield decoded(data, part.dtype), data.nbytes
        return
    if tensor.int4:
        yield from int4_row_batches(source, tensor)
        return
    if tensor.fp4 and not tensor.problems:
        yield from fp4_row_batches(source, tensor)
        return
    block_rows = source.block[0]
    step = max(1, BATCH_VALUES // math.prod(part.shape[1:]))
    scale = source.array(tensor.scale.name) if tensor.dequantized else None
    per_tensor = scale is not None and source.config is not None and source.config.quantization.per_tensor
    if scale is not None and not per_tensor:
        step = max(block_rows, step // block_rows * block_rows)
    with RowReader(source.shards[part.shard], part.name) as reader:
        for r0 in range(0, part.shape[0], step):
            rows = reader.read(r0, min(r0 + step, part.shape[0]))
            if per_tensor:
                yield per_tensor_values(rows, np.asarray(scale, np.float32).reshape(-1), r0, part.name), rows.nbytes
            elif scale is not None:
                s = scale[r0 // block_rows: -(-(r0 + len(rows)) // block_rows)]
                yield fp8.dequantize(rows, s, source.block, name=part.name), rows.nbytes
            else:
                yield decoded(rows, part.dtype), rows.nbytes


def per_tensor_values(rows: np.ndarray, scales: np.ndarray, r0: int, name: str) -> np.ndarray:
    """Rows of a weight with one scale (scales [1]), or experts [k, rows, cols] from expert r0 of a
    fused tensor with one scale each (scales [E]): code value x its scale."""
    if rows.ndim == 2:
        return fp8.dequantize(rows, fp8.per_tensor_grid(rows.shape, scales[0]), name=name)
    return np.stack([fp8.dequantize(m, fp8.per_tensor_grid(m.shape, scales[r0 + i]), name=name)
                     for i, m in enumerate(rows)])


def int4_row_batches(source: Source, tensor: Tensor) -> Iterator[tuple[np.ndarray, int]]:
    """An INT4 weight's values (nibble - 8) x group scale, a batch of rows at a time; without
    (fitting) scales and shape, the bare values nibble - 8 of its packed words."""
    part = tensor.part
    step = max(1, BATCH_VALUES // (part.shape[1] * 8))
    scales = source.array(tensor.scale.name) if tensor.dequantized else None
    with RowReader(source.shards[part.shard], part.name) as reader:
        for r0 in range(0, part.shape[0], step):
            words = reader.read(r0, min(r0 + step, part.shape[0]))
            if scales is None:
                yield int4.unpack_bits(words, words.shape[1] * int4.PER_WORD).astype(np.float32), words.nbytes
            else:
                in_dim = tensor.weight_shape[1]
                yield int4.dequantize_int4(words, scales[r0 : r0 + len(words)], in_dim, in_dim // scales.shape[1],
                                           name=part.name), words.nbytes


def fp4_row_batches(source: Source, tensor: Tensor) -> Iterator[tuple[np.ndarray, int]]:
    """An FP4 weight's values, e2m1 code x its group's E8M0 scale, a block of rows at a time."""
    part = tensor.part
    step = max(1, BATCH_VALUES // (part.shape[1] * 2))
    scales = source.array(tensor.scale.name)
    with RowReader(source.shards[part.shard], part.name) as reader:
        for r0 in range(0, part.shape[0], step):
            packed = reader.read(r0, min(r0 + step, part.shape[0]))
            yield fp4.dequantize_fp4(packed, scales[r0 : r0 + len(packed)], name=part.name), packed.nbytes


class RowReader:
    """Reads rows of one tensor with plain sequential reads.

    Statistics read every byte once, front to back; through the reader's memory map (tuned for
    lazy, random access) that costs one page fault per page, which is slow on a cold disk.
    """

    def __init__(self, file: SafetensorsFile, name: str):
        info = file.info(name)
        self.name, self.path = name, file.path
        self.dtype = dtype_of(info.dtype)
        self.row_shape = info.shape[1:]
        self.row_bytes = info.nbytes // info.shape[0]
        self.start = file.data_range(name)[0]
        self.file = open(file.path, "rb", buffering=0)  # noqa: SIM115 (closed by __exit__)
        if hasattr(os, "posix_fadvise"):
            with contextlib.suppress(OSError):
                os.posix_fadvise(self.file.fileno(), self.start, info.nbytes, os.POSIX_FADV_SEQUENTIAL)

    def read(self, first: int, stop: int) -> np.ndarray:
        """Rows first..stop-1."""
        out = np.empty((stop - first, *self.row_shape), dtype=self.dtype)
        buffer = memoryview(out.reshape(-1).view(np.uint8))
        self.file.seek(self.start + first * self.row_bytes)
        done = 0
        while done < len(buffer):
            n = self.file.readinto(buffer[done:])
            if not n:
                raise StepperError(f"{self.path}: the file ended inside tensor '{self.name}'; did it change?")
            done += n
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()


def decoded(data: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == FP8_DTYPE:
        return fp8.decode(np.ascontiguousarray(data))  # without (fitting) scales: the bare code values
    if dtype in AS_FLOAT32:
        return np.asarray(data, dtype=np.float32)
    return data  # F64, integers and booleans: summary.stats reads them as float64
