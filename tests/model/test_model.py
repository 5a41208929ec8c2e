"""Whole-model properties that need no reference: the cache, positions, batching, laziness."""

import numpy as np
import pytest

from stepper.model import KVCache, Transformer
from stepper.presets import preset
from stepper.seams.trace import Emitter, Recorder
from stepper.session import RunSpec, prompt_ids, run
from stepper.tensors.tiled import Tiled
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.stored import Fp8Matrix


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def trace(model, ids, positions, cache=None):
    rec = Recorder()
    logits = model.forward(np.array(ids), np.array(positions), Emitter([rec]), cache)
    return logits, rec.tensors()


@pytest.mark.parametrize("name", ["tiny", "tiny-v3"])
@pytest.mark.parametrize("start", [0, 5000])
def test_decode_with_cache_equals_uncached_prefill(name, start):
    model = Transformer(SyntheticWeights(preset(name), seed=3))
    ids = [[11, 22, 33, 44, 55, 66]]
    full_logits, full = trace(model, ids, start + np.arange(6))

    cache = KVCache(model.config.num_hidden_layers)
    trace(model, [ids[0][:4]], start + np.arange(4), cache)
    for t in (4, 5):
        logits, step = trace(model, [[ids[0][t]]], [start + t], cache)
        for key in ("layers.0.output", "layers.2.output", "layers.2.self_attn.attn_output"):
            assert rel_err(step[key][:, -1], full[key][:, t]) < 1e-5, (key, t)
        assert step["layers.1.self_attn.key_states"].shape[2] == t + 1
        assert rel_err(logits[0, -1], full_logits[0, t]) < 1e-5
    assert cache.length() == 6


def test_batch_rows_are_independent():
    model = Transformer(SyntheticWeights(preset("tiny"), seed=1))
    a, b = [5, 6, 7], [900, 1, 42]
    both, _ = trace(model, [a, b], np.arange(3))
    alone, _ = trace(model, [b], np.arange(3))
    assert rel_err(both[1], alone[0]) < 1e-5


def test_position_changes_attention_only_through_rope():
    model = Transformer(SyntheticWeights(preset("tiny"), seed=1))
    _, near = trace(model, [[1, 2, 3]], np.arange(3))
    _, far = trace(model, [[1, 2, 3]], 6000 + np.arange(3))
    assert np.array_equal(near["layers.0.self_attn.q_pe"], far["layers.0.self_attn.q_pe"])
    assert not np.allclose(near["layers.0.self_attn.q_pe_rope"], far["layers.0.self_attn.q_pe_rope"])
    # the first token attends only to itself wherever it is
    assert np.all(far["layers.0.self_attn.attn_weights"][..., 0, 0] == 1.0)


def test_only_chosen_experts_are_read():
    seen = []

    class Spy(SyntheticWeights):
        def stored(self, name):
            seen.append(name)
            return super().stored(name)

    rec = Recorder()
    run(RunSpec(prompt_len=2), [rec], Spy(preset("tiny"), 0))
    chosen = {int(e) for e in rec.tensors()["layers.1.mlp.gate.topk_idx"].ravel()}
    read = {int(n.split(".")[5]) for n in seen if n.startswith("model.layers.1.mlp.experts.")}
    assert read == chosen and len(read) < preset("tiny").n_routed_experts


def test_router_bias_is_not_degenerate():
    """Synthetic weights make routing informative: the bias changes some choices, loads spread."""
    rec = Recorder()
    run(RunSpec(prompt_len=32), [rec])
    t = rec.tensors()
    idx = t["layers.1.mlp.gate.topk_idx"]
    unbiased = np.argsort(-t["layers.1.mlp.gate.scores"], axis=1, kind="stable")[:, : idx.shape[1]]
    changed = [set(a) != set(b) for a, b in zip(idx.tolist(), unbiased.tolist())]
    assert 0 < sum(changed) < len(changed)
    assert len(np.unique(idx)) > idx.shape[1] * 2
    weights = t["layers.0.self_attn.attn_weights"][0, :, -1]
    assert weights.max() < 0.99 and weights.max() > 2.0 / weights.shape[-1]


def test_run_decodes_greedily_and_names_phases():
    rec = Recorder()
    result = run(RunSpec(prompt_len=3, decode=2), [rec])
    names = [e.name for e in rec.events]
    assert names[0] == "prefill.embed" and "decode1.logits" in names
    t = rec.tensors()
    assert result.generated[0] == int(np.argmax(t["prefill.logits"][0, -1]))
    assert result.generated[1] == int(np.argmax(t["decode0.logits"][0, -1]))
    assert t["decode1.layers.0.self_attn.attn_weights"].shape[-1] == 5


