"""Routed experts dealt out across the cores: each process runs whole experts, one wait per layer.

Cutting every product into bands (fp8_workers.linear_bands) makes the processes wait for each
other after each product: 24 times for the routed experts of a Kimi K2 decode step. Here a
layer's routed experts are dealt out before any of them runs: the costliest first, each to the
process with the least work so far. A helper is handed its experts as this process reaches them
in the layer's order, runs them without answering and adds their weighted outputs into a sum of
its own; this process runs its own experts meanwhile and adds the helpers' sums at the end. If a
helper fails, this process runs the experts it had been given.

Dealing pays when a layer has many experts to deal: a prefill of 512 tokens through Kimi K2's
384 experts took 8.3 s dealt against 9.1 s in bands. With few, one expert more or less is a large
share of a process's work: 16 experts of 100 to 400 tokens each took 5.0 s dealt against 4.3 s in
bands, and the 9 experts of a decode step measured the same either way. So fewer than
MIN_DEALT experts stay with the bands. (Cutting each expert's intermediate dimension instead, so
that every process runs a part of every expert, measured slower still: the down projection's
column halves share every page of the weight, and its tiles are half as long.)
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from . import fp8_workers
from .fp8_matmul import Fp8Matrix
from .ops import swiglu

MIN_DEALT = 32  # experts in a layer's sum before they are dealt out rather than cut into bands
DECODE_AS_TOKENS = 14  # decoding a weight costs about as much as multiplying it by 14 tokens (0.45 ns, 0.03 ns)


@dataclass(frozen=True)
class MatrixRef:
    """An FP8 weight stored row-major in a file, as a helper finds it."""

    path: str
    offset: int
    shape: tuple[int, int]
    scale_inv: np.ndarray
    block: tuple[int, int]

    @classmethod
    def of(cls, w: Fp8Matrix) -> MatrixRef:
        return cls(*w.origin, w.shape, w.scale_inv, w.block)

    def matrix(self) -> Fp8Matrix:
        codes = fp8_workers.file_codes(self.path, self.offset, self.shape)
        return Fp8Matrix(codes, self.scale_inv, self.block, origin=(self.path, self.offset))


@dataclass(frozen=True)
class Job:
    """One expert for a helper: the tokens that chose it (rows of the layer's tokens), their
    routing weights, and its gate, up and down weights."""

    rows: np.ndarray  # [n_e]
    weights: np.ndarray  # [n_e]
    matrices: tuple[MatrixRef, MatrixRef, MatrixRef]


def deal(token_counts: Sequence[int], processes: int) -> list[int]:
    """The process (0: this one) that runs each expert: costliest first, each to the least loaded."""
    loads = [(0, p) for p in range(processes)]
    owner = [0] * len(token_counts)
    for i in sorted(range(len(token_counts)), key=lambda i: -token_counts[i]):
        load, p = heapq.heappop(loads)
        owner[i] = p
        heapq.heappush(loads, (load + DECODE_AS_TOKENS + token_counts[i], p))
    return owner


def shareable(*matrices) -> bool:
    """FP8 weights a helper can read from their file, big enough to be worth handing over."""
    return all(isinstance(m, Fp8Matrix) and m.origin is not None and m.codes.flags.c_contiguous
               and m.codes.size >= fp8_workers.SHARE_WEIGHTS for m in matrices)


class Split:
    """A layer's routed experts, dealt out to this process and the helpers."""

    def __init__(self, tokens: np.ndarray, token_counts: Sequence[int], helpers: list):
        self.tokens = tokens  # [N, D]
        self.helpers = helpers
        self.owner = deal(token_counts, len(helpers) + 1)
        self.given: list[list[tuple]] = [[] for _ in helpers]  # (rows, weights, matrices), should a helper fail
        self.failed = not helpers
        for helper in helpers:
            self._try(helper.begin_experts, tokens)

    def here(self, i: int, rows: np.ndarray, weights: np.ndarray, gate, up, down) -> bool:
        """True if expert i (of the dealt order) runs here; False if it was handed to its helper."""
        p = self.owner[i]
        if p == 0 or self.failed or not shareable(gate, up, down):
            return True
        self.given[p - 1].append((rows, weights, (gate, up, down)))
        self._try(self.helpers[p - 1].send_expert, Job(rows, weights, tuple(MatrixRef.of(m) for m in (gate, up, down))))
        return False

    def add_theirs(self, out: np.ndarray) -> None:
        """out [N, D] += every helper's weighted sum (run here instead for a helper that failed)."""
        for helper, given in zip(self.helpers, self.given):
            total = self._try(helper.end_experts)
            if total is not None:
                out += total
                continue
            for rows, weights, matrices in given:
                out[rows] += swiglu(self.tokens[rows], *matrices) * weights[:, None]

    def _try(self, action, *args):
        if self.failed:
            return None
        try:
            return action(*args)
        except (OSError, EOFError, RuntimeError):  # a helper died or failed: everything runs here
            self.failed = True
            fp8_workers.mark_broken()
            return None


@contextmanager
def experts_across_cores(tokens: np.ndarray, token_counts: Sequence[int]) -> Iterator[Split]:
    """A Split of the experts over tokens [N, D] that take token_counts tokens each. With no
    helpers, or few experts, every expert runs here (its products cut into bands as usual); with
    helpers, the products inside are not cut into bands."""
    helpers = fp8_workers.available_helpers() if len(token_counts) >= MIN_DEALT else []
    if not helpers:
        yield Split(tokens, token_counts, [])
        return
    with fp8_workers.bands_paused():
        try:
            yield Split(tokens, token_counts, helpers)
        except BaseException:  # interrupted: a helper's answer may be left unread, so stop using them
            fp8_workers.mark_broken()
            raise


# ---------------------------------------------------------------------------------------------
# The helper's side


class HelperSum:
    """A helper's running sum of its experts' weighted outputs, over tokens in the scratch memory."""

    def __init__(self, tokens: np.ndarray, total: np.ndarray):
        self.tokens, self.total = tokens, total  # [N, D] each, views of the scratch
        self.total[:] = 0
        self.error: str | None = None

    def add(self, job: Job, keep) -> None:
        """Run one expert and add its weighted output; keep(ref) is told of each weight read."""
        if self.error is not None:
            return
        try:
            matrices = [ref.matrix() for ref in job.matrices]
            self.total[job.rows] += swiglu(self.tokens[job.rows], *matrices) * job.weights[:, None]
            for ref in job.matrices:
                keep(ref)
        except Exception as e:  # noqa: BLE001 (reported when the sum is asked for)
            self.error = f"{type(e).__name__}: {e}"
