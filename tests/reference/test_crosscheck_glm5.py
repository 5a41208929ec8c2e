"""GLM-5: every named tensor against transformers' GlmMoeDsaForCausalLM, float32, same weights.

The test writes a tiny checkpoint in GLM-5's published layout (its config.json form with
`indexer_types`, BF16 tensors under DeepSeek-V3.2's names, no indexer weights in the "shared"
layer), stepper runs from that folder, transformers from the same values. `tiny-glm5`: GLM-5's
config.json at a small size (plain RoPE of theta 1e6, one expert group), the indexer keeping 4 of
the 7 prompt positions with interleaved RoPE, layer 2 "shared" (it reuses layer 1's choice).
Prefill then cached decode steps, at position 0 and past 4096; both MLA paths (transformers has
the naive one only). The chosen and reused positions are identical (on data with no tie at the
cut); every other tensor within relative error 1e-5.
"""

import copy
import os

import numpy as np
import pytest

if not os.environ.get("STEPPER_REQUIRE_CROSSCHECK"):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")

from helpers.compare import compare
from helpers.hf_families import catalogued_names, traces
from helpers.published import write_published
from test_crosscheck_families import gaps_at_the_cut

from stepper.families import read_config
from stepper.presets import PRESETS
from stepper.weights.names import weight_shapes

PROMPT = (17, 402, 999, 3, 256, 77, 640)
RAW = copy.deepcopy(PRESETS["tiny-glm5"])  # BF16, as GLM-5 is published
SEED = 1  # seed 0's weights give some queries index scores of 0.0 on both sides of the cut: a tie either may break


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    folder = tmp_path_factory.mktemp("glm5") / "tiny-glm5"
    cfg = read_config(copy.deepcopy(RAW), "test config")
    shapes = weight_shapes(cfg)
    assert not any(n.startswith("model.layers.2.self_attn.indexer.") for n in shapes)  # the shared layer has none
    assert "model.layers.1.self_attn.indexer.wq_b.weight" in shapes
    return folder, write_published(folder, RAW, shapes, seed=SEED)


@pytest.mark.parametrize("start_pos, decode, attn", [(0, 2, "naive"), (4093, 3, "naive"), (4093, 3, "absorb")])
def test_every_glm5_tensor_and_the_reused_choice_match_transformers(published, start_pos, decode, attn):
    folder, values = published
    mine, ref = traces(folder, copy.deepcopy(RAW), values, PROMPT, start_pos, decode, attn)
    chosen = [n for n in mine if n.endswith("indexer.topk_idx")]
    assert len(chosen) == 2 * (decode + 1)  # layers 0 and 1 choose, every step
    for name in chosen:
        assert (gaps_at_the_cut(mine[name.replace("topk_idx", "index_scores")], RAW["index_topk"]) > 1e-4).all(), name
    reused = [n for n in mine if n.endswith("reused_topk_idx")]
    assert len(reused) == decode + 1 and all(".layers.2." in n for n in reused)
    for name in reused:  # layer 2 attends exactly where layer 1 chose
        assert np.array_equal(mine[name], mine[name.replace("layers.2", "layers.1").replace("reused_", "")])
    assert list(mine) and set(mine) == set(ref), sorted(set(mine) ^ set(ref))
    failures = {name: why for name in mine if (why := compare(name, mine, ref))}
    assert not failures, failures
    if attn == "naive":
        expected, compared = catalogued_names(RAW, mine)
        own = {"self_attn.indexer.reused_mask", "self_attn.indexer.q_rope"}
        assert own <= expected <= compared, expected - compared
    first = "prefill.layers.1.self_attn.indexer.topk_idx" if decode else "layers.1.self_attn.indexer.topk_idx"
    assert (mine[first] >= 0).sum(axis=-1).tolist() == [[1, 2, 3, 4, 4, 4, 4]]  # positions dropped


def test_the_interleaved_index_rope_is_not_v32s():
    """The same weights as V3.2 (tiny-v32) choose other index queries: the rotation differs."""
    from stepper.model.indexer import rotate_index
    from stepper.model.rope import Rope
    glm, v32 = read_config(copy.deepcopy(RAW), "glm"), read_config(copy.deepcopy(PRESETS["tiny-v32"]), "v32")
    angle = np.array([[0.3, 1.1, 0.7, 2.0, 0.1, 0.2, 0.5, 0.9]], dtype=np.float32)  # [T=1, rope/2]
    rope = Rope(np.cos(angle), np.sin(angle), 1.0)
    x = np.arange(32, dtype=np.float32).reshape(1, 1, 32)  # [B, T, Di]
    ours = rotate_index(x, rope, glm)
    # by hand: pair (x0, x1) turns by angle 0: its rotated x0 lands first, its rotated x1 at dim 8
    assert ours[0, 0, 0] == pytest.approx(0 * np.cos(0.3) - 1 * np.sin(0.3))
    assert ours[0, 0, 8] == pytest.approx(1 * np.cos(0.3) + 0 * np.sin(0.3))
    assert np.array_equal(ours[..., 16:], x[..., 16:])  # past the rope dims: unchanged
    halves = rotate_index(x, rope, v32)  # V3.2: dim 0 turns with dim 8
    assert halves[0, 0, 0] == pytest.approx(0 * np.cos(0.3) - 8 * np.sin(0.3))
