"""DeepSeek-V4's attention (stepper.model.compressed_attention) against transformers'
DeepseekV4Attention and its compressor and indexer modules, on the same tiny random weights in
float32: a sliding, a CSA (m = 4, index_topk 3) and an HCA (m = 128) layer; a 383-token prompt
(95 CSA windows and 2 HCA windows closed, 3 and 127 tokens left pending), then two decode steps,
the first of which closes a window of each compressor. Every emitted tensor within 1e-5 relative
error, every indexer choice identical; a decode step equals a re-run of the longer prompt.
"""

from __future__ import annotations

import numpy as np
import pytest

from stepper.model.compressed_attention import attention, weight_shapes
from stepper.model.layer_weights import LayerWeights
from stepper.model.v4_attention_cache import V4AttentionCache
from stepper.seams.trace import Emitter, Recorder
from tests.helpers.compare import rel_err
from tests.helpers.hf_v4_attention import tiny_config, trace
from tests.helpers.v4_layers import Arrays, dims_of

PROMPT = 383
LAYERS = {0: "sliding", 1: "CSA", 2: "HCA"}


@pytest.fixture(scope="module")
def traced():
    config = tiny_config()
    ids = np.random.default_rng(3).integers(0, config.vocab_size, (1, PROMPT + 2))
    steps = [ids[:, :PROMPT], ids[:, PROMPT:PROMPT + 1], ids[:, PROMPT + 1:]]
    weights, ref = trace(config, steps, seed=1)
    arrays = {"model." + k: v for k, v in weights.items()}
    mine = []
    caches = {layer: V4AttentionCache() for layer in LAYERS}
    for step in ref:
        out = {}
        for layer in LAYERS:
            rec = Recorder()
            w = LayerWeights(Arrays(arrays), layer)
            attention(step[layer]["x"], w, dims_of(config, layer), caches[layer], Emitter([rec]))
            out[layer] = rec.tensors()
        mine.append(out)
    return config, arrays, ref, mine


def close(mine: np.ndarray, ref: np.ndarray, what: str) -> None:
    assert mine.shape == ref.shape, f"{what}: shape {mine.shape} vs {ref.shape}"
    err = rel_err(mine, ref)
    assert err <= 1e-5, f"{what}: relative error {err:.2e}"


def test_weight_shapes_are_transformers(traced):
    config, arrays, _, _ = traced
    for layer in LAYERS:
        for name, shape in weight_shapes(dims_of(config, layer)).items():
            assert arrays[f"model.layers.{layer}.{name}"].shape == shape, name
        wanted = {k for k in arrays if k.startswith(f"model.layers.{layer}.self_attn.")}
        assert wanted == {f"model.layers.{layer}.{n}" for n in weight_shapes(dims_of(config, layer))}


@pytest.mark.parametrize("step", [0, 1, 2])
@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_projections_and_output(traced, layer, step):
    config, _, ref, mine = traced
    r, m = ref[step][layer], mine[step][layer]
    B, T, _ = r["x"].shape
    H, D = config.num_attention_heads, config.head_dim
    close(m["attn.q_a"], r["q_a"], "q_a")
    close(m["attn.q_a_norm"], r["q_a_norm"], "q_a_norm")
    close(m["attn.q_b"], r["q_b"].reshape(B, T, H, D).transpose(0, 2, 1, 3), "q_b")
    close(m["attn.q"], r["q"], "q")
    close(m["attn.q_rope"], r["q_rope"], "q_rope")
    close(m["attn.kv_proj"], r["kv_proj"], "kv_proj")
    close(m["attn.kv"], r["kv"], "kv")
    S_w = m["attn.window"].shape[1]
    close(m["attn.window"], r["keys"][:, :S_w], "window")
    close(m["attn.kv_rope"], r["keys"][:, S_w - T:S_w], "kv_rope")
    close(m["attn.output"], r["output"], "output")
    turned_back = r["output_turned_back"].reshape(B, T, H, D).transpose(0, 2, 1, 3)
    close(m["attn.output_turned_back"], turned_back, "output_turned_back")
    close(m["attn.o_groups"], r["o_groups"], "o_groups")
    close(m["attn.o"], r["o"], "o")


