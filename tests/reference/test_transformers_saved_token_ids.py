"""A tiny checkpoint as transformers' own save_pretrained writes it from a randomly initialised model
(the configuration class's defaults for what the caller leaves out) runs in stepper: the special
tokens' ids it keeps are the published model's, outside a tiny vocabulary, and transformers loads
such a config with a warning (the model reads none of them), so stepper reads it too."""

import json
import os

import pytest

if not os.environ.get("STEPPER_REQUIRE_CROSSCHECK"):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")

from helpers.cli import stepper
from transformers import AutoConfig, AutoModelForCausalLM

from stepper.presets import PRESETS

TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
NOT_GIVEN = ("architectures", "model_type", "_name_or_path", *TOKEN_IDS)


DEFAULTS = {"tiny-youtu": ("youtu", {"bos_token_id": 128000, "eos_token_id": 128001}),
            "tiny-axk1": ("axk1", {"bos_token_id": 163691, "eos_token_id": 163691})}


def saved(name: str) -> tuple[object, dict]:
    """transformers' config of the tiny preset's sizes, its token ids its class's defaults (past the
    vocabulary of 1000), and those defaults."""
    model_type, defaults = DEFAULTS[name]
    config = AutoConfig.for_model(model_type, **{k: v for k, v in PRESETS[name].items() if k not in NOT_GIVEN})
    assert {k: config.to_dict()[k] for k in defaults} == defaults
    return config, defaults


def test_a_checkpoint_transformers_saves_with_its_default_token_ids_runs(tmp_path):
    config, _ = saved("tiny-youtu")
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    out = stepper("run", "--model", tmp_path, "--prompt-len", "3", "--plain")
    assert out.returncode == 0 and not out.stderr, out.stderr


@pytest.mark.parametrize("name", DEFAULTS)
def test_a_config_transformers_saves_with_its_default_token_ids_is_read_and_written_back(tmp_path, name):
    config, defaults = saved(name)
    config.save_pretrained(tmp_path)
    out = stepper("synth", "--model", tmp_path / "config.json", "--out", tmp_path / "copy")
    assert out.returncode == 0 and not out.stderr, out.stderr
    written = json.loads((tmp_path / "copy" / "config.json").read_text())
    assert {k: written[k] for k in defaults} == defaults
