"""The attention kernels against the readable lines they stand for (model.attention): attention
over tiles with the online softmax equals the whole-matrix softmax to float32 round-off, for
both paths' operands, prefill and decode, the causal edge inside and across tiles, T and S not
multiples of the tiles, a cache of more than 4096 positions, and an extra mask; with attention
sink logits too, against transformers' gpt-oss lines."""

import gc
import weakref

import numpy as np
import pytest

from stepper.kernels import activations, attention, parallel
from stepper.model.attention import attention_weights, held, shown
from stepper.seams.trace import Emitter
from stepper.tensors.tiled import Tiled

SCALE = 0.3


def random(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


@pytest.fixture
def small_tiles(monkeypatch):
    monkeypatch.setattr(parallel, "cores", lambda: 2)  # the tiles run on two threads even on one core
    monkeypatch.setattr(attention, "TILE_SCORES", 2 * 4 * 7)  # 2 heads x 4 queries x 7 keys
    monkeypatch.setattr(attention, "KEY_TILE", 7)
    monkeypatch.setattr(attention, "QUERY_TILE", 4)


def whole_naive(query, keys, values, mask=None):
    """model.attention's lines: the whole scores, the masked softmax, the weights times the values."""
    weights = attention_weights(np.matmul(query, keys.swapaxes(-1, -2)), SCALE, Emitter(), mask)
    return np.matmul(weights, values), weights


def test_shared_matmul_is_every_head_times_the_shared_matrix():
    rng = np.random.default_rng(1)
    for B, H, T, S in ((1, 64, 1, 37), (2, 5, 3, 9)):
        x, shared = random(rng, B, H, T, 24), random(rng, B, 24, S)  # [B, H, T, kv_lora], [B, kv_lora, S]
        fast = attention.shared_matmul(x, shared)
        assert fast.shape == (B, H, T, S)
        np.testing.assert_allclose(fast, np.matmul(x, shared[:, None]), rtol=1e-5, atol=1e-5)


def test_tiles_hold_about_the_budget_and_give_every_core_work(small_tiles):
    assert attention.tiles(1, 2, 20, 20) == (2, 4, 7)  # 56 scores: both heads' 4 queries x 7 keys
    assert attention.tiles(1, 4, 1, 100) == (2, 1, 28)  # a decode step: heads split for two cores, keys widened
    assert attention.whole_fits(1, 4, 1024, 1024) and not attention.whole_fits(1, 64, 4096, 4096)


@pytest.mark.parametrize("B, H, T, S", [(1, 2, 13, 13), (2, 3, 9, 9), (1, 4, 1, 23), (1, 2, 5, 4100), (1, 3, 11, 30)])
def test_naive_in_tiles_equals_the_whole_matrix(B, H, T, S, small_tiles):
    rng = np.random.default_rng(2)
    query, keys, values = random(rng, B, H, T, 8), random(rng, B, H, S, 8), random(rng, B, H, S, 5)
    want, want_weights = whole_naive(query, keys, values)
    ops = attention.Operands([query], [keys], values, SCALE)
    out = attention.attend(ops)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-6)
    every_key = slice(0, S)
    softmaxed = attention.Softmaxed(ops)
    np.testing.assert_allclose(softmaxed.weights(slice(0, H), slice(0, T)), want_weights, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(softmaxed.output(), want, rtol=1e-5, atol=2e-6)  # made with the weights
    scores = ops.scores(slice(0, H), slice(0, T), every_key)
    assert np.array_equal(np.isinf(scores), want_weights == 0)  # the causal edge where the reference has it


@pytest.mark.parametrize("B, H, T, S", [(1, 6, 10, 10), (2, 5, 1, 33), (1, 4, 6, 4101)])
def test_absorbed_in_tiles_equals_the_whole_matrix(B, H, T, S, small_tiles):
    rng = np.random.default_rng(3)
    q_latent, q_pe = random(rng, B, H, T, 16), random(rng, B, H, T, 4)
    latents, k_pe = random(rng, B, S, 16), random(rng, B, 1, S, 4)
    scores = (attention.shared_matmul(q_latent, latents.swapaxes(-1, -2))
              + attention.shared_matmul(q_pe, k_pe[:, 0].swapaxes(-1, -2)))
    want = attention.shared_matmul(attention_weights(scores, SCALE, Emitter()), latents)  # [B, H, T, kv_lora]
    out = attention.attend(attention.Operands([q_latent, q_pe], [latents[:, None], k_pe], latents[:, None], SCALE))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("kind", ["bool", "additive", "per head"])
def test_an_extra_mask_merges_with_the_causal_one(kind, small_tiles):
    rng = np.random.default_rng(4)
    B, H, T, S = 1, 3, 9, 20
    query, keys, values = random(rng, B, H, T, 8), random(rng, B, H, S, 8), random(rng, B, H, S, 5)
    kept = rng.random((T, S)) < 0.6
    kept[:, 0] = True  # every query keeps a key
    mask = {"bool": kept, "additive": np.where(kept, random(rng, T, S), -np.inf).astype(np.float32),
            "per head": np.where(rng.random((B, H, T, S)) < 0.6, 0, -np.inf).astype(np.float32)}[kind]
    if kind == "per head":
        mask[..., 0] = 0
    want, _ = whole_naive(query, keys, values, mask)
    out = attention.attend(attention.Operands([query], [keys], values, SCALE, mask))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-6)


