"""Kimi Linear's config and checkpoint: the published config.json read field by field, its layer
lists checked, the presets, synth's published layout, the memory a layer keeps, and bad input
refused in one line that names the file, the field or tensor and what was expected (exit 2)."""

import copy
import json

import numpy as np
import pytest
from helpers.cli import refused, stepper
from helpers.malformed import with_tensor, without_tensor
from safetensors.numpy import load_file

from stepper import families
from stepper.errors import StepperError
from stepper.families import kimi_linear as kl
from stepper.presets import KIMI_LINEAR_48B, PRESETS, preset
from stepper.weights.names import weight_shapes


def test_the_published_config_reads_as_published():
    cfg = families.read_config(KIMI_LINEAR_48B, "config.json")
    assert type(cfg) is kl.KimiLinearConfig
    assert cfg.full_attn_layers == (3, 7, 11, 15, 19, 23, 26)  # 1-based 4, 8, ..., 27
    assert len(cfg.kda_layers) == 20 and not set(cfg.kda_layers) & set(cfg.full_attn_layers)
    assert (cfg.linear_num_heads, cfg.linear_head_dim, cfg.short_conv_kernel_size) == (32, 128, 4)
    assert (cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.n_shared_experts) == (256, 8, 1)
    assert cfg.routed_scaling_factor == 2.446 and cfg.norm_topk_prob and cfg.rms_norm_eps == 1e-5
    assert not cfg.is_moe_layer(0) and cfg.is_moe_layer(1) and cfg.is_moe_layer(26)
    assert cfg.qk_head_dim == 192 and cfg.q_lora_rank is None and not cfg.rotary
    assert kl.parse(cfg.to_hf(), "again") == kl.KimiLinearConfig(**{**cfg.__dict__, "name": "again"})
    assert preset("tiny-kimi-linear").kda_layers == (0, 1, 2)


def test_the_special_token_ids_are_read_and_written_back_as_published():
    """The published ids (transformers' KimiLinearConfig defaults to them), and the tiny model's inside
    its vocabulary of 1000 (where the published model has them, counted from the end): the model reads
    none, but a checkpoint synth writes carries them, and transformers' embedding refuses a padding row
    outside its table."""
    full, tiny = preset("kimi-linear-48b-a3b"), preset("tiny-kimi-linear")
    assert (full.bos_token_id, full.eos_token_id, full.pad_token_id) == (163584, 163586, 163839)
    assert {k: full.to_hf()[k] for k in kl.TOKEN_ID_FIELDS} == {k: KIMI_LINEAR_48B[k] for k in kl.TOKEN_ID_FIELDS}
    assert (tiny.bos_token_id, tiny.eos_token_id, tiny.pad_token_id) == (744, 746, 999)
    assert tiny.vocab_size - tiny.pad_token_id == full.vocab_size - full.pad_token_id == 1
    assert tiny.vocab_size - tiny.bos_token_id == full.vocab_size - full.bos_token_id == 256
    listed = kl.parse({**KIMI_LINEAR_48B, "eos_token_id": [163586, 163585], "pad_token_id": None}, "cfg.json")
    assert listed.eos_token_id == (163586, 163585) and listed.pad_token_id is None
    assert listed.to_hf()["eos_token_id"] == [163586, 163585] and "pad_token_id" not in listed.to_hf()
    assert kl.miniature(full, 3).pad_token_id is None  # a vocabulary of 16


def test_memory_per_layer_in_numbers():
    cfg = preset("kimi-linear-48b-a3b")
    assert kl.kda_layer_bytes(cfg) == (32 * 128 * 128 + 3 * 3 * 32 * 128) * 4  # 2,244,608 B at any length
    assert kl.mla_bytes_per_position(cfg) == (512 + 64) * 4
    assert kl.mla_bytes_per_position(cfg, "naive") == 32 * (192 + 128) * 4
    line = cfg.memory_line(32768)
    assert "KDA layers keep 2,244,608 B each at any length" in line and "MLA layers 2,304 B per position" in line
    assert "20 KDA layers 43 MiB, 7 MLA layers 504 MiB" in line  # 20 x 2,244,608 B; 7 x 2304 x 32768 B, growing


def linear(**changes) -> dict:
    raw = copy.deepcopy(KIMI_LINEAR_48B)
    raw["linear_attn_config"].update(changes)
    return raw


ALL_BUT_4 = [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26]


