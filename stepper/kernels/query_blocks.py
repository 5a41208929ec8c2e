"""An attention's [B, H, T, ...] arrays made a block of query rows at a time, the blocks shared
across the cores.

A query's scores, weights and output depend on its own inputs alone, so the same lines run on a
block of queries give that block's rows bit for bit, and the whole array made block by block is
the array made whole (tests/unit/test_query_blocks.py). A block holds about BLOCK_VALUES values,
so each line's temporaries are a few MiB the allocator hands out again, not an array over its
32 MiB threshold mapped (and faulted in) afresh by every line; and the blocks are shared out in
contiguous runs, one per core (parallel.split), where the helper processes are idle.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from stepper.kernels import parallel

BLOCK_VALUES = 1 << 18  # values of one block of rows (1 MiB in float32): V4-Flash's scores [1, 64, 16, 257]


def by_query_blocks(shape: tuple[int, ...], make: Callable[[slice], np.ndarray]) -> np.ndarray:
    """The float32 array of `shape` [B, H, T, ...] whose rows t are make(t) [B, H, len(t), ...],
    for blocks t of the T axis of about BLOCK_VALUES values each, made on every core."""
    out = np.empty(shape, np.float32)
    T = shape[2]
    rows = max(1, BLOCK_VALUES * T // max(1, out.size))
    blocks = [slice(start, min(start + rows, T)) for start in range(0, T, rows)]

    def fill(share: list[slice]) -> None:
        for t in share:
            out[:, :, t] = make(t)

    parallel.split(blocks, fill)
    return out
