"""A shown chunked prefill gathers each chunk's figures as it comes, the histogram's bins growing
with the range (stepper.prefill, statistics.Lattice): the figures are exactly the whole tensor's
though ranges grow in later chunks (and in a later tile of a chunk), and no chunk, nor tile, runs
twice. A synthetic step, its values written out here."""

from __future__ import annotations

import sys
from collections import Counter

import numpy as np
import pytest

from stepper import prefill
from stepper.kernels import attention as kernels
from stepper.model import KVCache
from stepper.seams.trace import Emitter, Event, Recorder
from stepper.tensors import statistics
from stepper.tensors import tiled as tiled_module
from stepper.tensors.chunked import Chunked
from stepper.tensors.tiled import Tiled
from stepper.views import summary

HEADS, WIDTH, CHUNK, LENGTH = 3, 4, 5, 18
PADS = {"self_attn.attn_scores": -np.inf, "self_attn.attn_weights": 0.0}


def rows(key: str, start: int, stop: int) -> np.ndarray:
    """Per-position values [1, t, WIDTH]: q_a's and o_proj's range grows in chunk 2; the others' is
    reached in chunk 0."""
    t = np.arange(start, stop, dtype=np.float32)[None, :, None]
    values = np.sin(t * 0.7 + np.arange(WIDTH, dtype=np.float32))  # [1, t, WIDTH] in (-1, 1)
    if key in ("self_attn.q_a", "self_attn.o_proj") and start == 2 * CHUNK:
        values = values * np.float32(3)
    if key != "self_attn.q_a" and start == 0:
        values[0, 0, :2] = [-1, 1]
    return values.astype(np.float32)


def scores(start: int, stop: int, heads: slice, queries: slice, widen: bool) -> np.ndarray:
    """[1, h, t, S] over the keys up to the chunk's end, the future -inf, the range reached in chunk
    0's first block; then (widen) one larger score in head 1 of chunk 1 (the range grows in the
    chunk's second block, after its first was binned)."""
    h = np.arange(heads.start, heads.stop)[:, None, None]
    q = start + np.arange(queries.start, queries.stop)[None, :, None]
    k = np.arange(stop)[None, None, :]
    values = np.cos(0.3 * h + 0.11 * q * k + 0.5 * k).astype(np.float32)
    values = np.where((q == 0) & (k == 0), np.float32(1.5), np.where((q == 1) & (k == 0), np.float32(-1.5), values))
    if widen and start == CHUNK:
        values[h[:, 0, 0] == 1, 0, 0] = 5
    return np.where(k <= q, values, np.float32(-np.inf))[None]


def weights(start: int, stop: int, heads: slice, queries: slice, floor: float) -> np.ndarray:
    """[1, h, t, S] within [floor, 1], 1 at query 0, floor past the query: the range reached in
    chunk 0's first block (a floor above 0: the masked future the whole tensor holds past each
    chunk, 0, widens it)."""
    h = np.arange(heads.start, heads.stop)[:, None, None]
    q = start + np.arange(queries.start, queries.stop)[None, :, None]
    k = np.arange(stop)[None, None, :]
    values = floor + (1 - floor) * np.where(q == 0, 1.0, (np.cos(h + q + k) + 1) / 4)
    return np.where(k <= q, values, floor).astype(np.float32)[None]


def run(floor: float = 0.0, widen: bool = True) -> tuple[dict[str, Chunked], list[tuple[int, str]]]:
    """The synthetic prefill in chunks. -> its shown tensors, and (chunk start, name) of each tensor made"""
    made = []

    def step(span: slice, cache: KVCache, emit: Emitter) -> None:
        start, stop = span.start, span.stop

        def show(key, array):
            made.append((start, key))
            emit(key, array)
        show("self_attn.q_a", rows("self_attn.q_a", start, stop))
        show("self_attn.compressed_kv", rows("self_attn.compressed_kv", start, stop))
        shape = (1, HEADS, stop - start, stop)
        show("self_attn.attn_scores", Tiled(shape, lambda heads, queries: scores(start, stop, heads, queries, widen)))
        show("self_attn.attn_weights", Tiled(shape, lambda heads, queries: weights(start, stop, heads, queries, floor)))
        show("self_attn.o_proj", rows("self_attn.o_proj", start, stop) / 2)

    recorder = Recorder()
    prefill.in_chunks(step, LENGTH, CHUNK, KVCache(0), Emitter([recorder]), PADS)
    return {e.key: e.array for e in recorder.events}, made


def whole(key: str, floor: float = 0.0, widen: bool = True) -> np.ndarray:
    """The tensor over every position, put together here: rows widened with the masked future."""
    pieces = []
    for start in range(0, LENGTH, CHUNK):
        stop = min(start + CHUNK, LENGTH)
        every = (slice(0, HEADS), slice(0, stop - start))
        if key == "self_attn.attn_scores":
            piece = scores(start, stop, *every, widen)
        elif key == "self_attn.attn_weights":
            piece = weights(start, stop, *every, floor)
        else:
            piece = rows(key, start, stop) / (2 if key == "self_attn.o_proj" else 1)
        if key in PADS:
            pad = np.full((*piece.shape[:3], LENGTH - stop), PADS[key], np.float32)
            piece = np.concatenate([piece, pad], axis=-1)
        pieces.append(piece)
    return np.concatenate(pieces, axis=2 if key in PADS else 1)