def run_tensors(**spec) -> dict[str, np.ndarray]:
    rec = Recorder()
    run(RunSpec(**spec), [rec])
    return rec.tensors()


@pytest.mark.parametrize("model", ["tiny", "tiny-v3"])
def test_absorbed_attention_equals_naive(model):
    """Every tensor both paths emit, and every layer's output, agree to float32 round-off."""
    naive = run_tensors(model=model, prompt_len=6, start_pos=4090, decode=2, attn="naive")
    absorbed = run_tensors(model=model, prompt_len=6, start_pos=4090, decode=2, attn="absorb")
    shared = naive.keys() & absorbed.keys()
    outputs = {f"{p}.layers.2.output" for p in ("prefill", "decode0", "decode1")}
    assert {n for n in shared if n.endswith("layers.2.output")} == outputs
    assert all(k.endswith(("q_nope_absorbed", "attn_output_latent")) for k in absorbed.keys() - shared)
    for name in shared:
        a, b = absorbed[name], naive[name]
        if a.dtype.kind == "i":
            assert np.array_equal(np.sort(a, 1), np.sort(b, 1)), name
            continue
        finite = np.isfinite(b)
        assert np.array_equal(np.isfinite(a), finite), name
        assert rel_err(a[finite], b[finite]) < 1e-5, name


def test_absorbed_latent_output_is_the_naive_output_before_w_uv():
    """attn_output_latent x W_UV^T per head is the naive path's attention output."""
    from stepper.model.attention import split_kv_b

    cfg = preset("tiny")
    t = run_tensors(prompt_len=4, attn="absorb")
    naive = run_tensors(prompt_len=4, attn="naive")
    _, w_uv = split_kv_b(SyntheticWeights(cfg).get("model.layers.1.self_attn.kv_b_proj.weight"), cfg)
    per_head = t["layers.1.self_attn.attn_output_latent"] @ w_uv.swapaxes(-1, -2)  # [B, H, T, V]
    merged = per_head.transpose(0, 2, 1, 3).reshape(1, 4, -1)
    assert rel_err(merged, naive["layers.1.self_attn.attn_output"]) < 1e-5


def test_decode_with_the_latent_cache_equals_the_uncached_prefill():
    full = run_tensors(ids=(5, 6, 7, 8, 9), start_pos=5000, attn="absorb")
    stepped = run_tensors(ids=(5, 6, 7), start_pos=5000, decode=2, attn="absorb")
    # the decode steps feed greedy tokens; replay them uncached to compare the same positions
    tokens = [int(np.argmax(stepped["prefill.logits"][0, -1])), int(np.argmax(stepped["decode0.logits"][0, -1]))]
    full = run_tensors(ids=(5, 6, 7, *tokens), start_pos=5000, attn="absorb")
    for k, t in enumerate((3, 4)):
        for key in ("layers.2.output", "layers.1.self_attn.attn_output_latent", "logits"):
            assert rel_err(stepped[f"decode{k}.{key}"][:, ..., -1:, :], full[key][:, ..., t:t + 1, :]) < 1e-5, (key, t)


def test_auto_uses_naive_prefill_and_absorbed_decode():
    t = run_tensors(prompt_len=3, decode=1)
    assert "prefill.layers.0.self_attn.key_states" in t and "prefill.layers.0.self_attn.q_nope_absorbed" not in t
    assert "decode0.layers.0.self_attn.q_nope_absorbed" in t and "decode0.layers.0.self_attn.key_states" not in t


def test_grouped_expert_dispatch_equals_the_per_token_loop():
    cfg = preset("tiny-v3")
    rec = {}
    for dispatch in ("grouped", "per_token"):
        r = Recorder()
        model = Transformer(SyntheticWeights(cfg, seed=4), dispatch=dispatch)
        model.forward(np.array([[3, 14, 15, 92, 65, 35, 89, 79, 32, 38]]), np.arange(10), Emitter([r]))
        rec[dispatch] = r.tensors()
    assert rec["grouped"].keys() == rec["per_token"].keys()
    for name in rec["grouped"]:
        a, b = rec["grouped"][name], rec["per_token"][name]
        finite = np.isfinite(b)
        assert np.array_equal(np.isfinite(a), finite), name
        assert np.array_equal(a, b) if a.dtype.kind == "i" else rel_err(a[finite], b[finite]) < 1e-5, name


