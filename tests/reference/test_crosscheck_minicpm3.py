"""MiniCPM3: every named tensor against transformers' MiniCPM3ForCausalLM, float32, same weights.

The test writes a tiny checkpoint in MiniCPM3-4B's published layout (its config.json form with
LongRoPE factors, BF16 tensors under DeepSeek's names, no lm_head: tied), stepper runs from that
folder, transformers from the same values. Prefill then cached decode steps at position 0 (short
factors) and across original_max_position_embeddings (4096 in `tiny-minicpm3`: the decode step
that passes it switches to the long factors, in both); both MLA paths (transformers has the naive
one only: its naive-only tensors are left out of the absorbed comparison). Relative error <= 1e-5.
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
RAW = PRESETS["tiny-minicpm3"]


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    folder = tmp_path_factory.mktemp("minicpm3") / "tiny-minicpm3"
    cfg = read_config(copy.deepcopy(RAW), "test config")
    values = write_published(folder, RAW, weight_shapes(cfg))
    assert "lm_head.weight" not in values  # tied, as published
    return folder, values


@pytest.mark.parametrize("start_pos, decode, attn", [(0, 2, "naive"), (4088, 2, "naive"), (4088, 2, "absorb")])
def test_every_minicpm3_tensor_matches_transformers(published, start_pos, decode, attn):
    folder, values = published
    mine, ref = traces(folder, copy.deepcopy(RAW), values, PROMPT, start_pos, decode, attn)
    assert list(mine) and set(mine) == set(ref), sorted(set(mine) ^ set(ref))
    failures = {name: why for name in mine if (why := compare(name, mine, ref))}
    assert not failures, failures
    if attn == "naive":  # every catalogued name of the family was compared
        expected, compared = catalogued_names(RAW, mine)
        assert {"embed_scaled", "attn_scaled", "mlp_scaled", "norm_scaled"} <= expected <= compared, expected - compared
    if start_pos == 4088:  # positions 4088..4094, then 4095 (short factors), then 4096: past 4096, long ones
        for phase, position, factors in (("decode0", 4095, "short_factor"), ("decode1", 4096, "long_factor")):
            inv_freq = 1 / (np.array(RAW["rope_scaling"][factors]) * 10000.0 ** (np.arange(0, 16, 2) / 16))
            attention_factor = np.sqrt(1 + np.log(8192 / 4096) / np.log(4096))  # max / original positions
            want = np.cos(position * inv_freq) * attention_factor  # [rope/2], by hand in float64
            assert mine[f"{phase}.rope_cos"][0, :8] == pytest.approx(want, rel=1e-3, abs=1e-3)