def test_a_row_with_every_key_masked_is_nan_as_in_the_softmax(small_tiles):
    rng = np.random.default_rng(5)
    query, keys, values = random(rng, 1, 2, 6, 8), random(rng, 1, 2, 6, 8), random(rng, 1, 2, 6, 5)
    mask = np.ones((6, 6), bool)
    mask[3] = False
    want, _ = whole_naive(query, keys, values, mask)
    ops = attention.Operands([query], [keys], values, SCALE, mask)
    out, softmaxed = attention.attend(ops), attention.Softmaxed(ops)
    weights = softmaxed.weights(slice(0, 2), slice(0, 6))
    assert np.isnan(want[:, :, 3]).all() and np.isnan(out[:, :, 3]).all() and np.isnan(weights[:, :, 3]).all()
    assert np.isnan(softmaxed.output()[:, :, 3]).all()
    np.testing.assert_allclose(np.delete(out, 3, axis=2), np.delete(want, 3, axis=2), rtol=1e-5, atol=2e-6)


def test_rows_of_scores_are_made_once_for_the_scores_and_the_weights_and_let_go_by_bytes(monkeypatch):
    rng = np.random.default_rng(6)
    B, H, T, S = 1, 4, 3, 50
    query, keys, values = random(rng, B, H, T, 8), random(rng, B, H, S, 8), random(rng, B, H, S, 5)
    ops = attention.Operands([query], [keys], values, SCALE)
    made = []
    scores = attention.Operands.scores
    monkeypatch.setattr(attention.Operands, "scores", lambda self, *a: made.append(a) or scores(self, *a))
    heads, queries = slice(0, 2), slice(0, T)
    rows = ops.rows(heads, queries)
    again, weights = ops.rows(heads, queries), attention.Softmaxed(ops).weights(heads, queries)
    assert len(made) == 1 and again is rows and not rows.flags.writeable  # one product; nobody changes it in place
    _, want = whole_naive(query, keys, values)
    np.testing.assert_allclose(weights, want[:, heads], rtol=1e-5, atol=1e-7)
    assert (rows == ops.rows(heads, queries)).all() and len(made) == 1
    monkeypatch.setattr(attention, "KEPT_ROW_BYTES", rows.nbytes)  # room for one: the oldest is let go
    ops.rows(slice(2, 4), queries)
    ops.rows(heads, queries)
    assert len(made) == 3
    kept = weakref.ref(ops)
    del ops, rows, again
    gc.collect()
    assert kept() is None  # the rows do not keep their operands (and the cache they read) alive


