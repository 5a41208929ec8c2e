"""The whole DeepSeek-V4 model against transformers' DeepseekV4ForCausalLM past position 4096: a
prompt of 4100 positions, then two decode steps (stepper refuses --start-pos for V4, its caches
counting positions from 0, so a long context is a long prompt; and V4's prefill runs whole, so
there is no chunked prefill to check).

Two layers keep the reference's eager attention, which makes [H, T, T + entries] scores per layer,
to a few seconds: a CSA layer (ratio 4: 1025 entries, the indexer keeping 3 per query) that routes
by hash, and an HCA layer (ratio 8: 512 entries, every one attended) that routes by score; each
attends its sliding window of 8 too. The short prompt's cross-check (test_v4_crosscheck.py) has
the sliding-only layer and four layers' worth of streams.

Over 4100 queries, a few rows of the indexer's scores tie at its k-th pick (relu makes many
scores exactly 0, and the head weights may be negative), where either side's pick is right:
transformers takes stepper's there (helpers.hf_v4.Ties), and only there."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import hf_v4

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPT, STEPS = 4100, 2
LONG = {**hf_v4.TINY_V4, "num_hidden_layers": 2, "compress_ratios": [4, 8, 0], "num_hash_layers": 1,
        "max_position_embeddings": 8192}


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    return hf_v4.both_runs(LONG, tmp_path_factory.mktemp("v4-long") / "checkpoint", PROMPT, STEPS, settle_ties=True)


def test_every_tensor_both_name_matches_past_4096(both):
    mine, ref, _, _ = both
    mine = {k: (v.reshape(ref[k].shape) if k.endswith("routed_output") and k in ref else v) for k, v in mine.items()}
    checked = sorted(set(mine) & set(ref) - {k for k in ref if k.endswith(("attn.indexer.chosen", "_idx"))})
    # per step: each layer's 12 hyper-connection tensors, 7 of the residual and norms, 5 of the MoE, the
    # two compressed layers' entries, the 6 of the two ends (embed_streams, hc_head's 3, final_norm, logits)
    assert len(checked) == 3 * (2 * (12 + 7 + 5) + 2 + 6)
    # the cross-checks' 1e-5 (helpers.compare): 4100 positions leave it ten times over (the largest
    # measured error is 9e-7 relative, on hc_head's mixes): the sums each output is made of run over
    # the window and the chosen or HCA entries (at most 8 + 512 terms), not over the prompt
    wrong = {k: why for k in checked if (why := hf_v4.v4_compare(k, mine, ref))}
    assert wrong == {}
    assert mine["prefill.layers.0.attn.entries"].shape[1] == PROMPT // 4  # 1025 CSA entries, 512 HCA ones
    assert mine["prefill.layers.1.attn.entries"].shape[1] == PROMPT // 8


def test_every_expert_and_indexer_choice_is_the_same(both):
    mine, ref, _, settled = both
    choices = sorted(k for k in ref if k.endswith(("attn.indexer.chosen", "hash_idx", "topk_idx")))
    assert len(choices) == 3 * (2 + 1)  # per step: each layer's experts, the CSA layer's indexer picks
    for k in choices:
        assert np.array_equal(np.sort(mine[k], axis=-1), np.sort(ref[k], axis=-1)), k
    assert len(settled) <= 4, settled  # of 4100 rows: transformers' own picks everywhere else (2 measured)
    picks = mine["prefill.layers.0.attn.indexer.chosen"][0]  # [4100, index_topk 3]
    assert (picks[11:] >= 0).all() and (picks[-1] < PROMPT // 4).all()  # from position 11, 3 entries are ready
    assert (picks[-100:] < 256).any() and (picks[-100:] >= 768).any()  # the last queries pick near and far entries


def test_greedy_tokens_are_transformers_argmax(both):
    _, ref, result, _ = both
    for step, token in enumerate(result.generated):
        phase = "prefill" if step == 0 else f"decode{step - 1}"
        assert int(np.argmax(ref[f"{phase}.logits"][0, -1])) == token
