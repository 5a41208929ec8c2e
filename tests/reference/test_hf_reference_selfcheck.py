"""Self-checks of the PyTorch reference harness `tests/hf_reference.py` (not of stepper).

The harness is only useful as an oracle if it really captures transformers' tensors under the
right names: these tests check names and shapes against docs/names.md, the internal consistency of
the captured tensors (residual chaining, softmax rows, routing weights, the model's own logits),
cache consistency (a decode step equals the uncached prefill of the concatenated ids), that the
YaRN parameters reach transformers, and that the weight loader is strict.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from helpers import hf_reference as H

from stepper.presets import preset

NAMES_MD = Path(__file__).resolve().parents[2] / "docs" / "names.md"
PRESETS = ["tiny", "tiny-v3"]
B, T = 2, 5


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------

def random_weights(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights under HF checkpoint names, built from the config alone."""
    rng = np.random.default_rng(seed)
    d, H_ = cfg["hidden_size"], cfg["num_attention_heads"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    kvr, qr = cfg["kv_lora_rank"], cfg["q_lora_rank"]

    def mat(*shape, std=0.05):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {
        "model.embed_tokens.weight": mat(cfg["vocab_size"], d, std=0.5),
        "model.norm.weight": norm(d),
        "lm_head.weight": mat(cfg["vocab_size"], d),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(d)
        w[p + "post_attention_layernorm.weight"] = norm(d)
        if qr is None:
            w[p + "self_attn.q_proj.weight"] = mat(H_ * (nope + rope), d)
        else:
            w[p + "self_attn.q_a_proj.weight"] = mat(qr, d)
            w[p + "self_attn.q_a_layernorm.weight"] = norm(qr)
            w[p + "self_attn.q_b_proj.weight"] = mat(H_ * (nope + rope), qr)
        w[p + "self_attn.kv_a_proj_with_mqa.weight"] = mat(kvr + rope, d)
        w[p + "self_attn.kv_a_layernorm.weight"] = norm(kvr)
        w[p + "self_attn.kv_b_proj.weight"] = mat(H_ * (nope + v), kvr)
        w[p + "self_attn.o_proj.weight"] = mat(d, H_ * v)
        if i < cfg["first_k_dense_replace"]:
            inter = cfg["intermediate_size"]
            w[p + "mlp.gate_proj.weight"] = mat(inter, d)
            w[p + "mlp.up_proj.weight"] = mat(inter, d)
            w[p + "mlp.down_proj.weight"] = mat(d, inter)
        else:
            E, mi = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
            w[p + "mlp.gate.weight"] = mat(E, d, std=0.1)
            w[p + "mlp.gate.e_score_correction_bias"] = mat(E, std=0.05)
            for e in range(E):
                w[p + f"mlp.experts.{e}.gate_proj.weight"] = mat(mi, d)
                w[p + f"mlp.experts.{e}.up_proj.weight"] = mat(mi, d)
                w[p + f"mlp.experts.{e}.down_proj.weight"] = mat(d, mi)
            si = mi * cfg["n_shared_experts"]
            w[p + "mlp.shared_experts.gate_proj.weight"] = mat(si, d)
            w[p + "mlp.shared_experts.up_proj.weight"] = mat(si, d)
            w[p + "mlp.shared_experts.down_proj.weight"] = mat(d, si)
    return w


def doc_names() -> list[tuple[str, str, str]]:
    """(section, name, shape) rows of docs/names.md; section in global/layer/dense/moe/family."""
    section, rows = "global", []
    for line in NAMES_MD.read_text().splitlines():
        if line.startswith("## "):  # the other families' own names (V2, V3.2): not in a V3 pass
            section = "family"
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] == "name" or set(cells[0]) <= set("-: "):
            continue
        head = cells[0].lower()
        if head.endswith(":"):
            section = ("layer" if head.startswith(("per layer", "both")) else
                       "dense" if head.startswith("dense") else
                       "moe" if head.startswith("moe") else "global")
            continue
        if "absorbed path only" in cells[2]:
            continue
        for name in re.findall(r"`([^`]+)`", cells[0]):
            rows.append((section, name, cells[1]))
    return rows


def expected(cfg: dict, *, t: int, s: int) -> dict[str, tuple[int, ...]]:
    """Documented name -> shape for one forward pass with t new and s attended positions."""
    dims = {k: v for k, v in cfg.items() if isinstance(v, int) and not isinstance(v, bool)}
    dims.update(B=B, T=t, S=s, N=B * t, H=cfg["num_attention_heads"], d=cfg["hidden_size"],
                E=cfg["n_routed_experts"], k=cfg["num_experts_per_tok"], rope=cfg["qk_rope_head_dim"],
                qk_head_dim=cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"])
    rows = [r for r in doc_names() if r[0] != "family"]
    assert len(rows) >= 40, f"could not parse docs/names.md ({len(rows)} rows)"

    def shape(text):
        return tuple(int(eval(item, {"__builtins__": {}}, dims)) for item in text.split(","))

    first = next(j for j, r in enumerate(rows) if r[0] != "global")
    last = max(j for j, r in enumerate(rows) if r[0] != "global")
    out = {name: shape(sh) for _, name, sh in rows[:first]}
    for i in range(cfg["num_hidden_layers"]):
        kind = "dense" if i < cfg["first_k_dense_replace"] else "moe"
        for section, name, sh in rows[first:last + 1]:
            if section in ("layer", kind):
                out[f"layers.{i}.{name}"] = shape(sh)
    out.update({name: shape(sh) for _, name, sh in rows[last + 1:]})
    return out


def rel_err(a, b) -> float:
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


@pytest.fixture(scope="module", params=PRESETS)
def case(request):
    cfg = preset(request.param).to_hf()
    weights = random_weights(cfg, seed=PRESETS.index(request.param))
    rng = np.random.default_rng(7)
    ids = rng.integers(0, cfg["vocab_size"], (B, T))
    decode = [rng.integers(0, cfg["vocab_size"], (B, 1)) for _ in range(2)]
    model = H.build_hf_model(cfg, weights)
    prefill, prefill_logits = H.run_hf_trace(model, ids, start_pos=0)
    cached, cached_logits = H.run_hf_trace(model, ids, start_pos=0, decode_ids=decode)
    return {"cfg": cfg, "weights": weights, "ids": ids, "decode": decode, "model": model, "prefill": prefill,
                "prefill_logits": prefill_logits, "cached": cached, "cached_logits": cached_logits}


def phases(c):
    """(trace, prefix, t, s) for the plain prefill and every phase of the cached run."""
    yield c["prefill"], "", T, T
    yield c["cached"], "prefill.", T, T
    for k in range(len(c["decode"])):
        yield c["cached"], f"decode{k}.", 1, T + k + 1


# --------------------------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------------------------

def test_harness_names_match_the_doc():
    rows = doc_names()
    layer = [n for s, n, _ in rows if s == "layer"]
    assert layer == H.LAYER_NAMES_ATTN + H.LAYER_NAMES_TAIL
    assert [n for s, n, _ in rows if s == "dense"] == H.LAYER_NAMES_DENSE
    assert [n for s, n, _ in rows if s == "moe"] == H.LAYER_NAMES_MOE


def test_names_shapes_and_order(case):
    cfg = case["cfg"]
    for trace, prefix, t, s in phases(case):
        want = expected(cfg, t=t, s=s)
        got = {k[len(prefix):]: v for k, v in trace.items() if k.startswith(prefix)
               and (prefix or not k.startswith(("prefill.", "decode")))}
        assert list(got) == list(want), f"{prefix}: names or order differ from docs/names.md"
        for name, shape in want.items():
            assert got[name].shape == shape, f"{prefix}{name}: {got[name].shape} != {shape}"
            want_dtype = np.int64 if name.endswith("topk_idx") else np.float32
            assert got[name].dtype == want_dtype, f"{prefix}{name}: dtype {got[name].dtype}"
    assert not any(k.startswith(("prefill.", "decode")) for k in case["prefill"])


def test_residual_chain_and_logits(case):
    n = case["cfg"]["num_hidden_layers"]
    for trace, p, _, _ in phases(case):
        assert np.array_equal(trace[p + "embed"], trace[p + "layers.0.hidden_states"])
        for i in range(n - 1):
            assert np.array_equal(trace[f"{p}layers.{i}.output"], trace[f"{p}layers.{i + 1}.hidden_states"])
        for i in range(n):
            q = f"{p}layers.{i}."
            np.testing.assert_allclose(trace[q + "attn_residual"],
                                       trace[q + "hidden_states"] + trace[q + "self_attn.o_proj"], rtol=0, atol=0)
            np.testing.assert_allclose(trace[q + "output"],
                                       trace[q + "attn_residual"] + trace[q + "mlp_output"], rtol=0, atol=0)
    assert np.array_equal(case["prefill"]["logits"], case["prefill_logits"][0])
    for k, (prefix) in enumerate(["prefill."] + [f"decode{j}." for j in range(len(case["decode"]))]):
        assert np.array_equal(case["cached"][prefix + "logits"], case["cached_logits"][k])
    # the cached run's prefill is the plain prefill
    assert np.array_equal(case["cached"]["prefill.logits"], case["prefill"]["logits"])


def test_attention_weights_and_mask(case):
    n = case["cfg"]["num_hidden_layers"]
    for trace, p, t, s in phases(case):
        for i in range(n):
            q = f"{p}layers.{i}.self_attn."
            w, sc = trace[q + "attn_weights"], trace[q + "attn_scores"]
            np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
            blocked = np.isneginf(sc)
            # causal: query j (absolute s - t + j) sees keys 0 .. s - t + j
            want = np.arange(s)[None, :] > (s - t + np.arange(t))[:, None]
            assert np.array_equal(blocked, np.broadcast_to(want, blocked.shape))
            assert np.all(w[blocked] == 0)
            # softmax of the derived scores is the captured softmax
            e = np.exp(sc - sc.max(-1, keepdims=True))
            np.testing.assert_allclose(e / e.sum(-1, keepdims=True), w, rtol=1e-5, atol=1e-7)
            # the assembled states are the documented concatenations
            np.testing.assert_array_equal(trace[q + "query_states"],
                                          np.concatenate([trace[q + "q_nope"], trace[q + "q_pe_rope"]], -1))
            np.testing.assert_array_equal(trace[q + "key_states"][:, :, s - t:],
                                          np.concatenate([trace[q + "k_nope"], np.broadcast_to(
                                              trace[q + "k_pe_rope"], trace[q + "k_nope"].shape[:3]
                                              + (trace[q + "k_pe_rope"].shape[-1],))], -1))
            nope = case["cfg"]["qk_nope_head_dim"]
            np.testing.assert_array_equal(trace[q + "value_states"][:, :, s - t:], trace[q + "kv"][..., nope:])


def test_router(case):
    cfg = case["cfg"]
    E, G = cfg["n_routed_experts"], cfg["n_group"]
    for trace, p, t, _ in phases(case):
        for i in range(cfg["first_k_dense_replace"], cfg["num_hidden_layers"]):
            q = f"{p}layers.{i}.mlp.gate."
            w, idx = trace[q + "topk_weight"], trace[q + "topk_idx"]
            np.testing.assert_allclose(w.sum(-1), cfg["routed_scaling_factor"], rtol=1e-6)
            mask = trace[q + "group_mask"]
            assert np.all(mask.sum(-1) == cfg["topk_group"])
            assert np.all(mask[np.arange(B * t)[:, None], idx // (E // G)] == 1)  # chosen in kept groups
            sfc = np.where(np.repeat(mask, E // G, axis=1) == 1, trace[q + "scores_for_choice"], -np.inf)
            chosen = np.take_along_axis(sfc, idx, 1)
            assert np.all(np.diff(chosen, axis=1) <= 0), "topk_idx not ordered by descending score"
            # the chosen set is the top-k of the masked scores_for_choice
            assert np.all(chosen[:, -1:] >= np.sort(sfc, axis=1)[:, -cfg["num_experts_per_tok"]][:, None])
            scores = np.take_along_axis(trace[q + "scores"], idx, 1)
            np.testing.assert_allclose(w, scores / scores.sum(-1, keepdims=True) * cfg["routed_scaling_factor"],
                                       rtol=1e-6)
            r = f"{p}layers.{i}."
            np.testing.assert_allclose(trace[r + "mlp_output"],
                                       trace[r + "mlp.routed_output"] + trace[r + "mlp.shared_output"], rtol=0, atol=0)


@pytest.mark.parametrize("start_pos", [0, 5000])
def test_decode_matches_uncached_prefill(case, start_pos):
    cfg, weights, ids, decode = case["cfg"], case["weights"], case["ids"], case["decode"]
    cached = H.hf_trace(cfg, weights, ids, start_pos=start_pos, decode_ids=decode)
    for k in range(len(decode)):
        full = np.concatenate([ids] + decode[: k + 1], axis=1)
        plain = H.hf_trace(cfg, weights, full, start_pos=start_pos)
        got = cached[f"decode{k}.layers.0.output"][:, 0]
        want = plain["layers.0.output"][:, -1]
        assert rel_err(got, want) <= 1e-5, f"decode{k} at start_pos {start_pos}: {rel_err(got, want)}"
        assert np.array_equal(cached[f"decode{k}.rope_cos"], plain["rope_cos"][-1:])


@pytest.mark.parametrize("name", ["tiny", "tiny-v3", "kimi-k2", "deepseek-v3"])
def test_yarn_reaches_transformers(name):
    cfg = preset(name).to_hf()
    rs = cfg["rope_scaling"]
    f, theta, dim = rs["factor"], cfg["rope_theta"], cfg["qk_rope_head_dim"]

    def mscale(s, m):
        return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

    qk_head = cfg["qk_nope_head_dim"] + dim
    assert H.hf_softmax_scale(cfg) == pytest.approx(qk_head ** -0.5 * mscale(f, rs["mscale_all_dim"]) ** 2, rel=1e-12)
    assert H.hf_attention_scaling(cfg) == pytest.approx(
        mscale(f, rs["mscale"]) / mscale(f, rs["mscale_all_dim"]), rel=1e-12)
    # YaRN inverse frequencies (DeepSeek's yarn_find_correction_range + linear ramp), float64
    def corr(rot):
        return dim * math.log(rs["original_max_position_embeddings"] / (rot * 2 * math.pi)) / (2 * math.log(theta))
    low, high = max(math.floor(corr(rs["beta_fast"])), 0), min(math.ceil(corr(rs["beta_slow"])), dim - 1)
    ramp = np.clip((np.arange(dim // 2) - low) / ((high - low) or 0.001), 0, 1)
    freq = 1.0 / theta ** (np.arange(0, dim, 2) / dim)
    want = freq / f * ramp + freq * (1 - ramp)
    np.testing.assert_allclose(H.hf_inv_freq(cfg), want, rtol=1e-6)


def test_inv_freq_override(case):
    cfg, weights, ids = case["cfg"], case["weights"], case["ids"]
    own = H.hf_inv_freq(cfg)
    base = H.hf_trace(cfg, weights, ids, start_pos=4097)
    same = H.hf_trace(cfg, weights, ids, start_pos=4097, inv_freq=own)
    assert np.array_equal(base["rope_cos"], same["rope_cos"])
    other = (own * np.float32(1.001)).astype(np.float32)
    changed = H.hf_trace(cfg, weights, ids, start_pos=4097, inv_freq=other)
    half = cfg["qk_rope_head_dim"] // 2
    pos = np.arange(4097, 4097 + T, dtype=np.float32)[:, None]
    angles = (pos * other[None, :]).astype(np.float32)
    np.testing.assert_allclose(changed["rope_cos"][:, :half], np.cos(angles) * H.hf_attention_scaling(cfg),
                               atol=2e-6)
    assert not np.array_equal(changed["rope_cos"], base["rope_cos"])
    with pytest.raises(ValueError):
        H.hf_trace(cfg, weights, ids, inv_freq=own.astype(np.float64))


def test_loader_is_strict(case):
    cfg, weights, _ids = case["cfg"], case["weights"], case["ids"]
    missing = dict(weights)
    del missing["model.layers.1.mlp.experts.3.up_proj.weight"]
    with pytest.raises(KeyError, match="gate_up_proj"):
        H.build_hf_model(cfg, missing)
    missing = dict(weights)
    del missing["model.layers.2.mlp.gate.e_score_correction_bias"]
    with pytest.raises(KeyError, match="e_score_correction_bias"):
        H.build_hf_model(cfg, missing)
    extra = dict(weights, **{"model.layers.0.mlp.experts.0.up_proj.weight": weights[
        "model.layers.1.mlp.experts.0.up_proj.weight"]})
    with pytest.raises(KeyError, match="not in the model"):
        H.build_hf_model(cfg, extra)
    bad = dict(weights)
    bad["model.norm.weight"] = bad["model.norm.weight"][:-1]
    with pytest.raises(ValueError, match="model.norm.weight"):
        H.build_hf_model(cfg, bad)
    # the fused experts hold cat(gate, up) and down exactly as given
    m = case["model"].model.layers[1].mlp.experts
    inter = cfg["moe_intermediate_size"]
    e = 5
    np.testing.assert_array_equal(m.gate_up_proj[e, :inter].detach().numpy(),
                                  weights[f"model.layers.1.mlp.experts.{e}.gate_proj.weight"])
    np.testing.assert_array_equal(m.gate_up_proj[e, inter:].detach().numpy(),
                                  weights[f"model.layers.1.mlp.experts.{e}.up_proj.weight"])
    np.testing.assert_array_equal(m.down_proj[e].detach().numpy(),
                                  weights[f"model.layers.1.mlp.experts.{e}.down_proj.weight"])
    # function wrappers are restored after a run
    import transformers.models.deepseek_v3.modeling_deepseek_v3 as mod
    assert mod.eager_attention_forward.__name__ == "eager_attention_forward"
    assert mod.apply_rotary_pos_emb_interleave.__name__ == "apply_rotary_pos_emb_interleave"