@pytest.mark.parametrize("raw, message", [
    (linear(kda_layers=[4, *ALL_BUT_4]),
     ("cfg.json: field 'linear_attn_config' lists layer 4 twice (kda_layers, full_attn_layers); "
      "each layer 1..27 must be in exactly one")),
    (linear(kda_layers=ALL_BUT_4[:-1]),
     ("cfg.json: field 'linear_attn_config' leaves layer 26 out of kda_layers and full_attn_layers; "
      "each layer 1..27 must be in exactly one")),
    (linear(full_attn_layers=[0, 4, 8, 12, 16, 20, 24, 27]),
     ("cfg.json: field 'linear_attn_config.full_attn_layers' lists layer 0, outside 1..27 "
      "(1-based, num_hidden_layers 27)")),
    (linear(kda_layers="1-3"),
     "cfg.json: field 'linear_attn_config.kda_layers' must be a list of 1-based layer numbers, got '1-3'"),
    ({**KIMI_LINEAR_48B, "linear_attn_config": None}, "cfg.json: field 'linear_attn_config' must be an object"),
    (linear(short_conv_kernel_size=0),
     "cfg.json: field 'linear_attn_config.short_conv_kernel_size' must be >= 1, got 0"),
    ({**KIMI_LINEAR_48B, "q_lora_rank": 1536}, "cfg.json: field 'q_lora_rank' must be null"),
    ({**KIMI_LINEAR_48B, "mla_use_nope": False}, "cfg.json: field 'mla_use_nope' must be true"),
    ({**PRESETS["tiny-kimi-linear"], "pad_token_id": 163839},
     ("cfg.json: field 'pad_token_id' must be a token id in -1000..999 (vocab_size 1000; transformers' embedding "
      "takes it as its padding row), got 163839")),
    ({**KIMI_LINEAR_48B, "bos_token_id": "163584"},
     "cfg.json: field 'bos_token_id' must be a token id (a whole number), got '163584'"),
    ({**KIMI_LINEAR_48B, "eos_token_id": [163586, 1.5]},
     "cfg.json: field 'eos_token_id' must be a token id or a list of them (a whole number), got [163586, 1.5]"),
    ({**KIMI_LINEAR_48B, "eos_token_id": []},
     "cfg.json: field 'eos_token_id' must be a token id or a list of them (a whole number), got []"),
    ({**KIMI_LINEAR_48B, "pad_token_id": True},
     "cfg.json: field 'pad_token_id' must be a token id (a whole number), got True"),
])
def test_bad_configs_are_one_line_naming_the_field(raw, message):
    with pytest.raises(StepperError) as e:
        families.read_config(raw, "cfg.json")
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory):
    """`stepper synth` of tiny-kimi-linear: the published layout."""
    folder = tmp_path_factory.mktemp("synth") / "tiny-kimi-linear"
    assert stepper("synth", "--model", "tiny-kimi-linear", "--out", folder).returncode == 0
    return folder


def test_synth_writes_the_published_layout_and_it_runs(synthesized):
    cfg = preset("tiny-kimi-linear")
    stored = {}
    for shard in synthesized.glob("*.safetensors"):
        stored.update(load_file(str(shard)))
    assert set(stored) == set(weight_shapes(cfg))
    assert stored["model.layers.0.self_attn.q_conv1d.weight"].shape == (128, 1, 4)
    assert stored["model.layers.1.block_sparse_moe.experts.15.w2.weight"].shape == (160, 48)
    assert stored["model.layers.3.self_attn.kv_a_proj_with_mqa.weight"].shape == (64 + 16, 160)
    assert stored["model.layers.1.self_attn.A_log"].dtype == np.float32  # as published: the decay in F32
    assert str(stored["model.layers.1.self_attn.q_proj.weight"].dtype) == "bfloat16"
    written = json.loads((synthesized / "config.json").read_text())
    assert written["linear_attn_config"]["kda_layers"] == [1, 2, 3]
    assert (written["bos_token_id"], written["eos_token_id"], written["pad_token_id"]) == (744, 746, 999)
    out = stepper("run", "--model", synthesized, "--plain", "--prompt-len", "3", "--only", "logits")
    assert out.returncode == 0, out.stderr
    assert "KDA layers keep 20,992 B each at any length" in out.stdout


@pytest.mark.parametrize("edit, message", [
    (with_tensor("model.layers.2.self_attn.k_conv1d.weight", shape=[128, 4]),
     "'model.layers.2.self_attn.k_conv1d.weight'"),
    (without_tensor("model.layers.0.self_attn.A_log"), "'model.layers.0.self_attn.A_log'"),
])
def test_a_bad_tensor_is_one_line_naming_it(synthesized, tmp_path, edit, message):
    import shutil

    folder = shutil.copytree(synthesized, tmp_path / "broken")
    edit(folder)
    line = refused(stepper("run", "--model", folder, "--plain", "--prompt-len", "2"))
    assert message in line and str(folder.name) in line
    expected = "[128, 1, 4]" if "conv1d" in message else "[1, 1, 4, 1]"
    assert expected in line


def test_a_pad_token_id_outside_the_vocabulary_is_one_line_from_the_command(tmp_path):
    """A tiny config.json with the published model's padding row (163839): transformers cannot build it,
    and a checkpoint synth wrote of it would carry the id on."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**PRESETS["tiny-kimi-linear"], "pad_token_id": 163839}))
    for command in (("run", "--model", config, "--plain"), ("synth", "--model", config, "--out", tmp_path / "ck")):
        assert refused(stepper(*command)) == (f"{config}: field 'pad_token_id' must be a token id in -1000..999 "
                                              "(vocab_size 1000; transformers' embedding takes it as its padding "
                                              "row), got 163839")
    assert not (tmp_path / "ck").exists()


def test_every_preset_reads_through_its_family():
    kinds = {name: type(preset(name)).__name__ for name in PRESETS}
    assert kinds["tiny-kimi-linear"] == kinds["kimi-linear-48b-a3b"] == "KimiLinearConfig"
    assert kinds["tiny"] == "Config"