def scattered(mine: dict, total: int, fill: float, name: str) -> np.ndarray:
    """My [B, H, T, Wk + K] (each query's window slots, then its entries) laid out as transformers'
    [B, H, T, S_w + E] (the window's keys, then every entry): slot j of query t is key
    t + kept - Wk + 1 + j (kept: the keys before the new ones), entry k is S_w + chosen[k]."""
    a = mine[name]
    B, H, T, _ = a.shape
    S_w = mine["attn.window"].shape[1]
    chosen = mine.get("attn.chosen", np.zeros((B, T, 0), np.int64))
    Wk = mine["attn.weights"].shape[-1] - chosen.shape[-1]
    out = np.full((B, H, T, S_w + total), fill, np.float32)
    for t in range(T):
        for j in range(Wk):
            key = t + (S_w - T) - Wk + 1 + j
            if key >= 0:
                out[:, :, t, key] = a[:, :, t, j]
    for b, t, k in zip(*np.nonzero(chosen >= 0)):
        out[b, :, t, S_w + chosen[b, t, k]] = a[b, :, t, Wk + k]
    return out


@pytest.mark.parametrize("step", [0, 1, 2])
@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_scores_weights_and_sink(traced, layer, step):
    config, arrays, ref, mine = traced
    r, m = ref[step][layer], mine[step][layer]
    total = r["keys"].shape[1] - m["attn.window"].shape[1]  # entries transformers attends over
    weights = scattered(m, total, 0.0, "attn.weights")
    close(weights, r["weights"], "weights")
    visible = r["mask"][:, 0] > -1e30  # [B, T, S]: transformers' additive mask (finfo.min or -inf elsewhere)
    seen = np.isfinite(scattered(m, total, -np.inf, "attn.scores")[:, 0])
    assert np.array_equal(seen, np.broadcast_to(visible, seen.shape)), "the keys a query sees differ"
    logits = np.einsum("bhtd,bsd->bhts", r["q_rope"], r["keys"]) * config.head_dim**-0.5
    scores = scattered(m, total, -np.inf, "attn.scores")
    close(np.where(visible[:, None], scores, 0), np.where(visible[:, None], logits, 0), "scores")
    sinks = arrays[f"model.layers.{layer}.self_attn.sinks"]
    assert np.array_equal(m["attn.scores"][..., -1], np.broadcast_to(sinks[None, :, None], m["attn.scores"].shape[:3]))
    close(m["attn.sink_mass"], 1 - r["weights"].sum(-1), "sink_mass")
    if layer:  # the entries a query attends are transformers' keys after the window, at the chosen indices
        S_w, chosen = m["attn.window"].shape[1], m["attn.chosen"]
        b, t, k = np.nonzero(chosen >= 0)
        close(m["attn.entry_keys"][b, t, k], r["keys"][b, S_w + chosen[b, t, k]], "entry_keys")
        assert not m["attn.entry_keys"][chosen < 0].any()


@pytest.mark.parametrize("step", [0, 1, 2])
@pytest.mark.parametrize("layer", [1, 2])
def test_compressor(traced, layer, step):
    _, _, ref, mine = traced
    r, m = ref[step][layer], mine[step][layer]
    close(m["attn.compressor.kv"], r["compressor.kv"], "compressor.kv")
    close(m["attn.compressor.gate"], r["compressor.gate"], "compressor.gate")
    close(m["attn.entries"], r["entries"][:, 0], "entries")
    closed = m["attn.compressor.entries"].shape[1]
    assert closed == r.get("compressor.pooled", np.zeros((1, 0))).shape[1]
    if closed:
        close(m["attn.compressor.pooled"], r["compressor.pooled"], "compressor.pooled")
        close(m["attn.compressor.entries"], r["entries"][:, 0, -closed:], "compressor.entries")
    slot_weights = m["attn.compressor.slot_weights"]
    np.testing.assert_allclose(slot_weights.sum(axis=2), 1, rtol=1e-6)


def test_windows_closed_where_expected(traced):
    _, _, _, mine = traced
    assert [mine[s][1]["attn.compressor.entries"].shape[1] for s in range(3)] == [95, 1, 0]
    assert [mine[s][2]["attn.compressor.entries"].shape[1] for s in range(3)] == [2, 1, 0]
    first = mine[0][1]["attn.compressor.slot_weights"][:, 0]  # [B, 2m, D]: window 0 has no predecessor
    assert np.all(first[:, :4] == 0)


