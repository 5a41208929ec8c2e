"""DeepSeek-V2 and V3.2 run like the V3 layer: their configs load, their names are known before a
run starts and are emitted in catalogue order, their checkpoints write and read back."""

import numpy as np
import pytest

from stepper.planning.names import planned_names
from stepper.presets import preset
from stepper.seams.trace import Recorder
from stepper.session import RunSpec, execute, prepare, run
from stepper.weights.checkpoint import Checkpoint
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.synth_checkpoint import synth_checkpoint


@pytest.mark.parametrize("spec", [
    RunSpec(model="tiny-v2", decode=2, attn="naive"), RunSpec(model="tiny-v2", attn="absorb", start_pos=5000),
    RunSpec(model="tiny", decode=1, attn="absorb"), RunSpec(model="tiny-v32", decode=1, attn="absorb"),
    RunSpec(model="tiny-v32", attn="naive", index_scoring="fp8"),
])
def test_the_names_of_a_family_run_are_known_and_in_order(spec):
    plan = prepare(spec)
    recorder = Recorder()
    execute(plan, [recorder])
    names, emitted = planned_names(plan), [e.name for e in recorder.events]
    assert names == emitted


def test_v2_runs_without_a_query_bottleneck_or_a_router_bias():
    cfg = preset("tiny-v2")
    rec = Recorder()
    run(RunSpec(model="tiny-v2", prompt_len=5), [rec])
    seen = {e.name: e.array for e in rec.events}
    assert "layers.1.self_attn.q_a" not in seen and "layers.1.mlp.gate.scores_for_choice" not in seen
    scores = seen["layers.1.mlp.gate.softmax_scores"]
    np.testing.assert_allclose(scores.sum(axis=1), 1, rtol=1e-6)
    chosen = np.take_along_axis(scores, seen["layers.1.mlp.gate.topk_idx"], axis=1)
    np.testing.assert_array_equal(seen["layers.1.mlp.gate.topk_weight"], chosen * np.float32(cfg.routed_scaling_factor))
    assert np.all(np.sort(scores, axis=1)[:, -cfg.num_experts_per_tok:].min(axis=1) == chosen.min(axis=1))


def test_a_v2_checkpoint_is_bf16_and_reads_back(tmp_path):
    cfg = preset("tiny-v2")
    synthetic = SyntheticWeights(cfg, seed=3)
    out = synth_checkpoint(synthetic, tmp_path / "v2", layers=range(1, 2))
    ck = Checkpoint(out)
    q = "model.layers.1.self_attn.q_proj.weight"
    np.testing.assert_array_equal(ck.get(q), synthetic.get(q))
    assert not any("e_score_correction_bias" in n or "q_a_proj" in n or "scale_inv" in n for n in ck.weight_map)
    assert "model.layers.1.mlp.shared_experts.gate_proj.weight" in ck.weight_map


@pytest.mark.parametrize("attn", ["naive", "absorb"])
def test_an_indexer_that_keeps_every_position_leaves_the_v3_layer_unchanged(attn, make_config):
    v32 = SyntheticWeights(make_config("tiny-v32", index_topk=64), seed=1)  # 64 >= every S below
    v3 = SyntheticWeights(preset("tiny-v3"), seed=1)  # the same (seed, name) -> the same weights
    spec = RunSpec(prompt_len=9, start_pos=5000, decode=2, attn=attn, seed=1)
    mine, theirs = Recorder(), Recorder()
    run(spec, [mine], v32)
    run(spec, [theirs], v3)
    got, want = mine.tensors(), theirs.tensors()
    assert set(want) < set(got) and any(".indexer.mask" in n for n in got)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert all(np.all(got[n] == 0) for n in got if n.endswith("indexer.mask") and n.startswith("decode"))


def test_the_indexer_keeps_index_topk_positions_and_attention_sees_only_those(make_config):
    rec = Recorder()
    run(RunSpec(model="tiny-v32", prompt_len=7, decode=1), [rec])
    seen = rec.tensors()
    scores = seen["prefill.layers.1.self_attn.indexer.index_scores"][0]
    idx = seen["prefill.layers.1.self_attn.indexer.topk_idx"][0]
    weights = seen["prefill.layers.1.self_attn.attn_weights"][0]  # [H, T, S]
    for t in range(7):  # query t has t + 1 earlier positions; index_topk is 4
        kept = sorted(int(s) for s in idx[t] if s >= 0)
        want = sorted(np.argsort(-scores[t, : t + 1], kind="stable")[:4].tolist())
        assert kept == want and len(kept) == min(t + 1, 4)
        assert (idx[t] == -1).sum() == 4 - len(kept)
        dropped = [s for s in range(7) if s not in kept]
        assert np.all(weights[:, t, dropped] == 0) and np.all(weights[:, t, kept] > 0)
    # decode: one query over 8 cached keys, its own key cache grown by one
    keys = seen["decode0.layers.1.self_attn.indexer.keys"]
    np.testing.assert_array_equal(keys[:, :7], seen["prefill.layers.1.self_attn.indexer.keys"])
    assert (seen["decode0.layers.1.self_attn.indexer.topk_idx"] >= 0).sum() == 4
    assert np.isfinite(seen["decode0.layers.1.self_attn.attn_scores"]).sum() == 4 * 4  # 4 heads x 4 kept


def test_the_indexer_rotates_halves_of_its_first_rope_dims():
    from stepper.model.indexer import rotate_halves
    from stepper.model.rope import Rope
    x = np.arange(1, 7, dtype=np.float32)[None, :]  # [T=1, Di=6], rope 4: (x0, x2) and (x1, x3) turn
    c, s = np.float32(np.cos(0.5)), np.float32(np.sin(0.5))
    rope = Rope(np.array([[c, 1]], np.float32), np.array([[s, 0]], np.float32), 1.0)
    out = rotate_halves(x, rope, 4)
    np.testing.assert_allclose(out, [[1 * c - 3 * s, 2, 3 * c + 1 * s, 4, 5, 6]], rtol=1e-6)


def test_the_indexer_queries_start_from_attentions_own_q_a_norm_whatever_rms_norm_eps_says(make_config):
    """q_a_layernorm is built with the latent eps (1e-6); on a config whose rms_norm_eps is 1e-5 the
    indexer must read the same normed latent the attention reads, not recompute it with 1e-5."""
    from stepper.kernels.linear import linear
    weights = SyntheticWeights(make_config("tiny-v32", rms_norm_eps=1e-5), seed=2)
    rec = Recorder()
    run(RunSpec(model="tiny-v32", prompt_len=5, seed=2), [rec], weights)
    seen = rec.tensors()
    q_a_norm = seen["layers.1.self_attn.q_a_norm"]  # [B, T, q_lora]
    cfg = weights.config
    q = linear(q_a_norm, weights.matrix("model.layers.1.self_attn.indexer.wq_b.weight"))
    want = q.reshape(1, 5, cfg.index_n_heads, cfg.index_head_dim).transpose(0, 2, 1, 3)
    np.testing.assert_array_equal(seen["layers.1.self_attn.indexer.q"], want)