def assert_figures_of(shown: Chunked, values: np.ndarray) -> None:
    assert shown.shape == values.shape
    assert summary.stats(shown) == summary.stats(values)
    assert summary.histogram(shown) == summary.histogram(values)
    assert summary.corners(shown) == summary.corners(values)
    bins = shown.figures.bins  # only the bins up to the max, narrow: a chunked run keeps thousands of these
    used = 0 if bins.exponent is None else statistics.lattice_index(bins.hi, bins.exponent) - bins.base + 1
    assert bins.counts.dtype == (np.uint32 if used else np.int64) and bins.counts.size == used


@pytest.mark.parametrize("widen", [True, False])
def test_every_chunk_and_tile_runs_once_and_the_figures_are_the_whole_tensors(monkeypatch, widen):
    """The scores' range grows in chunk 1's second tile, q_a's and o_proj's in chunk 2: the figures
    are still the whole tensors', and each chunk ran once, each tile of scores made once."""
    monkeypatch.setattr(tiled_module, "TILE_VALUES", 60)  # chunk 1's tiles: a head each
    tiles, make = [], scores

    def noted(start, stop, heads, queries, widen):
        tiles.append((start, heads.start, queries.start))
        return make(start, stop, heads, queries, widen)
    monkeypatch.setattr(sys.modules[__name__], "scores", noted)
    shown, made = run(widen=widen)
    during = list(tiles)  # those of the run (the figures' check below makes its own)
    for key, tensor in shown.items():
        assert_figures_of(tensor, whole(key, widen=widen))
    assert made == [(start, key) for start in range(0, LENGTH, CHUNK) for key in
                    ("self_attn.q_a", "self_attn.compressed_kv", "self_attn.attn_scores", "self_attn.attn_weights",
                     "self_attn.o_proj")]
    twice = [tile for tile, n in Counter(during).items() if n > 1]  # the corners' (first and last rows) alone
    assert max(Counter(during).values()) == 2 and all(tile[1:] == (0, 0) or tile[1] == HEADS - 1 for tile in twice)


def test_a_masked_future_outside_the_chunks_range_widens_the_histogram_without_a_chunk_run_again():
    shown, made = run(floor=0.25)  # the chunks' weights within [0.25, 1], the whole tensor's 0 past each chunk
    assert_figures_of(shown["self_attn.attn_weights"], whole("self_attn.attn_weights", floor=0.25))
    assert len(made) == 20


def test_the_scores_and_weights_made_in_tiles_are_gathered_together_each_tile_of_scores_made_once(monkeypatch):
    rng = np.random.default_rng(3)
    latents, k_pe = rng.standard_normal((1, 1, 8, 16), np.float32), rng.standard_normal((1, 1, 8, 4), np.float32)
    queries = [rng.standard_normal((1, 4, 8, 16), np.float32), rng.standard_normal((1, 4, 8, 4), np.float32)]
    ops = kernels.Operands(queries, [latents, k_pe], latents, 0.25)
    monkeypatch.setattr(tiled_module, "TILE_VALUES", 8)  # a tile: one query row of one head, 32 of them
    monkeypatch.setattr(kernels, "KEPT_ROW_BYTES", 3 * 8 * 4)  # three rows of scores kept
    made = []
    scores_of = kernels.Operands.scores

    def counted(self, heads: slice, queries: slice, keys: slice) -> np.ndarray:
        made.append((heads.start, queries.start))
        return scores_of(self, heads, queries, keys)
    monkeypatch.setattr(kernels.Operands, "scores", counted)
    gathered = prefill.Gathered(Emitter([lambda e: None]), PADS)
    gathered(Event("layers.0.self_attn.attn_scores", "self_attn.attn_scores", Tiled(ops.shape, ops.rows), 0))
    assert made == []  # waiting for the weights
    weights = Tiled(ops.shape, kernels.Softmaxed(ops).weights)
    gathered(Event("layers.0.self_attn.attn_weights", "self_attn.attn_weights", weights, 0))  # gathered at once
    # each row made once for the scores and the weights (one tensor after the other: 64), the first once more
    # for the corners, long let go
    assert len(made) == 33 and len(set(made)) == 32
    for key, tensor in (("self_attn.attn_scores", Tiled(ops.shape, ops.rows)),
                        ("self_attn.attn_weights", Tiled(ops.shape, kernels.Softmaxed(ops).weights))):
        part, values = gathered.parts[f"layers.0.{key}"], np.asarray(tensor)
        assert part.gather.stats() == summary.stats(values)
        assert part.gather.bins.view(16)[0].tolist() == summary.histogram(values)[0]