def assert_same_scores(got, want):
    """-inf in the same places; the rest within float32's rounding of a 20-term sum."""
    assert got.shape == want.shape and np.array_equal(np.isneginf(got), np.isneginf(want))
    seen = np.isfinite(want)
    np.testing.assert_allclose(got[seen], want[seen], rtol=0, atol=2e-6 * np.abs(want[seen]).max())


def test_rows_of_scores_made_on_every_core_equal_one_product(monkeypatch):
    """every_core_scores: the queries cut into blocks shared out across the cores, each block's
    product stopping at its last key; the same values up to the order BLAS sums in (shorter
    products may take other kernels: OpenBLAS's on an AMD EPYC do), -inf past the causal edge."""
    rng = np.random.default_rng(9)
    queries = [random(rng, 1, 3, 50, 16), random(rng, 1, 3, 50, 4)]
    keys = [random(rng, 1, 1, 70, 16), random(rng, 1, 1, 70, 4)]
    ops = attention.Operands(queries, keys, keys[0], SCALE)
    monkeypatch.setattr(attention, "SHARED_ROWS", 8)
    monkeypatch.setattr(attention, "FEWEST_SHARED_ROWS", 4)
    monkeypatch.setattr(parallel, "cores", lambda: 2)
    made = []
    scores = attention.Operands.scores
    monkeypatch.setattr(attention.Operands, "scores", lambda self, *a: made.append(a[1:]) or scores(self, *a))
    shared = attention.every_core_scores(ops, slice(1, 3), slice(5, 45))
    assert sorted((q.start, q.stop, k.stop) for q, k in made) == [(s, s + 8, 20 + s + 8) for s in range(5, 45, 8)]
    assert_same_scores(shared, scores(ops, slice(1, 3), slice(5, 45), slice(0, 70)))
    made.clear()
    assert_same_scores(attention.every_core_scores(ops, slice(0, 3), slice(40, 46)),
                       scores(ops, slice(0, 3), slice(40, 46), slice(0, 70)))
    assert made == [(slice(40, 46), slice(0, 70))]  # six rows: one product over every key


class Recorder:
    def __init__(self):
        self.events = {}

    def __call__(self, event):
        self.events[event.name] = event.array


def test_model_held_is_the_whole_array_lines_bit_for_bit():
    """model.attention.held over Operands: the naive lines (q @ k^T, weights @ v) and the absorbed
    ones (every head times the shared latents and rotary keys), the same bits as written out."""
    rng = np.random.default_rng(7)
    query, keys, values = random(rng, 1, 3, 4, 8), random(rng, 1, 3, 9, 8), random(rng, 1, 3, 9, 5)
    want, _ = whole_naive(query, keys, values)
    np.testing.assert_array_equal(held(attention.Operands([query], [keys], values, SCALE), Emitter()), want)
    q_latent, q_pe, latents, k_pe = random(rng, 2, 5, 3, 16), random(rng, 2, 5, 3, 4), random(rng, 2, 9, 16), \
        random(rng, 2, 1, 9, 4)
    scores = (attention.shared_matmul(q_latent, latents.swapaxes(-1, -2))
              + attention.shared_matmul(q_pe, k_pe[:, 0].swapaxes(-1, -2)))
    want = attention.shared_matmul(attention_weights(scores, SCALE, Emitter()), latents)
    ops = attention.Operands([q_latent, q_pe], [latents[:, None], k_pe], latents[:, None], SCALE)
    np.testing.assert_array_equal(held(ops, Emitter()), want)


