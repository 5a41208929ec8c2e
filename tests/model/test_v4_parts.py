"""DeepSeek-V4's residual, routers, experts, layer composition and head against transformers'
DeepseekV4ForCausalLM on the same random float32 weights: every tensor stepper emits outside the
attention (whose output is taken from transformers here, so these parts are checked alone; the
whole model with stepper's attention is tests/model/test_v4_crosscheck.py), over a prompt of 20
positions through a sliding, a CSA and an HCA layer, two hash-routed and two score-routed.
Relative error <= 1e-5 and the same experts chosen."""

from __future__ import annotations

import numpy as np
import pytest

from stepper.families.deepseek_v4 import V4Arrays, V4Model
from stepper.families.deepseek_v4_config import V4Config
from stepper.seams.trace import Emitter, Recorder
from tests.helpers import hf_v4

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def run():
    published = hf_v4.TINY_V4
    model = hf_v4.random_model(published, seed=3)
    ids = np.random.default_rng(5).integers(0, published["vocab_size"], size=(1, 20))
    ref = hf_v4.trace(model, ids)
    cfg = V4Config.from_hf(published, "tiny")
    weights = V4Arrays(cfg, hf_v4.stepper_arrays(model, published))

    def attention(i, w, cache, dims, emit):  # transformers' attention output, on the input it was given
        def attend(x):
            np.testing.assert_allclose(x, ref[f"layers.{i}.attn_norm"], rtol=0, atol=1e-5)
            return ref[f"layers.{i}.attn_output"]
        return attend

    recorder = Recorder()
    V4Model(weights, attention=attention).forward(ids, np.arange(ids.shape[1]), Emitter([recorder]))
    return recorder.tensors(), ref, cfg, model


def test_every_tensor_outside_the_attention_matches_transformers(run):
    mine, ref, _, _ = run
    mine = {k: (v.reshape(ref[k].shape) if k.endswith("routed_output") else v) for k, v in mine.items()}
    checked = sorted(set(mine) & set(ref))
    assert len(checked) >= 4 * 25 + 6  # each layer's hyper-connections, norms, router, experts; the ends
    wrong = {k: why for k in checked if (why := hf_v4.v4_compare(k, mine, ref))}
    assert wrong == {}
    only_mine = sorted(k for k in set(mine) - set(ref) if "clamp_counts" not in k and not k.endswith("biased_scores"))
    assert only_mine == []


def test_hash_layers_take_tid2eid_rows_and_score_layers_their_best(run):
    mine, _, cfg, _ = run
    assert cfg.is_hash_layer(1) and not cfg.is_hash_layer(2)
    assert "layers.1.ffn.gate.hash_idx" in mine and "layers.1.ffn.gate.topk_idx" not in mine
    assert "layers.2.ffn.gate.topk_idx" in mine and "layers.2.ffn.gate.hash_idx" not in mine
    biased = mine["layers.2.ffn.gate.biased_scores"]
    chosen = mine["layers.2.ffn.gate.topk_idx"]
    kth_best = np.sort(biased, axis=1)[:, -2]
    assert (np.take_along_axis(biased, chosen, 1) >= kth_best[:, None]).all()


def test_sinkhorn_makes_comb_doubly_stochastic_and_the_clamp_bites(run):
    mine = run[0]
    comb = mine["layers.3.hc_ffn.comb"]
    np.testing.assert_allclose(comb.sum(axis=-1), 1, atol=1e-3)
    np.testing.assert_allclose(comb.sum(axis=-2), 1, atol=1e-5)  # the last round normalises columns
    counts = sum(mine[f"layers.{i}.ffn.experts.clamp_counts"] for i in range(4))
    assert counts.shape == (8, 2) and counts.sum() > 0  # swiglu_limit 1.0: some values are clamped


def test_the_shared_experts_clamp_counts_are_those_of_transformers_input(run):
    mine, ref, _, model = run
    shared = model.model.layers[2].mlp.shared_experts
    x = ref["layers.2.ffn_norm"]  # [1, 20, d]
    gate = x @ shared.gate_proj.weight.detach().numpy().T
    up = x @ shared.up_proj.weight.detach().numpy().T
    expected = [np.count_nonzero(gate > 1.0), np.count_nonzero(np.abs(up) > 1.0)]
    assert mine["layers.2.ffn.shared_experts.clamp_counts"].tolist() == expected
    assert 0 < expected[0] < gate.size and 0 < expected[1] < up.size


def test_every_tensor_emitted_has_a_catalogue_entry_whose_cited_line_is_transformers(run):
    import json
    from importlib import resources
    from pathlib import Path

    import transformers

    from stepper import catalog

    entries = {}
    for part in ("v4_residual", "hc_streams", "v4_router"):
        raw = json.loads(resources.files("stepper.catalog").joinpath(f"v4/{part}.json").read_text(encoding="utf-8"))
        entries |= {e["name"]: e for e in raw["tensors"]}
    shared = {"logits": catalog.load().entry("logits")}  # the MLA family's, the same tensor
    assert all(shared.values()) and not set(shared) & set(entries)
    mine = run[0]
    missing = sorted({catalog.key_of(k) for k in mine} - set(entries) - set(shared))
    assert missing == []
    wrong_rank = sorted(k for k, v in mine.items() if len((entries | shared)[catalog.key_of(k)]["dims"]) != np.ndim(v))
    assert wrong_rank == []
    source = Path(transformers.__file__).parent
    for e in entries.values():
        cited = e["reference"]["transformers"]
        line = (source / cited["path"]).read_text(encoding="utf-8").splitlines()[cited["lines"][0] - 1]
        assert line == cited["text"] and cited["symbol"] in line, e["name"]
        assert len(e["description"]) <= 100, e["name"]
