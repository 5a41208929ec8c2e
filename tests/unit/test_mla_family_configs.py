"""The MLA families' config.json readers (stepper/families): each published config read into
stepper's MLA config with its renamed fields and defaults, written back by `published` as the
family writes it, and a field stepper does not build refused naming that field."""

import copy
import dataclasses

import pytest

from stepper.config import Config
from stepper.errors import StepperError
from stepper.presets import PRESETS, preset


def read(raw: dict) -> Config:
    return Config.from_hf(copy.deepcopy(raw), "config.json")


def refusal(raw: dict) -> str:
    with pytest.raises(StepperError) as e:
        read(raw)
    return str(e.value)


@pytest.mark.parametrize("name", ["tiny-sarvam", "sarvam-105b"])
def test_the_published_config_reads_back_from_what_synth_writes(name):
    cfg = preset(name)
    assert read(cfg.to_hf()) == dataclasses.replace(cfg, name="config.json")


def test_sarvam_reads_its_older_names_as_deepseek_v3s():
    raw = PRESETS["tiny-sarvam"]
    cfg = read(raw)
    assert (cfg.n_routed_experts, cfg.n_shared_experts) == (raw["num_experts"], raw["num_shared_experts"]) == (16, 1)
    assert cfg.rope_scaling.factor == 4.0 and cfg.q_lora_rank is None  # deepseek_yarn is YaRN
    assert read({**raw, "head_dim": 12345}) == cfg  # vLLM's cache width, not the attention's: not read
    written = cfg.to_hf()
    assert "n_routed_experts" not in written and written["rope_scaling"]["type"] == "deepseek_yarn"
    full = preset("sarvam-105b")  # SarvamMLAConfig's defaults: 32 layers of 128 experts, top 8, one group
    assert (full.num_hidden_layers, full.n_routed_experts, full.num_experts_per_tok, full.n_group) == (32, 128, 8, 1)


@pytest.mark.parametrize("raw, field", [
    ({**PRESETS["tiny-sarvam"], "rope_interleave": False}, "rope_interleave"),
    ({**PRESETS["tiny-sarvam"], "q_head_dim": 64}, "q_head_dim"),
    ({**PRESETS["tiny-sarvam"], "n_routed_experts": 8}, "num_experts"),
])
def test_a_field_stepper_does_not_build_is_refused_by_name(raw, field):
    assert f"field '{field}'" in refusal(raw)