@pytest.mark.parametrize("step", [0, 1, 2])
def test_indexer(traced, step):
    config, _, ref, mine = traced
    r, m = ref[step][1], mine[step][1]
    close(m["attn.indexer.compressor.kv"], r["indexer.compressor.kv"], "indexer kv")
    close(m["attn.indexer.compressor.gate"], r["indexer.compressor.gate"], "indexer gate")
    close(m["attn.indexer.keys"], r["indexer.keys"], "indexer keys")
    closed = m["attn.indexer.compressor.entries"].shape[1]
    assert closed == r.get("indexer.compressor.pooled", np.zeros((1, 0))).shape[1]
    if closed:
        close(m["attn.indexer.compressor.pooled"], r["indexer.compressor.pooled"], "indexer pooled")
        close(m["attn.indexer.compressor.entries"], r["indexer.keys"][:, -closed:], "indexer entries")
    close(m["attn.indexer.q"], r["indexer.q"].transpose(0, 2, 1, 3), "indexer q")
    close(m["attn.indexer.head_weights"], r["indexer.weights_proj"] * config.index_n_heads**-0.5, "head weights")
    scores, reference = m["attn.indexer.scores"], r["indexer.raw_scores"]
    visible = np.isfinite(scores)
    assert visible.sum() > 0
    close(np.where(visible, scores, 0), np.where(visible, reference, 0), "indexer scores")
    # the same picks (the reference's top-k is sorted best first, as stepper's; -1 where nothing is seen)
    kth = np.sort(np.where(visible, reference, -np.inf), axis=-1)[..., ::-1]
    k = m["attn.indexer.chosen"].shape[-1]
    ties = (kth[..., k - 1] == kth[..., k]) & np.isfinite(kth[..., k]) if kth.shape[-1] > k else np.zeros(1, bool)
    assert not ties.any(), "this seed has tied scores at the cut: pick another"
    assert np.array_equal(np.sort(m["attn.indexer.chosen"], -1), np.sort(r["indexer.chosen"], -1))
    assert np.array_equal(m["attn.chosen"], m["attn.indexer.chosen"])


def test_decode_equals_rerun(traced):
    """Prefill 383 + two decode steps gives what one 385-token prompt gives, layer by layer; so
    does a prompt split at a position that is not a window boundary."""
    config, arrays, ref, mine = traced
    for layer in LAYERS:
        x = np.concatenate([ref[s][layer]["x"] for s in range(3)], axis=1)  # [1, 385, d]
        dims = dims_of(config, layer)
        w = LayerWeights(Arrays(arrays), layer)
        whole = attention(x, w, dims, None, Emitter())
        stepped = [mine[s][layer]["attn.o"] for s in range(3)]
        close(np.concatenate(stepped, axis=1), whole, f"layer {layer} stepped")
        cache = V4AttentionCache()
        parts = [attention(x[:, a:b], w, dims, cache, Emitter()) for a, b in ((0, 6), (6, 131), (131, 385))]
        close(np.concatenate(parts, axis=1), whole, f"layer {layer} split")
        assert cache.seen == 385


def test_a_batch_is_its_rows_run_alone(traced):
    """Two different prompts in one batch (prefill, then a decode step) give what each gives alone."""
    config, arrays, ref, _ = traced
    x = ref[0][1]["x"][:, :40]  # [1, 40, d]
    rows = np.concatenate([x, x[:, ::-1]], axis=0)  # [2, 40, d]
    for layer in LAYERS:
        dims, w = dims_of(config, layer), LayerWeights(Arrays(arrays), layer)
        both, alone = V4AttentionCache(), [V4AttentionCache(), V4AttentionCache()]
        for span in (slice(0, 39), slice(39, 40)):
            together = attention(rows[:, span], w, dims, both, Emitter())
            for b in range(2):
                close(together[b:b + 1], attention(rows[b:b + 1, span], w, dims, alone[b], Emitter()), f"row {b}")


def test_queries_made_a_row_at_a_time_on_two_cores_give_the_same_bits(traced, monkeypatch):
    """The scores, weights and output made one query row at a time, the rows shared by two
    threads (kernels.query_blocks), are the whole arrays' bits: every tensor of the prompt."""
    from stepper.kernels import parallel, query_blocks

    config, arrays, ref, mine = traced
    monkeypatch.setattr(query_blocks, "BLOCK_VALUES", 1)  # a block is one query row
    monkeypatch.setattr(parallel, "cores", lambda: 2)
    for layer in LAYERS:
        rec = Recorder()
        w = LayerWeights(Arrays(arrays), layer)
        attention(ref[0][layer]["x"], w, dims_of(config, layer), V4AttentionCache(), Emitter([rec]))
        blocked = rec.tensors()
        assert blocked.keys() == mine[0][layer].keys() and "attn.scores" in blocked
        for name, value in blocked.items():
            np.testing.assert_array_equal(value, mine[0][layer][name], err_msg=f"layer {layer} {name}")
