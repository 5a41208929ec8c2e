"""Fixtures of the MLA families grown from DeepSeek-V3, with transformers' names as aliases.

For each, the real transformers model of the family runs on the fixture's weights with a forward
hook (and pre-hook) on every module (test_naming_families.hooked_run: no stepper naming
involved), and that dump, named as transformers names things, verifies against the fixture
through the family's naming table (stepper/fixtures/naming/transformers-<model_type>.json); a
perturbed module output is named as the first divergence.

- tiny-glm5-shared (GLM-5): layers 1 and 2 of tiny-glm5, layer 1 choosing with its indexer, layer
  2 "shared" (no indexer: it reuses layer 1's choice), prefill and a decode step.
- tiny-minicpm3 (MiniCPM3): the whole model, BF16 weights as published: the scaled embedding,
  LongRoPE's tables, the tied lm_head reading the final norm divided by hidden / dim_model_base.
"""

import os
import re
from pathlib import Path

import pytest
from safetensors.numpy import save_file
from test_naming import perturbed
from test_naming_families import hooked_run

from stepper.fixtures import verify
from stepper.fixtures.fixture import load
from stepper.fixtures.show import summary_line

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def families():
    if not os.environ.get("STEPPER_REQUIRE_CROSSCHECK"):
        pytest.importorskip("torch")
        pytest.importorskip("transformers")
    import helpers.hf_families  # noqa: F401  (registers the families with helpers.hf_reference)


def test_a_transformers_dump_of_the_glm5_fixture_verifies(tmp_path):
    fixture = load(ROOT / "fixtures" / "tiny-glm5-shared")
    dump = hooked_run(fixture)  # every layer ran; the fixture holds layers 1 and 2 (no embedding, no logits)
    dump = {name: value for name, value in dump.items() if re.search(r"\.layers\.[12][.:\[]", name)}
    assert "prefill.model.layers.1.self_attn.indexer.wk" in dump
    assert not any(".layers.2.self_attn.indexer" in name for name in dump)  # the shared layer has none
    path = tmp_path / "hf.safetensors"
    save_file(dump, str(path))
    verdict = verify.verify(fixture, path, names="transformers")
    assert verdict.count("mismatch") == 0, summary_line(verdict)
    assert verdict.unknown == [] and not verdict.ambiguous, verdict.unknown[:5]
    matched = {c.name.split(".", 1)[1] for c in verdict.checks if c.status == "match"}
    assert {"layers.1.self_attn.indexer.k_norm", "layers.1.self_attn.indexer.topk_idx", "layers.2.self_attn.kv",
            "layers.2.self_attn.attn_weights", "layers.2.mlp.gate.topk_idx", "layers.2.output"} <= matched
    assert {c.name.split(".")[0] for c in verdict.checks if c.status == "match"} == {"prefill", "decode0"}
    bad = verify.verify(fixture, perturbed(dump, "decode0.model.layers.1.self_attn.indexer.k_norm",
                                           tmp_path / "bad.safetensors"), names="transformers")
    assert bad.first["name"] == "decode0.layers.1.self_attn.indexer.k_norm"


def test_a_transformers_dump_of_the_minicpm3_fixture_verifies(tmp_path):
    fixture = load(ROOT / "fixtures" / "tiny-minicpm3")
    dump = hooked_run(fixture)
    path = tmp_path / "hf.safetensors"
    save_file(dump, str(path))
    verdict = verify.verify(fixture, path, names="transformers")
    assert verdict.count("mismatch") == 0, summary_line(verdict)
    assert verdict.unknown == [] and not verdict.ambiguous, verdict.unknown[:5]
    matched = {c.name.split(".", 1)[1] for c in verdict.checks if c.status == "match"}
    assert {"embed_scaled", "rope_cos", "layers.1.self_attn.kv", "layers.1.attn_residual", "layers.2.output",
            "norm_scaled", "logits"} <= matched
    bad = verify.verify(fixture, perturbed(dump, "decode0.model.layers.1.self_attn.kv_a_layernorm",
                                           tmp_path / "bad.safetensors"), names="transformers")
    assert bad.first["name"] == "decode0.layers.1.self_attn.compressed_kv_norm"