def test_fp8_tiles_equal_the_bit_level_dequantization():
    """linear_fp8 (tiles decoded in place) equals fp8.decode_bits applied code by code, then x @ W^T."""
    from stepper import fp8
    from stepper.kernels.fp8_matmul import linear_fp8

    rng = np.random.default_rng(9)
    for out_dim, in_dim in ((576, 700), (130, 129), (3, 5)):
        w = rng.standard_normal((out_dim, in_dim)).astype(np.float32) * 0.05
        codes, scale_inv = fp8.quantize(w)
        table = np.array([fp8.decode_bits(c) for c in range(256)])  # float64, bit-level
        rows, cols = np.indices(codes.shape)
        dense = table[codes.view(np.uint8)] * scale_inv[rows // 128, cols // 128]  # float64 reference
        assert np.array_equal(Fp8Matrix.of(codes, scale_inv).dequantize(), dense.astype(np.float32))
        for tokens in (4, 20):  # decode-sized and prefill-sized tiles
            x = rng.standard_normal((tokens, in_dim)).astype(np.float32)
            y = linear_fp8(x, Fp8Matrix.of(codes, scale_inv))
            np.testing.assert_allclose(y, x.astype(np.float64) @ dense.T, rtol=1e-5, atol=1e-5 * np.abs(y).max())


def test_weight_cache_changes_speed_not_values():
    from stepper.kernels.weight_cache import CachedWeights

    plain = run_tensors(prompt_len=3, decode=2, seed=5)
    cached_source = CachedWeights(SyntheticWeights(preset("tiny"), 5), 64 * 2**20)
    rec = Recorder()
    run(RunSpec(prompt_len=3, decode=2, seed=5), [rec], cached_source)
    cached = rec.tensors()
    assert cached.keys() == plain.keys()
    for name, array in plain.items():
        finite = np.isfinite(array)
        assert np.array_equal(np.isfinite(cached[name]), finite), name
        if array.dtype.kind == "f":
            assert rel_err(cached[name][finite], array[finite]) < 1e-5, name
        else:  # the experts chosen: the same
            assert np.array_equal(cached[name], array), name
    assert any(array.dtype.kind != "f" for array in plain.values())
    assert cached_source.hits > 0 and cached_source.bytes <= 64 * 2**20


def test_weight_cache_keeps_a_weight_from_its_second_use_decoded_as_dequantize():
    from stepper.kernels.weight_cache import CachedWeights

    source = SyntheticWeights(preset("tiny"), 5)
    cached = CachedWeights(source, 64 * 2**20)
    name = "model.layers.0.self_attn.q_b_proj.weight"
    assert isinstance(cached.matrix(name), Fp8Matrix) and cached.bytes == 0  # used once: the FP8 product
    kept = cached.matrix(name)  # used again: decoded and kept
    assert np.array_equal(kept, source.matrix(name).dequantize()) and cached.bytes == kept.nbytes
    assert cached.matrix(name) is kept and (cached.hits, cached.misses) == (1, 2)


def cache_with_room_for_one() -> tuple:
    """A weight cache over tiny's weights with room for one of two of them: (cache, first, second, sizes)."""
    from stepper.kernels.weight_cache import CachedWeights

    source = SyntheticWeights(preset("tiny"), 5)
    first, second = "model.layers.0.self_attn.q_b_proj.weight", "model.layers.0.self_attn.o_proj.weight"
    sizes = [int(np.prod(source.matrix(n).shape)) * 4 for n in (first, second)]
    return CachedWeights(source, max(sizes)), first, second, sizes


def test_weight_cache_counts_age_so_a_weight_used_often_now_displaces_one_used_often_long_ago(monkeypatch):
    from stepper.kernels import weight_cache

    monkeypatch.setattr(weight_cache, "AGE_EVERY", 8)
    cached, old, new, _ = cache_with_room_for_one()
    for _ in range(7):
        cached.matrix(old)
    assert list(cached.kept) == [old] and cached.uses[old] == 7
    cached.matrix(new)  # the 8th use: every count halved first (old 7 -> 3), then new counted
    assert cached.uses == {old: 3, new: 1}
    for _ in range(3):
        cached.matrix(new)
    assert list(cached.kept) == [new]  # 4 uses against old's 3: without aging it would need 8


def test_weight_cache_makes_room_only_by_letting_go_of_weights_used_less():
    cached, often, seldom, sizes = cache_with_room_for_one()
    for _ in range(3):
        cached.matrix(often)
    assert list(cached.kept) == [often]
    assert isinstance(cached.matrix(seldom), Fp8Matrix) and isinstance(cached.matrix(seldom), Fp8Matrix)  # 2 uses < 3
    assert list(cached.kept) == [often]
    cached.matrix(seldom)  # 3 uses: not fewer than `often`'s, still no room
    cached.matrix(seldom)  # 4 uses: `often` (3) makes room
    assert list(cached.kept) == [seldom] and cached.bytes == sizes[1] <= cached.max_bytes


@pytest.mark.parametrize("attn", ["naive", "absorb"])
def test_attention_in_tiles_under_the_indexers_mask_equals_the_whole_arrays(attn, monkeypatch):
    """DeepSeek-V3.2's indexer keeps 4 of up to 13 positions: in tiles, its mask drops the same keys."""
    from stepper.kernels import attention, parallel

    spec = {"model": "tiny-v32", "prompt_len": 13, "start_pos": 5000, "decode": 1, "attn": attn}
    whole = run_tensors(**spec)
    monkeypatch.setattr(parallel, "cores", lambda: 2)
    monkeypatch.setattr(attention, "WHOLE_SCORES", 0)
    monkeypatch.setattr(attention, "TILE_SCORES", 8 * 5 * 6)
    monkeypatch.setattr(attention, "KEY_TILE", 6)
    monkeypatch.setattr(attention, "QUERY_TILE", 5)
    tiled = run_tensors(**spec)
    weights = np.asarray(tiled["prefill.layers.0.self_attn.attn_weights"])
    mask = whole["prefill.layers.0.self_attn.indexer.mask"]  # [B, T, S]: 0 kept, -inf dropped
    assert np.array_equal(weights[:, 0] > 0, np.isfinite(mask))  # a head attends exactly where the indexer kept
    for key in ("prefill.logits", "decode0.logits", "decode0.layers.1.output"):
        scale = float(np.abs(whole[key]).max())
        assert np.abs(tiled[key] - whole[key]).max() <= 1e-4 * scale, key


@pytest.mark.parametrize("attn", ["naive", "absorb"])
def test_attention_in_tiles_equals_the_whole_arrays(attn, monkeypatch):
    """Past kernels.attention.WHOLE_SCORES the attention runs in tiles on two threads and its
    scores and weights are Tiled tensors: the same tensors and logits as the whole-array lines,
    to float32 round-off, in the prefill and the decode steps, at positions past 4096."""
    from stepper.kernels import attention, parallel

    spec = {"prompt_len": 13, "start_pos": 5000, "decode": 2, "attn": attn}
    whole = run_tensors(**spec)
    monkeypatch.setattr(parallel, "cores", lambda: 2)
    monkeypatch.setattr(attention, "WHOLE_SCORES", 0)
    monkeypatch.setattr(attention, "TILE_SCORES", 4 * 5 * 6)  # tiles of 5 queries x 6 keys, edges inside the rows
    monkeypatch.setattr(attention, "KEY_TILE", 6)
    monkeypatch.setattr(attention, "QUERY_TILE", 5)
    tiled = run_tensors(**spec)
    assert whole.keys() == tiled.keys()
    assert isinstance(tiled["prefill.layers.0.self_attn.attn_weights"], Tiled)
    for key in whole:  # layer 0 sees the same input; later layers the round-off of the ones before
        got, want = np.asarray(tiled[key]), whole[key]
        assert np.array_equal(np.isfinite(got), np.isfinite(want)), key
        scale = max(1.0, float(np.abs(want[np.isfinite(want)]).max()))
        limit = (2e-6 if ".layers.0." in key else 1e-4) * scale
        kept = np.isfinite(want)
        assert np.abs(got[kept] - want[kept]).max() <= limit, key
    model = Transformer(SyntheticWeights(preset("tiny"), seed=0))
    ids = np.array([prompt_ids(RunSpec(prompt_len=12), preset("tiny"))])
    silent = model.forward(ids, np.arange(12), Emitter(), attn=attn)  # no sink: nothing made to be shown
    shown = model.forward(ids, np.arange(12), Emitter([Recorder()]), attn=attn)
    assert np.array_equal(silent, shown)
