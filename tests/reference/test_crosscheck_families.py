"""DeepSeek-V2 and V3.2 layers, every named tensor against transformers' DeepseekV2ForCausalLM and
DeepseekV32ForCausalLM on the same float32 weights.

Configs: `tiny-v2` (V2-Lite-like: greedy softmax routing, one q_proj, two shared experts, YaRN
mscale 0.707), a V2-like sibling (group_limited_greedy over 4 groups keep 2, a q bottleneck,
routed_scaling_factor 16) and `tiny-v32` (V3 plus the indexer keeping 4 positions, fewer than
the prompt; its chosen positions identical, on data whose scores have no tie at the cut); both
MLA paths, transformers' naive tensors left out of the absorbed comparison. Prefill then cached decode steps, at
position 0 and past 4096; relative error <= 1e-5 per tensor (helpers.compare).
"""

import copy
import os

import numpy as np
import pytest

if not os.environ.get("STEPPER_REQUIRE_CROSSCHECK"):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")

from helpers.compare import compare
from helpers.hf_reference import hf_attention_scaling, hf_inv_freq, hf_softmax_scale, hf_trace

from stepper import catalog
from stepper.config import Config
from stepper.families import derive
from stepper.model import Transformer
from stepper.presets import PRESETS
from stepper.seams.trace import Recorder, unphased
from stepper.session import RunSpec, run
from stepper.weights.names import weight_shapes
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.source import ArrayWeights

PROMPT = (17, 402, 999, 3, 256, 77, 640)

V2_LIKE = {**copy.deepcopy(PRESETS["tiny-v2"]), "_name_or_path": "tiny-v2-grouped",
           "topk_method": "group_limited_greedy",
           "n_group": 4, "topk_group": 2, "q_lora_rank": 192, "routed_scaling_factor": 16.0}
CONFIGS = {"tiny-v2": PRESETS["tiny-v2"], "v2-grouped": V2_LIKE}


def traces(raw: dict, start_pos: int, decode: int, attn: str = "naive", seed: int = 0):
    cfg = Config.from_hf(copy.deepcopy(raw), "test config")
    synthetic = SyntheticWeights(cfg, seed)
    arrays = {n: synthetic.get(n) for n in weight_shapes(cfg)}
    rec = Recorder()
    spec = RunSpec(ids=PROMPT, start_pos=start_pos, decode=decode, attn=attn)
    result = run(spec, [rec], ArrayWeights(cfg, arrays))
    steps = [np.array([[t]]) for t in result.generated] or None
    ref = hf_trace(cfg.to_hf(), arrays, np.array([PROMPT]), start_pos=start_pos, decode_ids=steps)
    return rec.tensors(), ref


def assert_every_catalogued_name_compared(raw: dict, mine: dict) -> None:
    cfg = Config.from_hf(copy.deepcopy(raw), "test config")
    compared = {unphased(n).split(".", 2)[-1] if unphased(n).startswith("layers.") else unphased(n) for n in mine}
    cat = catalog.load()
    naive = {e["name"] for layer in range(cfg.num_hidden_layers) for e in cat.layer_sequence(cfg, layer, "naive")}
    naive |= set(derive.global_names(cfg, ("embed", "rope_cos", "rope_sin", "norm", "logits")))
    assert naive <= compared, naive - compared


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("start_pos, decode", [(0, 2), (4093, 3)])
def test_every_v2_tensor_matches_transformers(config, start_pos, decode):
    mine, ref = traces(CONFIGS[config], start_pos, decode)
    assert list(mine) and set(mine) == set(ref), sorted(set(mine) ^ set(ref))
    failures = {name: why for name in mine if (why := compare(name, mine, ref))}
    assert not failures, failures
    assert_every_catalogued_name_compared(CONFIGS[config], mine)
    if config == "v2-grouped":  # the group rule is at work: some token's k best experts overall span a dropped group
        scores, mask = mine["prefill.layers.1.mlp.gate.softmax_scores"], mine["prefill.layers.1.mlp.gate.group_mask"]
        groups_of_best = np.argsort(-scores, axis=1)[:, :4] // (scores.shape[1] // mask.shape[1])  # [N, k]
        assert (np.take_along_axis(mask, groups_of_best, axis=1) == 0).any()


