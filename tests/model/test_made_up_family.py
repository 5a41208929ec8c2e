"""A family added from the test tree alone (tests/model/made_up/: its module, its own router, one
tensor no shipped family emits and that tensor's catalogue part file) runs through stepper.run and
the command line with every tensor it emits named, explained and listed in its layer's tree."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers.cli import one_line, stepper
from made_up import tempered  # tests/model/made_up: pytest puts this test's folder on sys.path

from stepper import catalog, families
from stepper import run as stepper_run
from stepper.errors import StepperError
from stepper.families import derive, load_config
from stepper.presets import PRESETS
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.synth_checkpoint import synth_checkpoint

NEW = "mlp.gate.tempered_scores"


@pytest.fixture
def config_json(tmp_path: Path) -> Path:
    raw = {**PRESETS["tiny-v2"], "_name_or_path": "tiny-tempered", "model_type": tempered.MODEL_TYPE,
           "router_temperature": 0.5}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    return path


def test_its_config_is_refused_until_the_family_is_registered_and_read_by_its_own_class(config_json):
    refused = r"field 'model_type' must be one of deepseek_v3, .*kimi_k25, got 'tempered_moe'"
    with pytest.raises(StepperError, match=refused):
        load_config(config_json)
    with families.registered(tempered.FAMILY):
        cfg = load_config(config_json)
        assert tempered.MODEL_TYPE in families.model_types()
    assert type(cfg) is tempered.TemperedConfig and cfg.router_temperature == 0.5 and cfg.scoring_func == "softmax"
    assert tempered.MODEL_TYPE not in families.model_types()  # the block's end takes it out again


def test_the_layer_sequence_is_what_its_code_emits(config_json):
    with families.registered(tempered.FAMILY):
        cfg = load_config(config_json)
        moe_layer = next(i for i in range(cfg.num_hidden_layers) if cfg.is_moe_layer(i))
        keys = derive.layer_keys(cfg, moe_layer)
        names = [e["name"] for e in catalog.load().layer_sequence(cfg, moe_layer)]
        dense = [e["name"] for e in catalog.load().layer_sequence(cfg, 0)]
    assert names == keys
    router = [k for k in keys if k.startswith("mlp.gate.")]
    assert router == ["mlp.gate.logits", NEW, "mlp.gate.topk_idx", "mlp.gate.topk_weight"]
    assert "mlp.shared_output" not in keys and NEW not in dense and "mlp.act" in dense
    assert catalog.load().entry(NEW) is None  # its part file is read while the family is registered only


def test_it_runs_through_stepper_run_with_every_tensor_named_and_explained(config_json):
    with families.registered(tempered.FAMILY):
        run = stepper_run(config_json, prompt_len=5, decode=1, attn="naive")
        explained = {name: run.explain(name) for name in run}
    assert run.names == run.emitted and len(run) > 0
    assert all(entry["description"] != "(not in the catalogue)" and entry["explain"] for entry in explained.values())
    assert explained[f"decode0.layers.1.{NEW}"]["formula"].startswith("tempered_scores = softmax(logits / ")
    for phase in ("prefill", "decode0"):
        gate = f"{phase}.layers.1.mlp.gate"
        logits, scores = np.asarray(run[f"{gate}.logits"]), np.asarray(run[f"{phase}.layers.1.{NEW}"])
        z = logits.astype(np.float64) / 0.5
        by_hand = np.exp(z - z.max(axis=1, keepdims=True))
        np.testing.assert_allclose(scores, by_hand / by_hand.sum(axis=1, keepdims=True), rtol=2e-6, atol=1e-7)
        idx, weight = np.asarray(run[f"{gate}.topk_idx"]), np.asarray(run[f"{gate}.topk_weight"])
        chosen = np.take_along_axis(scores, idx, axis=1)
        assert np.all(chosen.min(axis=1) >= np.sort(scores, axis=1)[:, -idx.shape[1]])  # the k best
        np.testing.assert_allclose(weight, chosen / chosen.sum(axis=1, keepdims=True), rtol=1e-6)


def test_a_checkpoint_of_it_is_read_through_the_registry(config_json, tmp_path):
    with families.registered(tempered.FAMILY):
        cfg = load_config(config_json)
        folder = synth_checkpoint(SyntheticWeights(cfg, seed=3), tmp_path / "ck")
        from_disk = stepper_run(folder, prompt_len=4, attn="absorb", seed=3)
        synthetic = stepper_run(config_json, prompt_len=4, attn="absorb", seed=3)
    assert type(from_disk.config) is tempered.TemperedConfig and from_disk.config.router_temperature == 0.5
    assert json.loads((folder / "config.json").read_text())["router_temperature"] == 0.5
    name = f"layers.1.{NEW}"
    # the same weights, read back
    np.testing.assert_array_equal(np.asarray(from_disk[name]), np.asarray(synthetic[name]))


def test_the_command_line_explains_and_lists_its_tensor(config_json):
    with families.registered(tempered.FAMILY):
        explained = stepper("explain", "tempered_scores", "--model", config_json, "--plain")
        tree = stepper("tree", "--model", config_json, "--plain")
        ran = stepper("run", "--model", config_json, "--prompt-len", "3", "--only", f"layers.1.{NEW}", "--plain")
    assert explained.returncode == 0, explained.stderr
    assert NEW in explained.stdout and "softmax(logits / router_temperature" in explained.stdout
    assert tree.returncode == 0, tree.stderr
    assert NEW in tree.stdout and "The made-up tempered" in tree.stdout  # its description
    assert ran.returncode == 0, ran.stderr
    assert f"layers.1.{NEW}" in ran.stdout
    refused = one_line(stepper("tree", "--model", config_json))  # not registered: one line, the types it knows
    assert "field 'model_type' must be one of" in refused and "tempered_moe" in refused


def test_a_bad_temperature_is_one_line_naming_the_file_and_field(config_json):
    raw = json.loads(config_json.read_text())
    config_json.write_text(json.dumps({**raw, "router_temperature": 0}))
    with families.registered(tempered.FAMILY):
        line = one_line(stepper("tree", "--model", config_json))
    assert str(config_json) in line and "'router_temperature' must be a finite number > 0, got 0" in line