@pytest.mark.parametrize("S, tiled", [(9, False), (4100, True)])
def test_held_or_tiled_runs_the_whole_lines_while_they_fit_and_tiles_beyond(S, tiled, small_tiles, monkeypatch):
    monkeypatch.setattr(attention, "WHOLE_SCORES", 2 * 3 * 9)  # [1, 2, 3, 9] fits, [1, 2, 3, 4100] does not
    rng = np.random.default_rng(8)
    query, keys, values = random(rng, 1, 2, 3, 8), random(rng, 1, 2, S, 8), random(rng, 1, 2, S, 5)
    ops, sink, calls = attention.Operands([query], [keys], values, SCALE), Recorder(), []
    emit = Emitter([sink])
    out = attention.held_or_tiled(ops, lambda: calls.append(1) or held(ops, emit), emit, shown)
    want, want_weights = whole_naive(query, keys, values)
    assert calls == ([] if tiled else [1])
    shown_weights = sink.events["self_attn.attn_weights"]
    assert (isinstance(shown_weights, Tiled) == tiled
            and isinstance(sink.events["self_attn.attn_scores"], Tiled) == tiled)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(np.asarray(shown_weights), want_weights, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("looks", [True, False])
def test_a_sink_that_looks_at_the_weights_has_the_output_made_with_them(looks, small_tiles, monkeypatch):
    """held_or_tiled, the scores too many to hold: a sink that reads every tile of the weights as
    they come (a chunked prefill's) has the output made with them, no online softmax run; one that
    keeps them for later (a recorder) has it made by `attend`, and its later reads make none."""
    monkeypatch.setattr(attention, "WHOLE_SCORES", 1)
    rng = np.random.default_rng(10)
    query, keys, values = random(rng, 1, 3, 7, 8), random(rng, 1, 3, 11, 8), random(rng, 1, 3, 11, 5)
    ops, attends, kept = attention.Operands([query], [keys], values, SCALE), [], {}
    attend = attention.attend
    monkeypatch.setattr(attention, "attend", lambda ops: attends.append(1) or attend(ops))
    weighted = attention.weighted
    products = []
    monkeypatch.setattr(attention, "weighted", lambda *a: products.append(1) or weighted(*a))

    def sink(event):
        kept[event.name] = np.asarray(event.array) if looks else event.array
    out = attention.held_or_tiled(ops, lambda: None, Emitter([sink]), shown)
    want, want_weights = whole_naive(query, keys, values)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-6)
    assert attends == ([] if looks else [1])
    made = len(products)
    np.testing.assert_allclose(np.asarray(kept["self_attn.attn_weights"]), want_weights, rtol=1e-5, atol=1e-7)
    assert len(products) == made  # reading the weights again (or late) makes no output


# Attention sink logits (gpt-oss, Hy4): one more logit per head in every row's softmax, its
# column dropped. Not the sinks above, which listen to emitted tensors.

def causal_scores(scores, mask=None):
    """The whole scores scaled, the future and what `mask` drops (False, or -inf added) masked."""
    T, S = scores.shape[-2:]
    future = np.arange(S)[None, :] > (S - T) + np.arange(T)[:, None]  # [T, S]
    scores = np.where(future, -np.inf, scores * np.float32(SCALE))
    if mask is not None:
        scores = np.where(mask, scores, -np.inf) if mask.dtype == np.bool_ else scores + mask
    return scores


def weights_with_sink_logits(scores, sinks):
    """transformers' gpt_oss eager_attention_forward, in float64: the sink column appended to the
    scaled, masked scores [B, H, T, S], less the row's maximum, the softmax, the column dropped."""
    sink_column = np.broadcast_to(sinks.reshape(1, -1, 1, 1), (*scores.shape[:-1], 1))
    combined = np.concatenate([scores, sink_column], axis=-1).astype(np.float64)
    combined -= combined.max(axis=-1, keepdims=True)
    probs = np.exp(combined) / np.exp(combined).sum(axis=-1, keepdims=True)
    return probs[..., :-1]


def naive_with_sink_logits(query, keys, values, sinks, mask=None):
    """The reference output and weights of a naive attention with sink logits."""
    weights = weights_with_sink_logits(causal_scores(np.matmul(query, keys.swapaxes(-1, -2)), mask), sinks)
    return np.matmul(weights, values), weights


def naive_operands(rng, B, H, T, S, sinks_scale=3.0):
    """Random naive operands and sink logits."""
    query, keys, values = random(rng, B, H, T, 8), random(rng, B, H, S, 8), random(rng, B, H, S, 5)
    return query, keys, values, random(rng, H) * np.float32(sinks_scale)


