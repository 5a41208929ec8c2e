"""A.X-K2: every named tensor against transformers' AXK2ForCausalLM, float32, same weights.

The test writes a tiny checkpoint in A.X-K2's published layout (its config.json form, BF16
tensors: the fused query and gate as `q_b_proj`, the gated norms' `norm.weight`, `W_down`,
`W_up`, which transformers renames on load), stepper runs from that folder, transformers from the
same values renamed. `tiny-axk2`: V3.2's tiny layer with expert groups (the dropped ones at 0.0)
and the indexer keeping 4 of 7 positions. Prefill then cached decode steps, at 0 and past 4096,
both MLA paths; chosen experts and positions identical, the rest within relative error 1e-5.
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

from stepper.families import read_config
from stepper.presets import PRESETS
from stepper.weights.names import weight_shapes

PROMPT = (17, 402, 999, 3, 256, 77, 640)
RAW = PRESETS["tiny-axk2"]
GATED = {"input_layernorm_gate", "input_layernorm_gated", "self_attn.q_gate", "self_attn.attn_output_gated",
         "post_attention_layernorm_gate", "post_attention_layernorm_gated"}


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    folder = tmp_path_factory.mktemp("axk2") / "tiny-axk2"
    shapes = weight_shapes(read_config(copy.deepcopy(RAW), "test config"))
    assert shapes["model.layers.1.self_attn.q_b_proj.weight"] == (4 * (48 + 48), 2 * 192)  # query and gate
    assert "model.layers.1.post_attention_layernorm.W_up.weight" in shapes  # MoE layer: gated
    assert "model.layers.0.post_attention_layernorm.weight" in shapes  # dense layer: plain
    return folder, write_published(folder, RAW, shapes)


@pytest.mark.parametrize("start_pos, decode, attn", [(0, 2, "naive"), (4093, 2, "naive"), (4093, 2, "absorb")])
def test_every_axk2_tensor_matches_transformers(published, start_pos, decode, attn):
    folder, values = published
    mine, ref = traces(folder, copy.deepcopy(RAW), values, PROMPT, start_pos, decode, attn)
    assert list(mine) and set(mine) == set(ref), sorted(set(mine) ^ set(ref))
    failures = {name: why for name in mine if (why := compare(name, mine, ref))}
    assert not failures, failures
    if attn == "naive":
        expected, compared = catalogued_names(RAW, mine)
        assert GATED <= expected <= compared, expected - compared
    gate = mine["prefill.layers.1.self_attn.q_gate"]
    assert gate.shape == (1, 7, 4 * 48) and np.ptp(1 / (1 + np.exp(-gate))) > 0.5  # the gate varies: it does something