@pytest.mark.parametrize("config", list(CONFIGS))
def test_every_v2_tensor_on_the_absorbed_path_matches_transformers(config):
    mine, ref = traces(CONFIGS[config], 4093, 3, attn="absorb")  # positions 4093..4102: past 4096, decode too
    only_mine = {unphased(n).split(".", 2)[-1] for n in mine if n not in ref}  # the absorbed path's own
    assert only_mine == {"self_attn.q_nope_absorbed", "self_attn.attn_output_latent"}, only_mine
    shared = [n for n in mine if n in ref]
    for key in ("layers.1.self_attn.attn_weights", "layers.1.self_attn.o_proj", "logits"):
        assert sum(unphased(n) == key for n in shared) == 4, key  # the prefill and the 3 decode steps
    failures = {name: why for name in shared if (why := compare(name, mine, ref))}
    assert not failures, failures


@pytest.mark.parametrize("config", list(CONFIGS))
def test_v2_rope_and_softmax_scale_match_transformers(config):
    cfg = Config.from_hf(copy.deepcopy(CONFIGS[config]), "test config")
    model = Transformer(SyntheticWeights(cfg))
    ulps = np.abs(model.inv_freq.view(np.int32).astype(np.int64) - hf_inv_freq(cfg.to_hf()).view(np.int32))
    assert ulps.max() <= 1
    # mscale = mscale_all_dim = 0.707: the cos/sin factor is 1, the softmax scale grows by (0.0707 ln 40 + 1)^2
    assert model.rope_mscale == pytest.approx(hf_attention_scaling(cfg.to_hf()), rel=1e-12) == 1.0
    assert model.softmax_scale == pytest.approx(hf_softmax_scale(cfg.to_hf()), rel=1e-12)
    assert model.softmax_scale == pytest.approx(cfg.qk_head_dim**-0.5 * (0.0707 * np.log(40) + 1) ** 2, rel=1e-12)


def gaps_at_the_cut(scores: np.ndarray, k: int) -> np.ndarray:
    """For each query with more than k earlier positions: how far its k-th best index score is
    from the next, relative to the row's largest (0 would be a tie that either side may break)."""
    rows = scores.reshape(-1, scores.shape[-1])
    gaps = []
    for row in rows:
        finite = np.sort(row[np.isfinite(row)])[::-1]
        if len(finite) > k:
            gaps.append((finite[k - 1] - finite[k]) / np.abs(finite).max())
    return np.array(gaps)


@pytest.mark.parametrize("start_pos, decode, attn", [(0, 2, "naive"), (4093, 3, "naive"), (4093, 3, "absorb")])
def test_every_v32_tensor_and_the_chosen_positions_match_transformers(start_pos, decode, attn):
    raw = PRESETS["tiny-v32"]  # index_topk 4, fewer than the 7 prompt positions
    mine, ref = traces(raw, start_pos, decode, attn=attn)
    if attn == "absorb":  # transformers has no absorbed path: its naive tensors are left out of it
        ref = {n: v for n, v in ref.items() if n in mine}
        mine = {n: v for n, v in mine.items() if n in ref}
    chosen = [n for n in mine if n.endswith("indexer.topk_idx")]
    assert len(chosen) == 3 * (decode + 1)  # every layer, every step
    for name in chosen:  # tie-free data: the cut lies clear of the next score, so the choice is the data's
        scores = mine[name.replace("topk_idx", "index_scores")]
        assert (gaps_at_the_cut(scores, raw["index_topk"]) > 1e-4).all(), name
    assert list(mine) and set(mine) == set(ref), sorted(set(mine) ^ set(ref))
    failures = {name: why for name in mine if (why := compare(name, mine, ref))}
    assert not failures, failures
    if attn == "naive":
        assert_every_catalogued_name_compared(raw, mine)
    prefill = next(n for n in chosen if "layers.1." in n)
    assert (mine[prefill] >= 0).sum(axis=-1).tolist() == [[1, 2, 3, 4, 4, 4, 4]]  # positions dropped
