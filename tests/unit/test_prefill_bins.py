"""A shown chunked prefill bins each chunk's values against the range seen so far; the chunks binned
before a tensor's range was final are binned again from their values kept on disk (a held tensor)
or run again (a tiled one), each replay stopping once it has made the tensors it runs for
(stepper.prefill): the figures are exactly the whole tensor's, as when every chunk ran twice. A
synthetic step, its values written out here, so which chunks run again is known."""

from __future__ import annotations

import sys

import numpy as np

from stepper import prefill
from stepper.kernels import attention as kernels
from stepper.model import KVCache
from stepper.seams.trace import Emitter, Event, Recorder
from stepper.tensors import spill as spill_module
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


def test_only_the_chunks_binned_before_a_range_was_final_run_again_and_stop_after_what_they_are_for(monkeypatch):
    monkeypatch.setattr(tiled_module, "TILE_VALUES", 60)  # chunk 1's tiles: a head each
    replaying, tiles, make, replay = [], [], scores, prefill.Replay.run

    def noted(start, stop, heads, queries, widen):
        if replaying:
            tiles.append((start, heads.start))
        return make(start, stop, heads, queries, widen)

    def again(self, k, sinks):
        replaying.append(k)
        replay(self, k, sinks)
        replaying.clear()
    monkeypatch.setattr(sys.modules[__name__], "scores", noted)
    monkeypatch.setattr(prefill.Replay, "run", again)
    shown, made = run()
    for key, tensor in shown.items():
        assert_figures_of(tensor, whole(key))
    first = [(start, key) for start in range(0, LENGTH, CHUNK) for key in
             ("self_attn.q_a", "self_attn.compressed_kv", "self_attn.attn_scores", "self_attn.attn_weights",
              "self_attn.o_proj")]
    assert made[:len(first)] == first
    # the scores' range grew in chunk 1's second tile (head 1): chunk 0 runs again, and chunk 1 up to its
    # first tile, each stopped once the scores were binned; q_a's growth in chunk 2 is binned again on the
    # way (made before the scores, it is not kept on disk), o_proj's from its chunks kept on disk; the
    # weights and compressed_kv were binned as they came
    again = ("self_attn.q_a", "self_attn.compressed_kv", "self_attn.attn_scores")
    assert made[len(first):] == [(start, key) for start in (0, 5) for key in again]
    # the tiles made again: chunk 0's (heads 0 and 1, head 2), chunk 1's first (head 0) and perhaps its
    # second, made ahead while the first was binned
    assert tiles[:3] == [(0, 0), (0, 2), (5, 0)] and tiles[3:] in ([], [(5, 1)])


def test_no_chunk_runs_again_when_every_range_is_reached_in_the_first_blocks():
    shown, made = run(widen=False)
    assert_figures_of(shown["self_attn.attn_scores"], whole("self_attn.attn_scores", widen=False))
    assert_figures_of(shown["self_attn.attn_weights"], whole("self_attn.attn_weights"))
    assert_figures_of(shown["self_attn.q_a"], whole("self_attn.q_a"))
    assert_figures_of(shown["self_attn.o_proj"], whole("self_attn.o_proj"))
    # q_a's growth in chunk 2 alone runs chunks 0 and 1 again, up to q_a (made before the last tiled tensor,
    # it is not kept on disk); o_proj's is binned again from its chunks kept there
    assert made[20:] == [(0, "self_attn.q_a"), (5, "self_attn.q_a")]


def test_a_masked_future_outside_the_chunks_range_makes_every_chunk_run_again():
    shown, made = run(floor=0.25)  # the chunks' weights within [0.25, 1], the whole tensor's 0 past each chunk
    assert_figures_of(shown["self_attn.attn_weights"], whole("self_attn.attn_weights", floor=0.25))
    assert [start for start, key in made[20:] if key == "self_attn.attn_weights"] == [0, 5, 10, 15]
    assert not any(key == "self_attn.o_proj" for _, key in made[20:])


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
    gathered = prefill.Gathered(Emitter([lambda e: None]), PADS, spill_module.Spill())
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
        part.close_stats(1)
        assert part.stats == summary.stats(values)
        # the scores' range grew after the first row: this chunk would run again for the bins, up to the last
        # growth; the weights' grew in the first row alone (their largest, 1 at query 0)
        if key == "self_attn.attn_scores":
            assert part.replayed == 1 and part.since == 0 and 0 < part.upto < values.size
        else:
            assert part.replayed == 0 and part.counts.sum() == values.size


def test_a_held_tensors_chunks_binned_again_from_disk_are_read_a_block_at_a_time(monkeypatch):
    """o_proj's chunks 0 and 1, binned before its range grew in chunk 2, are read back from the spill,
    at most CHUNK values at a time, once: 2 chunks of 5 positions of WIDTH values in blocks of 3."""
    monkeypatch.setattr(spill_module, "CHUNK", 3)
    read = []
    values = spill_module.Spill.values

    def noted(self, name, before):
        for block in values(self, name, before):
            read.append(block.size)
            yield block
    monkeypatch.setattr(spill_module.Spill, "values", noted)
    shown, made = run(widen=False)
    assert_figures_of(shown["self_attn.o_proj"], whole("self_attn.o_proj"))
    assert sum(read) == 2 * CHUNK * WIDTH and max(read) == 3 and {key for _, key in made[20:]} == {"self_attn.q_a"}


def test_a_tensor_past_the_spills_budget_runs_its_chunks_again(monkeypatch):
    """The spill keeps what fits its budget: here the first chunks of q_a, compressed_kv and o_proj
    (3 x 80 bytes), not o_proj's second, so chunks 0 and 1 run again up to o_proj once its range grew
    in chunk 2 (q_a's too, made on the way)."""
    made_spill = spill_module.Spill
    monkeypatch.setattr(prefill, "Spill", lambda: made_spill(budget=3 * CHUNK * WIDTH * 4))
    shown, made = run(widen=False)
    assert_figures_of(shown["self_attn.o_proj"], whole("self_attn.o_proj"))
    assert made[20:] == made[:10]  # chunks 0 and 1 once more, whole