@pytest.mark.parametrize("B, H, T, S", [(1, 2, 13, 13), (2, 3, 9, 9), (1, 4, 1, 23), (1, 2, 5, 4100)])
def test_attention_sink_logits_in_tiles_equal_the_whole_matrix_naive(B, H, T, S, small_tiles):
    query, keys, values, sinks = naive_operands(np.random.default_rng(11), B, H, T, S)
    want, want_weights = naive_with_sink_logits(query, keys, values, sinks)
    ops = attention.Operands([query], [keys], values, SCALE, sinks=sinks)
    np.testing.assert_allclose(attention.attend(ops), want, rtol=1e-5, atol=2e-6)
    softmaxed = attention.Softmaxed(ops)
    weights = softmaxed.weights(slice(0, H), slice(0, T))
    np.testing.assert_allclose(weights, want_weights, rtol=1e-5, atol=1e-7)
    assert (weights.sum(axis=-1) < 1).all()  # the sink's share dropped
    np.testing.assert_allclose(softmaxed.output(), want, rtol=1e-5, atol=2e-6)  # made with the weights
    whole = causal_scores(np.matmul(query, keys.swapaxes(-1, -2))).astype(np.float32)  # model.attention.held's
    np.testing.assert_allclose(ops.weights_of(whole), want_weights, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("B, H, T, S", [(1, 6, 10, 10), (2, 5, 1, 33), (1, 4, 6, 4101)])
def test_attention_sink_logits_in_tiles_equal_the_whole_matrix_absorbed(B, H, T, S, small_tiles):
    rng = np.random.default_rng(12)
    q_latent, q_pe = random(rng, B, H, T, 16), random(rng, B, H, T, 4)
    latents, k_pe = random(rng, B, 1, S, 16), random(rng, B, 1, S, 4)
    sinks = random(rng, H) * np.float32(3)
    scores = np.matmul(q_latent, latents.swapaxes(-1, -2)) + np.matmul(q_pe, k_pe.swapaxes(-1, -2))
    want_weights = weights_with_sink_logits(causal_scores(scores), sinks)
    want = np.matmul(want_weights, latents)  # [B, H, T, kv_lora]
    ops = attention.Operands([q_latent, q_pe], [latents, k_pe], latents, SCALE, sinks=sinks)
    np.testing.assert_allclose(attention.attend(ops), want, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(attention.Softmaxed(ops).weights(slice(0, H), slice(0, T)), want_weights,
                               rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_attention_sink_logits_with_an_extra_mask(kind, small_tiles):
    rng = np.random.default_rng(13)
    B, H, T, S = 1, 3, 9, 20
    query, keys, values, sinks = naive_operands(rng, B, H, T, S)
    kept = rng.random((T, S)) < 0.6
    kept[:, 0] = True
    mask = kept if kind == "bool" else np.where(kept, random(rng, T, S), -np.inf).astype(np.float32)
    want, want_weights = naive_with_sink_logits(query, keys, values, sinks, mask)
    ops = attention.Operands([query], [keys], values, SCALE, mask, sinks=sinks)
    np.testing.assert_allclose(attention.attend(ops), want, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(attention.Softmaxed(ops).weights(slice(0, H), slice(0, T)), want_weights,
                               rtol=1e-5, atol=1e-7)


def test_attention_sink_logits_take_a_row_with_every_key_masked_whole(small_tiles):
    """The sink is the one logit left: the row's weights are all 0 and its output 0, not NaN."""
    query, keys, values, sinks = naive_operands(np.random.default_rng(14), 1, 2, 6, 6)
    mask = np.ones((6, 6), bool)
    mask[3] = False
    want, _ = naive_with_sink_logits(query, keys, values, sinks, mask)
    ops = attention.Operands([query], [keys], values, SCALE, mask, sinks=sinks)
    out, softmaxed = attention.attend(ops), attention.Softmaxed(ops)
    weights = softmaxed.weights(slice(0, 2), slice(0, 6))
    assert (want[:, :, 3] == 0).all() and (out[:, :, 3] == 0).all() and (weights[:, :, 3] == 0).all()
    assert (softmaxed.output()[:, :, 3] == 0).all()
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-6)


def test_an_attention_sink_logit_as_large_as_two_equal_scores_takes_a_third():
    """One query, two keys of score 0 and a sink of 0: exp(0) / (exp(0) + exp(0) + exp(0)) each."""
    query, keys = np.zeros((1, 1, 1, 8), np.float32), random(np.random.default_rng(15), 1, 1, 2, 8)
    values = np.array([[[[3.0, 0.0], [0.0, 6.0]]]], np.float32)  # [B, H, S, v_head]
    ops = attention.Operands([query], [keys], values, SCALE, sinks=np.zeros(1, np.float32))
    third = np.float32(1) / np.float32(3)
    np.testing.assert_array_equal(attention.Softmaxed(ops).weights(slice(0, 1), slice(0, 1)), [[[[third, third]]]])
    np.testing.assert_allclose(attention.attend(ops), [[[[1.0, 2.0]]]], rtol=1e-6)


def test_attention_sink_logits_far_above_the_scores_take_everything_and_far_below_nothing(small_tiles):
    query, keys, values, _ = naive_operands(np.random.default_rng(16), 1, 2, 5, 30)
    ops = attention.Operands([query], [keys], values, SCALE)
    sunk = attention.Operands([query], [keys], values, SCALE, sinks=np.full(2, 80, np.float32))
    assert np.abs(attention.attend(sunk)).max() < 1e-25
    without = attention.attend(ops), attention.Softmaxed(ops).weights(slice(0, 2), slice(0, 5))
    for far_below in (-np.inf, -1e4):
        ops = attention.Operands([query], [keys], values, SCALE, sinks=np.full(2, far_below, np.float32))
        np.testing.assert_array_equal(attention.attend(ops), without[0])
        np.testing.assert_array_equal(attention.Softmaxed(ops).weights(slice(0, 2), slice(0, 5)), without[1])


def test_without_attention_sink_logits_the_weights_are_the_softmax_bit_for_bit():
    """Operands.weights_of, sinks None: the readable lines' softmax, or the learner's, as before."""
    query, keys, values, _ = naive_operands(np.random.default_rng(17), 1, 2, 4, 9)
    ops = attention.Operands([query], [keys], values, SCALE)
    rows = ops.rows(slice(0, 2), slice(0, 4))
    np.testing.assert_array_equal(ops.weights_of(rows), activations.softmax(rows))
    learners = attention.Operands([query], [keys], values, SCALE, softmax=lambda x: x * 2)
    np.testing.assert_array_equal(learners.weights_of(rows), rows * 2)


def readable_softmax(x):
    """A learner's softmax of whole rows, as model.ops' docstring writes it."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("learners", [False, True])
def test_attention_sink_logits_in_weights_a_listener_looks_at(learners, small_tiles, monkeypatch):
    """held_or_tiled, the scores too many to hold, a listening emitter reading every tile of the
    weights: they and the output made with them have the sinks, with stepper's softmax or a
    learner's (the sink column appended to its rows, then dropped)."""
    monkeypatch.setattr(attention, "WHOLE_SCORES", 1)
    query, keys, values, sinks = naive_operands(np.random.default_rng(18), 1, 3, 7, 11)
    softmax = readable_softmax if learners else None
    ops, seen = attention.Operands([query], [keys], values, SCALE, softmax=softmax, sinks=sinks), {}

    def listener(event):
        seen[event.name] = np.asarray(event.array)
    out = attention.held_or_tiled(ops, lambda: None, Emitter([listener]), shown)
    want, want_weights = naive_with_sink_logits(query, keys, values, sinks)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(seen["self_attn.attn_weights"], want_weights, rtol=1e-5, atol=1e-7)
