"""A prefill run a chunk of positions at a time (stepper.prefill) shows every tensor once, over
every position, with exactly the figures (statistics, histogram bins, corners) of the whole tensor
made by running the same chunks one after the other with the cache; that tensor equals the whole
prompt's run to float32 round-off, and so do the cache and the decode steps after it.

(The figures cannot equal the whole prompt's run to the bit: a product of 8 rows and one of 37 round
differently, so the values themselves differ by round-off.)"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from stepper import catalog, prefill
from stepper.kernels import attention as kernels
from stepper.model import KVCache, Transformer
from stepper.model.stack import seeded_input
from stepper.seams.trace import Emitter, Filter, Recorder
from stepper.session import RunSpec, execute, fill_cache, masked_future, prepare, run, step_attn
from stepper.tensors.chunked import Chunked
from stepper.tensors.statistics import BINS
from stepper.tensors.tiled import Tiled
from stepper.views import summary
from stepper.weights.names import EMBED

# What the whole prompt's tensor holds past the positions a chunk attends (written out here, not read from prefill)
MASKED = {"self_attn.attn_scores": -np.inf, "self_attn.attn_weights": 0.0, "self_attn.indexer.index_scores": -np.inf,
          "self_attn.indexer.mask": -np.inf, "self_attn.indexer.topk_idx": -1,
          "self_attn.indexer.exact_index_scores": -np.inf, "self_attn.indexer.exact_topk_idx": -1}


def recorded(spec: RunSpec) -> dict[str, object]:
    recorder = Recorder()
    run(spec, [recorder])
    return recorder.tensors()


def one_by_one(spec: RunSpec, chunk: int) -> dict[str, np.ndarray]:
    """The prefill's tensors from a run of consecutive chunks with the cache, put together by hand:
    along T (or N), rows widened with the masked future, tensors over S alone from the last chunk."""
    plan = prepare(spec)
    model, cache, parts = Transformer(plan.weights,
                                      index_scoring=spec.index_scoring), KVCache(plan.config.num_hidden_layers), {}
    if spec.cache_len:
        fill_cache(plan, model, cache)
    ids, attn = np.array([plan.prompt]), step_attn(spec, 0)
    for start in range(0, ids.shape[1], chunk):
        span = slice(start, min(start + chunk, ids.shape[1]))
        positions = spec.start_pos + spec.cache_len + np.arange(span.start, span.stop)
        recorder = Recorder()
        emit = Emitter([recorder])
        if plan.alone:
            model.layer(spec.layer, model.embed(ids[:, span]), model.rope(positions, emit), cache, emit, attn)
        else:
            model.forward(ids[:, span], positions, emit, cache, attn=attn)
        for e in recorder.events:
            parts.setdefault(e.name, (e.key, []))[1].append(np.asarray(e.array))
    return {name: put_together(key, pieces) for name, (key, pieces) in parts.items()}


def put_together(key: str, pieces: list[np.ndarray]) -> np.ndarray:
    dims = catalog.load().entry(key)["dims"]
    along = [i for i, d in enumerate(dims) if d in ("T", "N")]
    if not along:
        return pieces[-1]
    wide = [i for i, d in enumerate(dims) if d in ("S", "Ki")]
    if wide:
        width = pieces[-1].shape[wide[0]]
        pieces = [np.concatenate([p, np.full((*p.shape[:-1], width - p.shape[-1]), MASKED[key], p.dtype)], axis=-1)
                  for p in pieces]
    return np.concatenate(pieces, axis=along[0])


def assert_same_figures(shown, whole: np.ndarray, corners_to_round_off: bool = False) -> None:
    assert tuple(shown.shape) == whole.shape and shown.dtype == whole.dtype
    assert summary.stats(shown) == summary.stats(whole)
    assert summary.histogram(shown) == summary.histogram(whole)
    if corners_to_round_off:  # a Tiled's corner rows are made alone, its blocks many rows at a time
        np.testing.assert_allclose(summary.corners(shown), summary.corners(whole), rtol=1e-6)
    else:
        assert summary.corners(shown) == summary.corners(whole)


def assert_round_off(a: np.ndarray, b: np.ndarray, name: str) -> None:
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, name
    assert np.array_equal(np.isfinite(a),
                          np.isfinite(b)) and np.array_equal(a[~np.isfinite(a)], b[~np.isfinite(b)]), name
    if a.dtype.kind in "iub":
        assert np.array_equal(a, b), name
    else:
        np.testing.assert_allclose(a[np.isfinite(a)], b[np.isfinite(b)], rtol=1e-4, atol=2e-5, err_msg=name)


CASES = [
    pytest.param(RunSpec(model="tiny", prompt_len=13, decode=2), 8, id="tiny-model-naive-then-absorbed-decode"),
    pytest.param(RunSpec(model="tiny", layer=1, prompt_len=17, attn="absorb", start_pos=5000), 6,
                 id="tiny-lone-layer-absorbed-past-4096"),
    pytest.param(RunSpec(model="tiny-v32", layer=1, prompt_len=11, attn="naive"), 3, id="indexer-lone-layer"),
    pytest.param(RunSpec(model="tiny", layer=0, prompt_len=9, cache_len=20, decode=1, weight_cache_mb=64), 4,
                 id="after-a-synthetic-cache-with-a-weight-cache"),
    pytest.param(RunSpec(model="tiny-v32", prompt_len=10, attn="absorb", decode=1), 6, id="indexer-model-absorbed"),
    pytest.param(RunSpec(model="tiny-v32", layer=0, prompt_len=8, index_scoring="fp8"), 2, id="indexer-fp8-scoring"),
]


@pytest.mark.parametrize(("spec", "chunk"), CASES)
def test_a_chunked_prefill_shows_the_figures_of_the_chunks_put_together_and_the_whole_runs_values(spec, chunk):
    whole = recorded(spec)
    chunked = recorded(RunSpec(**{**spec.__dict__, "chunk": chunk}))
    assert list(chunked) == list(whole)  # one tensor per name, in the whole run's order
    together = one_by_one(RunSpec(**{**spec.__dict__, "decode": 0,
                                     "weight_cache_mb": 0}), chunk)  # the weights as stored
    prefix = "prefill." if spec.decode else ""
    for name, tensor in chunked.items():
        if not name.startswith("decode"):
            assert_same_figures(tensor, together[name.removeprefix(prefix)])
        assert_round_off(together.get(name.removeprefix(prefix), tensor), whole[name], name)
    assert any(isinstance(t, Chunked) for t in chunked.values())


def test_the_widened_rows_and_the_kept_positions_past_a_short_chunk():
    spec = RunSpec(model="tiny-v32", layer=0, prompt_len=7, attn="naive", chunk=3)
    shown = recorded(spec)
    weights = np.asarray(shown["layers.0.self_attn.attn_weights"])
    idx = np.asarray(shown["layers.0.self_attn.indexer.topk_idx"])
    assert weights.shape == (1, 4, 7, 7) and idx.shape == (1, 7, 4)
    assert np.all(np.triu(weights[0], 1) == 0) and np.allclose(weights.sum(-1), 1, atol=1e-6)
    assert idx[0, 0].tolist() == [0, -1, -1, -1] and idx[0, 2].tolist()[3] == -1  # chunk 0's 3 positions keep 3 at most
    assert summary.corners(shown["layers.0.self_attn.attn_scores"])[0][1:] == [-np.inf, -np.inf]


def test_attention_made_in_tiles_inside_the_chunks(monkeypatch):
    monkeypatch.setattr(kernels, "WHOLE_SCORES", 64)  # every chunk's scores are made a tile at a time
    spec = RunSpec(model="tiny", layer=0, prompt_len=21, attn="naive")
    whole = recorded(spec)
    made, make = [], Tiled.__init__

    def noted(tiled, shape, *rest):
        made.append(tuple(shape))
        make(tiled, shape, *rest)
    monkeypatch.setattr(Tiled, "__init__", noted)
    shown = recorded(RunSpec(**{**spec.__dict__, "chunk": 5}))
    assert isinstance(shown["layers.0.self_attn.attn_scores"], Chunked)
    for name in ("layers.0.self_attn.attn_scores", "layers.0.self_attn.attn_weights"):
        assert_same_figures(shown[name], np.asarray(shown[name]),
                            corners_to_round_off=True)  # the figures of its replayed chunks, put together
        assert_round_off(np.asarray(shown[name]), np.asarray(whole[name]), name)
    # each chunk's scores and weights made a tile at a time, over at most 5 queries, never the whole prompt's 21
    assert (1, 4, 5, 21) in made and {shape[2] for shape in made} <= {1, 5}, made


def test_the_cache_after_a_chunked_prefill_equals_the_whole_prompts():
    plan = prepare(RunSpec(model="tiny-v32", prompt_len=13, attn="naive"))
    model, ids = Transformer(plan.weights), np.array([plan.prompt])
    whole, chunked = KVCache(3), KVCache(3)
    model.forward(ids, np.arange(13), Emitter(), whole, attn="naive")
    logits = prefill.in_chunks(lambda span, cache, emit: model.forward(ids[:, span], np.arange(13)[span], emit, cache,
                                                                       attn="naive"),
                               13, 9, chunked, Emitter([lambda e: None]), masked_future(plan, "naive"))
    assert logits.shape == (1, 4, plan.config.vocab_size)  # the last chunk's: 13 = 9 + 4
    for a, b in zip(whole.layers, chunked.layers):
        for field in ("latent", "k_pe", "key_states", "value_states", "index_keys"):
            np.testing.assert_allclose(getattr(b, field), getattr(a, field), rtol=1e-5, atol=1e-5)


def test_only_the_names_a_view_wants_are_gathered():
    seen = Recorder()
    plan = prepare(RunSpec(model="tiny", layer=2, prompt_len=9, chunk=4))
    execute(plan, [Filter(lambda e: e.name.endswith("compressed_kv"), [seen])])
    assert [e.name for e in seen.events] == ["layers.2.self_attn.compressed_kv"]
    assert isinstance(seen.events[0].array, Chunked) and seen.events[0].array.shape == (1, 9, 128)
    figures = seen.events[0].array.figures
    assert figures.bins.view(BINS)[0].sum() == figures.stats.finite == 9 * 128


def test_a_chunked_tensor_is_made_alone_when_read_unless_its_holder_keeps_it_then_with_the_others_once(monkeypatch):
    """A sink that lets each tensor go once read (a dump) replays the chunks per tensor, holding one;
    tensors a holder keeps (a stepper.run's) are made together by one replay, and kept."""
    seen = Recorder()
    plan = prepare(RunSpec(model="tiny", layer=2, prompt_len=9, chunk=4))
    execute(plan, [Filter(lambda e: e.name.endswith(("compressed_kv", "k_pe")), [seen])])
    kv, k_pe = (e.array for e in seen.events)
    replayed = []
    replay = prefill.Replay.run
    monkeypatch.setattr(prefill.Replay, "run", lambda self, k, sinks: replayed.append(k) or replay(self, k, sinks))
    assert kv.cost == f"reading it replays the prefill's 3 chunks for it alone ({kv.nbytes / 2**20:,.1f} MiB, not kept)"
    alone = np.asarray(kv)
    assert np.array_equal(np.asarray(kv), alone) and replayed == [0, 1, 2, 0, 1, 2]
    k_pe.keep_when_read()
    kv.keep_when_read()
    assert np.array_equal(np.asarray(kv), alone) and np.asarray(k_pe).shape == k_pe.shape and replayed[6:] == [0, 1, 2]
    assert k_pe.cost == kv.cost == "held since a tensor of its run was read (no cost)"


@pytest.mark.parametrize(("first", "length"), [(0, 7), (0, 1024), (0, 2500), (1020, 8), (1024, 1024), (300, 1800)])
def test_a_lone_layers_seeded_input_at_any_span_is_the_whole_prompts_rows(first, length):
    whole = seeded_input(5, 0, 0, 4000, (6,))
    assert np.array_equal(seeded_input(5, 0, first, length, (6,)), whole[:, first:first + length])
    # the first 1024 positions: one stream of the step's seed, drawn row after row
    expected = np.random.default_rng([5, 3, 0]).standard_normal((1, 1024, 6), dtype=np.float32)
    assert np.array_equal(whole[:, :1024], expected)
    assert not np.array_equal(whole[:, 1024:1030], expected[:, :6])  # the next block its own stream


class WithoutEmbedding:
    """A checkpoint's weights without the embedding table: a lone layer runs on seeded vectors."""

    def __init__(self, inner):
        self.inner = inner

    def has(self, name: str) -> bool:
        return name != EMBED and self.inner.has(name)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_chunked_lone_layer_makes_its_input_a_chunk_at_a_time(monkeypatch):
    """Without an embedding table (seeded rows, blocks of 1024 crossed inside the last chunk) and with
    one, the layer's input equals the whole prompt's, and no call makes more than a chunk of it."""
    made, make = [], Transformer.lone_input
    monkeypatch.setattr(Transformer, "lone_input", lambda self, ids, *rest: made.append(ids.shape[1]) or make(self, ids,
                                                                                                                 *rest))
    for weights in (lambda plan: plan.weights, lambda plan: WithoutEmbedding(plan.weights)):
        spec = RunSpec(model="tiny", layer=1, prompt_len=1100, attn="absorb")
        whole, chunked = Recorder(), Recorder()
        execute(replace(prepare(spec), weights=weights(prepare(spec))),
                [Filter(lambda e: e.name.endswith(("hidden_states", "compressed_kv")), [whole])])
        made.clear()
        plan = prepare(replace(spec, chunk=300))
        execute(replace(plan, weights=weights(plan)),
                [Filter(lambda e: e.name.endswith(("hidden_states", "compressed_kv")), [chunked])])
        assert made == [300, 300, 300, 200]
        for name, tensor in whole.tensors().items():
            assert_round_off(np.asarray(chunked.tensors()[name]), np.asarray(tensor), name)
        assert np.array_equal(np.asarray(chunked.tensors()["layers.1.hidden_states"]),
                              np.asarray(whole.tensors()["layers.1.hidden_states"]))
