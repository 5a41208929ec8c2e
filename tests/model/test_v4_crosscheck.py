"""The whole DeepSeek-V4 model against transformers' DeepseekV4ForCausalLM.

The test writes a tiny checkpoint in the published layout (stepper synth: FP8 e4m3 weights with
E8M0 `.scale` blocks, FP4 experts, BF16, `tid2eid`, the MTP block, 5+5-digit shards), stepper reads
it back, and transformers gets the same weights exactly dequantized, in float32. The config has a
sliding, a CSA (ratio 4, with the indexer) and an HCA layer (ratio 8), two hash-routed and two
score-routed MoE layers. A prompt of 38 positions closes 9 CSA and 4 HCA windows; two decode steps
follow, the second closing one window of each. Every tensor both sides name is compared at
relative error <= 1e-5, and every expert and indexer choice is the same."""

from __future__ import annotations

import numpy as np
import pytest

from stepper.families.deepseek_v4_checkpoint import V4Checkpoint
from tests.helpers import hf_v4

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPT = 38
STEPS = 2


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    folder = tmp_path_factory.mktemp("v4") / "checkpoint"
    mine, ref, result, _ = hf_v4.both_runs(hf_v4.TINY_V4, folder, PROMPT, STEPS)
    return mine, ref, result, folder


def test_every_tensor_both_name_matches_in_prefill_and_decode(both):
    mine, ref, _, _ = both
    mine = {k: (v.reshape(ref[k].shape) if k.endswith("routed_output") and k in ref else v) for k, v in mine.items()}
    checked = sorted(set(mine) & set(ref) - {k for k in ref if k.endswith(("attn.indexer.chosen", "_idx"))})
    # per step: each layer's 12 hyper-connection tensors, 7 of the residual and norms, 5 of the MoE, the
    # compressed layers' entries (3), the 6 of the two ends (embed_streams, hc_head's 3, final_norm, logits)
    assert len(checked) == 3 * (4 * (12 + 7 + 5) + 3 + 6)
    wrong = {k: why for k in checked if (why := hf_v4.v4_compare(k, mine, ref))}
    assert wrong == {}
    assert {k.split(".", 1)[0] for k in checked} == {"prefill", "decode0", "decode1"}


def test_every_expert_and_indexer_choice_is_the_same(both):
    mine, ref, _, _ = both
    choices = sorted(k for k in ref if k.endswith(("attn.indexer.chosen", "hash_idx", "topk_idx")))
    assert len(choices) == 3 * (4 + 2)  # per step: each layer's experts, the two CSA layers' indexer picks
    for k in choices:
        assert np.array_equal(np.sort(mine[k], axis=-1), np.sort(ref[k], axis=-1)), k
    picks = mine["prefill.layers.1.attn.indexer.chosen"]  # [1, 38, index_topk 3]
    assert (picks[0, -1] >= 0).all() and (picks[0, :3] == -1).all()  # position 37 sees 9 entries, 0..2 none


def test_greedy_tokens_are_transformers_argmax(both):
    _, ref, result, _ = both
    for step, token in enumerate(result.generated):
        phase = "prefill" if step == 0 else f"decode{step - 1}"
        assert int(np.argmax(ref[f"{phase}.logits"][0, -1])) == token


def test_the_written_checkpoint_is_laid_out_as_published(both):
    checkpoint = V4Checkpoint(both[3])
    names = set(checkpoint.published.weight_map)
    assert {"embed.weight", "head.weight", "hc_head_fn", "layers.1.attn.indexer.compressor.ape",
            "layers.0.ffn.gate.tid2eid", "layers.3.ffn.gate.bias", "layers.2.ffn.experts.5.w2.scale"} <= names
    assert not any(n.startswith("model.") for n in names)
    assert any(n.startswith("mtp.0.") for n in checkpoint.unused)
    shards = sorted(p.name for p in checkpoint.path.glob("*.safetensors"))
    assert shards[0] == "model-00001-of-00007.safetensors" and len(shards) == 7
