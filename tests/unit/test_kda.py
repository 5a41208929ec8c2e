"""Kimi Delta Attention's pieces against hand-derived values and each other: the short conv, the
L2 norm's eps, one delta-rule step worked by hand, the chunked form against the token-by-token
recurrence (1,000 tokens, a nonzero initial state), and a decode step against a re-run."""

import gc

import numpy as np
import pytest

from stepper.errors import StepperError
from stepper.kernels.kda_chunked import chunked
from stepper.model import kda
from stepper.model.cache import SNAPSHOTS, KdaCache
from stepper.model.kda import gated_delta_rule, l2_normalise, short_conv
from stepper.model.options import LayerOptions
from stepper.seams.trace import Emitter, Recorder
from tests.helpers.kimi_linear import config, layer_weights

rng = np.random.default_rng(7)


def normal(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def delta_rule_inputs(B=1, H=2, T=1000, K=16, V=16):
    """Scaled unit queries, unit keys, gates of Kimi Linear's range (-exp(A_log) * softplus(.)), betas in (0, 1)."""
    q = l2_normalise(normal(B, H, T, K)) * np.float32(K**-0.5)
    k = l2_normalise(normal(B, H, T, K))
    v = normal(B, H, T, V)
    rate = np.exp(rng.uniform(0, np.log(16), (1, H, 1, 1)))
    g = (-rate * np.logaddexp(0, normal(B, H, T, K) - 3)).astype(np.float32)
    beta = (1 / (1 + np.exp(-normal(B, H, T)))).astype(np.float32)
    return q, k, v, g, beta


def rel(a, b):
    return float(np.max(np.abs(a.astype(np.float64) - b)) / np.max(np.abs(b)))


def test_short_conv_by_hand():
    # one channel, taps (1, 2, 3) with the last on the current input; inputs 1, 10, 100 after past (4, 5)
    weight = np.array([[[1, 2, 3]]], np.float32)  # [C, 1, W]
    past = np.array([[[4], [5]]], np.float32)  # [B, W-1, C]
    x = np.array([[[1], [10], [100]]], np.float32)  # [B, T, C]
    out, kept = short_conv(x, weight, past)
    # 4*1 + 5*2 + 1*3 = 17; 5*1 + 1*2 + 10*3 = 37; 1*1 + 10*2 + 100*3 = 321
    assert out[0, :, 0].tolist() == [17, 37, 321]
    assert kept[0, :, 0].tolist() == [10, 100]
    fresh, _ = short_conv(x, weight, None)  # zeros before the first input
    assert fresh[0, :, 0].tolist() == [3, 32, 321]


def test_l2_norm_keeps_eps_inside_the_root():
    x = np.array([3e-4, 4e-4], np.float32)  # |x|^2 = 2.5e-7, small next to eps = 1e-6
    expected = x / np.sqrt(np.float32(2.5e-7) + np.float32(1e-6))  # not x / max(|x|, eps), not x / (|x| + eps)
    np.testing.assert_allclose(l2_normalise(x), expected, rtol=1e-6)
    assert np.linalg.norm(l2_normalise(x)) == pytest.approx(np.sqrt(0.2), rel=1e-5)


def test_one_step_of_the_delta_rule_by_hand():
    # K = V = 2, one head: S0 = [[1, 0], [0, 2]], decay exp(g) = (0.5, 1), k = e1, beta = 0.5, v = (3, 3)
    state = np.array([[[[1, 0], [0, 2]]]], np.float32)
    g = np.log(np.array([0.5, 1], np.float32)).reshape(1, 1, 1, 2)
    k = np.array([1, 0], np.float32).reshape(1, 1, 1, 2)
    q = np.array([1, 1], np.float32).reshape(1, 1, 1, 2)
    v = np.array([3, 3], np.float32).reshape(1, 1, 1, 2)
    beta = np.array([0.5], np.float32).reshape(1, 1, 1)
    out, delta, after, _ = gated_delta_rule(q, k, v, g, beta, state)
    # decayed S = [[0.5, 0], [0, 2]]; S^T k = (0.5, 0); delta = 0.5 * ((3, 3) - (0.5, 0)) = (1.25, 1.5)
    # S = [[0.5 + 1.25, 1.5], [0, 2]] = [[1.75, 1.5], [0, 2]]; o = S^T q = (1.75, 3.5)
    np.testing.assert_allclose(delta[0, 0, 0], [1.25, 1.5], rtol=1e-6)
    np.testing.assert_allclose(after[0, 0], [[1.75, 1.5], [0, 2]], rtol=1e-6)
    np.testing.assert_allclose(out[0, 0, 0], [1.75, 3.5], rtol=1e-6)
    _, chunk_delta, chunk_after, _ = chunked(q, k, v, g, beta, state)
    np.testing.assert_allclose(chunk_after[0, 0], [[1.75, 1.5], [0, 2]], rtol=1e-6)
    np.testing.assert_allclose(chunk_delta[0, 0, 0], [1.25, 1.5], rtol=1e-6)


def test_chunked_equals_the_recurrence_on_1000_tokens_from_a_nonzero_state():
    q, k, v, g, beta = delta_rule_inputs()
    state = normal(1, 2, 16, 16)  # a state some earlier prompt left
    out, delta, last, per_token = gated_delta_rule(q, k, v, g, beta, state, keep_states=True)
    c_out, c_delta, c_last, per_chunk = chunked(q, k, v, g, beta, state, keep_states=True)
    assert rel(c_out, out) <= 1e-6
    assert rel(c_delta, delta) <= 1e-6
    assert rel(c_last, last) <= 1e-6
    ends = [63 + 64 * i for i in range(15)] + [999]  # 16 chunks: 15 of 64 tokens, the last of 40
    assert per_chunk.shape == (1, 2, 16, 16, 16)
    assert rel(per_chunk, per_token[:, :, ends]) <= 1e-6
    # both within round-off of the same recurrence in float64
    exact = gated_delta_rule(*(a.astype(np.float64) for a in (q, k, v, g, beta, state)))[0]
    assert rel(out, exact) <= 1e-6 and rel(c_out, exact) <= 1e-6
    assert np.abs(last - state).max() > 1  # the state moved: the comparison is not of zeros


def test_chunked_survives_channels_that_forget_fast():
    # g = -60 per token: exp(G) over a chunk underflows to 0 and exp(-G) would overflow; the
    # decays made through a reference position are two factors <= 1, never inf * 0
    q, k, v, g, beta = delta_rule_inputs(T=200)
    g[..., ::3] = -60.0
    state = normal(1, 2, 16, 16)
    with np.errstate(all="raise", under="ignore"):
        out, _, last, _ = chunked(q, k, v, g, beta, state)
    ref_out, _, ref_last, _ = gated_delta_rule(q, k, v, g, beta, state)
    assert np.isfinite(out).all() and rel(out, ref_out) <= 1e-6 and rel(last, ref_last) <= 1e-6


def kda_layer():
    cfg = config()
    return cfg, layer_weights(cfg, 0)


def kda_attention(x, w, cfg, cache, emit, form="chunked"):
    """The KDA part as its decoder layer calls it, with the delta rule's form chosen."""
    return kda.kda_attention(x, w, cache, LayerOptions(delta_rule=form), emit)


@pytest.mark.parametrize("form", ["recurrent", "chunked"])
def test_decode_steps_equal_a_rerun_of_the_longer_prompt(form):
    cfg, w = kda_layer()
    x = normal(1, 70, cfg.hidden_size)
    whole = kda_attention(x, w, cfg, KdaCache(), Emitter(), form)  # [B, 70, d]
    cache = KdaCache()
    parts = [kda_attention(x[:, :67], w, cfg, cache, Emitter(), form)]
    for t in range(67, 70):  # three decode steps, each carrying the conv inputs and S
        parts.append(kda_attention(x[:, t : t + 1], w, cfg, cache, Emitter(), form))
    assert rel(np.concatenate(parts, axis=1), whole) <= 1e-5
    assert cache.length == 70
    assert cache.conv["q"].shape == (1, cfg.short_conv_kernel_size - 1, 16)
    assert cache.nbytes() == 3 * 3 * 16 * 4 + 2 * 8 * 8 * 4  # conv inputs and S: the same at any length


def test_the_cache_as_it_was_when_a_call_began_is_kept():
    cfg, w = kda_layer()
    x = normal(1, 12, cfg.hidden_size)
    cache, outs = KdaCache(), []
    for span in (slice(0, 5), slice(5, 9), slice(9, 12)):
        outs.append(kda_attention(x[:, span], w, cfg, cache, Emitter()))
    again = cache.first(5)  # the second chunk replayed from where it began: bit for bit the same
    np.testing.assert_array_equal(kda_attention(x[:, 5:9], w, cfg, again, Emitter()), outs[1])
    assert again.length == 9 and np.array_equal(again.state, cache.first(9).state)
    assert cache.first(12).state is cache.state  # now: no copy of the arrays
    with pytest.raises(StepperError, match="after 7 positions was not kept"):
        cache.first(7)


def test_the_forms_emit_the_same_tensors():
    cfg, w = kda_layer()
    x = normal(1, 70, cfg.hidden_size)
    seen = {}
    for form in ("recurrent", "chunked"):
        recorder = Recorder()
        kda_attention(x, w, cfg, KdaCache(), Emitter([recorder]), form)
        seen[form] = {name: np.asarray(array) for name, array in recorder.tensors().items()}
    assert list(seen["recurrent"]) == list(seen["chunked"])  # the same names, in the same order
    per_token, per_chunk = seen["chunked"]["self_attn.state_per_token"], seen["chunked"]["self_attn.state_per_chunk"]
    assert per_token.shape == (1, 2, 70, 8, 8) and per_chunk.shape == (1, 2, 2, 8, 8)
    assert np.array_equal(per_chunk[:, :, 1], seen["chunked"]["self_attn.state"])
    assert rel(per_chunk, per_token[:, :, [63, 69]]) <= 1e-5  # the kernel's chunk states, the replayed writes'
    for name, array in seen["recurrent"].items():
        assert rel(seen["chunked"][name], array) <= 1e-5, name


def test_auto_runs_a_step_of_one_chunk_token_by_token_and_a_longer_one_in_chunks(monkeypatch):
    cfg, w = kda_layer()
    used = []
    monkeypatch.setattr(kda, "token_by_token", lambda *a: used.append("recurrent") or kda_token_by_token(*a))
    monkeypatch.setattr(kda, "in_chunks", lambda *a: used.append("chunked") or kda_in_chunks(*a))
    for T in (1, 64, 65):
        kda_attention(normal(1, T, cfg.hidden_size), w, cfg, KdaCache(), Emitter(), "auto")
    assert used == ["recurrent", "recurrent", "chunked"]


kda_token_by_token, kda_in_chunks = kda.token_by_token, kda.in_chunks


def test_states_of_every_token_are_made_only_for_a_sink_that_looks():
    cfg, w = kda_layer()

    class Picky(Recorder):
        def wants(self, event):
            return event.key == "self_attn.delta"

    picky = Picky()
    kda_attention(normal(1, 5, cfg.hidden_size), w, cfg, KdaCache(), Emitter([picky]), "recurrent")
    assert "self_attn.state_per_token" not in [e.key for e in picky.events]


def test_a_python_run_makes_the_states_of_every_token_only_when_it_keeps_them(monkeypatch):
    """stepper.run listed every name with a sink that looked at all of them, so a KDA layer's states
    after every token were made whatever keep= kept (at 2,048 positions of Kimi-Linear-48B, 4 GiB a
    layer). They are made when kept, equal to a run that keeps everything, and named in either."""
    import stepper

    made, replay = [], kda.replayed  # the positions of each layer's states made (the plan's own runs have 1 or 2)
    monkeypatch.setattr(kda, "replayed", lambda *args: made.append(args[0].shape[2]) or replay(*args))
    name = "layers.0.self_attn.state_per_token"
    lean = stepper.run("tiny-kimi-linear", layer=0, prompt_len=70, keep="layers.0.output")
    assert 70 not in made and name in lean.emitted
    with pytest.raises(KeyError, match="was emitted but not kept"):
        lean[name]
    kept = stepper.run("tiny-kimi-linear", layer=0, prompt_len=70, keep="*state_per_token")
    every = stepper.run("tiny-kimi-linear", layer=0, prompt_len=70)
    assert made.count(70) == 2 and kept.emitted == every.emitted == lean.emitted
    assert np.asarray(kept[name]).shape == (1, 4, 70, 32, 32)
    assert np.array_equal(np.asarray(kept[name]), np.asarray(every[name]))
    assert np.array_equal(np.asarray(lean["layers.0.output"]), np.asarray(every["layers.0.output"]))


def test_a_32768_position_prompt_runs_in_the_memory_of_a_16384_one():
    """Calls of 256 positions carry the conv inputs and S: the memory allocated at the peak
    (tracemalloc: NumPy's allocations) does not grow with the prompt, the state stays its size.
    Both prompts are past the SNAPSHOTS calls whose starting caches a KdaCache keeps (64 calls: a
    chunked prefill's replay asks for them), which a 4096-position prompt of 4 calls was not: its
    peak was 0.92x the 32768 one's alone, and in the full suite past the 1.1x this test allows."""
    import tracemalloc

    cfg, w = kda_layer()
    step = 256

    def peak(length: int) -> tuple[int, KdaCache]:
        cache = KdaCache()
        gc.collect()  # nothing of an earlier test's cyclic garbage counted in this one's peak
        tracemalloc.start()
        for start in range(0, length, step):
            x = np.random.default_rng(start).standard_normal((1, step, cfg.hidden_size), dtype=np.float32)
            kda_attention(x, w, cfg, cache, Emitter(), "chunked")
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top, cache

    assert 16384 // step >= SNAPSHOTS
    short, long = peak(16384), peak(32768)
    assert len(long[1].earlier) == len(short[1].earlier) == SNAPSHOTS
    assert long[1].length == 32768 and long[1].nbytes() == short[1].nbytes() == 3 * 3 * 16 * 4 + 2 * 8 * 8 * 4
    assert long[0] < 1.1 * short[0]  # the same peak: one call's tensors and the snapshots
    assert long[0] < 8 << 20  # a call's tensors at these sizes: a few MB, not the 32768 positions'


def test_a_learners_delta_rule_runs_in_place_of_the_chunked_form():
    from stepper.lessons.exercises import REFERENCES
    from stepper.seams.swap import swapped

    cfg, w = kda_layer()
    x = normal(1, 70, cfg.hidden_size)
    calls = []

    def learners(*args, **kwargs):
        calls.append(args[0].shape)
        return REFERENCES["gated_delta_rule"](*args, **kwargs)

    recorder = Recorder()
    with swapped({"gated_delta_rule": learners}):
        out = kda_attention(x, w, cfg, KdaCache(), Emitter([recorder]))  # the chunked form by default
    assert calls == [(1, 2, 70, 8)]
    assert "self_attn.state_per_token" in recorder.tensors()  # the token-by-token path's tensors
    assert rel(out, kda_attention(x, w, cfg, KdaCache(), Emitter())) <= 1e-5


def test_each_batch_row_has_its_own_state():
    cfg, w = kda_layer()
    x = normal(2, 70, cfg.hidden_size)
    both, cache = kda_attention(x, w, cfg, KdaCache(), Emitter()), KdaCache()
    alone = [kda_attention(x[b : b + 1], w, cfg, KdaCache(), Emitter()) for b in range(2)]
    assert rel(both, np.concatenate(alone)) <= 1e-6
    kda_attention(x, w, cfg, cache, Emitter())
    assert cache.state.shape == (2, 2, 8, 8) and not np.allclose(cache.state[0], cache.state[1])


def test_a_patch_of_other_tensors_makes_no_state_per_token_and_one_of_it_is_refused_before_the_run(monkeypatch):
    """A patch's sink looked at every tensor, so any patch made a KDA layer's states after every token
    (4 GiB a layer of Kimi-Linear-48B at 2,048 positions) whatever it patched; a patch of them was
    refused only once they were made."""
    import stepper
    from stepper.errors import StepperError

    made, replay = [], kda.replayed  # the positions of each layer's states made (the plan's own runs have 1 or 2)
    monkeypatch.setattr(kda, "replayed", lambda *args: made.append(args[0].shape[2]) or replay(*args))
    halved = stepper.run("tiny-kimi-linear", layer=0, prompt_len=70, keep="layers.0.output",
                         patch={"layers.0.self_attn.v_conv": lambda a, name: a / 2})
    plain = stepper.run("tiny-kimi-linear", layer=0, prompt_len=70, keep="layers.0.output")
    assert 70 not in made
    assert not np.allclose(np.asarray(halved["layers.0.output"]), np.asarray(plain["layers.0.output"]))
    with pytest.raises(StepperError, match=r"patch \*state_per_token: layers.0.self_attn.state_per_token is shown "
                                           r"only; the model does not read it back"):
        stepper.run("tiny-kimi-linear", layer=0, prompt_len=70, patch={"*state_per_token": lambda a, name: a})
    assert 70 not in made
