"""LongCat-Flash: every named tensor against transformers' LongcatFlashForCausalLM, float32.

The test writes a tiny checkpoint in LongCat-Flash's published layout (its config.json form:
num_layers, ffn_hidden_size, moe_topk, zero_expert_num, ...; BF16 tensors, the two sublayers'
modules as `self_attn.0.` / `mlps.1.`, the router as `mlp.router.classifier`, the routed experts
one by one, none for the zero experts), stepper runs from that folder, transformers from the same
values. `tiny-longcat`: 8 experts and 4 zero experts, 3 chosen. Prefill then cached decode steps
at 0 and past 4096, both MLA paths; the chosen experts, zero experts included, identical; every
other tensor within relative error 1e-5.
"""

import copy
import os

import numpy as np
import pytest

if not os.environ.get("STEPPER_REQUIRE_CROSSCHECK"):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")

from helpers.compare import compare
from helpers.hf_families import longcat_trace
from helpers.published import write_published

from stepper.families import read_config
from stepper.presets import PRESETS
from stepper.seams.trace import Recorder
from stepper.session import RunSpec, run
from stepper.weights.names import weight_shapes

PROMPT = (17, 402, 999, 3, 256, 77, 640)
RAW = PRESETS["tiny-longcat"]


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    folder = tmp_path_factory.mktemp("longcat") / "tiny-longcat"
    shapes = weight_shapes(read_config(copy.deepcopy(RAW), "test config"))
    assert shapes["model.layers.1.mlp.router.classifier.weight"] == (8 + 4, 256)  # zero experts are scored too
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in shapes
    assert "model.layers.1.mlp.experts.8.up_proj.weight" not in shapes
    return folder, write_published(folder, RAW, shapes)


@pytest.mark.parametrize("start_pos, decode, attn", [(0, 2, "naive"), (4093, 2, "naive"), (4093, 2, "absorb")])
def test_every_longcat_tensor_and_the_zero_experts_match_transformers(published, start_pos, decode, attn):
    folder, values = published
    rec = Recorder()
    result = run(RunSpec(model=str(folder), ids=PROMPT, start_pos=start_pos, decode=decode, attn=attn), [rec])
    mine = rec.tensors()
    steps = [np.array([[t]]) for t in result.generated]
    ref = longcat_trace(copy.deepcopy(RAW), values, np.array([PROMPT]), start_pos=start_pos, decode_ids=steps)
    if attn == "absorb":
        ref = {n: v for n, v in ref.items() if n in mine}
        mine = {n: v for n, v in mine.items() if n in ref}
    assert list(mine) and set(mine) == set(ref), sorted(set(mine) ^ set(ref))
    failures = {name: why for name in mine if (why := compare(name, mine, ref))}
    assert not failures, failures
    chosen = np.concatenate([mine[n].ravel() for n in mine if n.endswith("mlp.gate.topk_idx")])
    assert (chosen >= 8).any() and (chosen < 8).any()  # zero experts and real ones were chosen
    assert any(np.abs(mine[n]).max() > 0 for n in mine if n.endswith("zero_expert_output"))
