"""DeepSeek-V4's config: the published V4-Flash / V4-Pro files read into their layers' kinds (as
transformers reads the same files), parameter counts as published, and every refusal one line
naming the file, the field and what was expected."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from stepper.errors import StepperError
from stepper.families.deepseek_v4_config import V4Config, load_v4_config
from stepper.families.deepseek_v4_weights import weight_shapes
from stepper.presets import V4_PRESETS
from stepper.session import preset_config as v4_preset


@pytest.mark.parametrize("name", sorted(V4_PRESETS))
def test_presets_round_trip_through_config_json(name):
    cfg = v4_preset(name)
    assert V4Config.from_hf(json.loads(json.dumps(cfg.to_hf())), f"preset {name}") == cfg
    assert len(cfg.compress_ratios) == cfg.num_hidden_layers + cfg.num_nextn_predict_layers


@pytest.mark.parametrize(("name", "billions"), [("deepseek-v4-flash", 284), ("deepseek-v4-pro", 1600)])
def test_published_sizes_add_up_to_the_published_parameter_counts(name, billions):
    total = sum(math.prod(shape) for shape in weight_shapes(v4_preset(name)).values())  # without the MTP block
    assert abs(total / 1e9 - billions) / billions < 0.02


@pytest.mark.parametrize("name", ["deepseek-v4-flash", "deepseek-v4-pro"])
def test_layer_kinds_and_hash_layers_are_those_transformers_reads_from_the_same_file(name):
    transformers = pytest.importorskip("transformers")
    cfg = v4_preset(name)
    hf = transformers.DeepseekV4Config(**V4_PRESETS[name])
    kinds = {"sliding": "sliding_attention", "csa": "compressed_sparse_attention",
             "hca": "heavily_compressed_attention"}
    assert [kinds[cfg.layer_kind(i)] for i in range(cfg.num_hidden_layers)] == hf.layer_types
    assert ["hash_moe" if cfg.is_hash_layer(i) else "moe" for i in range(cfg.num_hidden_layers)] == hf.mlp_layer_types
    assert (cfg.qk_rope_head_dim, cfg.rope_scaling.factor, cfg.compress_rope_theta) == (
        hf.qk_rope_head_dim, hf.rope_parameters["compress"]["factor"], hf.rope_parameters["compress"]["rope_theta"])


def test_flash_reads_as_published():
    cfg = v4_preset("deepseek-v4-flash")
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.n_routed_experts, cfg.num_experts_per_tok) == (4096, 43, 256, 6)
    assert [cfg.layer_kind(i) for i in range(4)] == ["sliding", "sliding", "csa", "hca"]
    assert cfg.is_hash_layer(2) and not cfg.is_hash_layer(3)
    assert cfg.quantization.weight_block_size == (128, 128) and cfg.expert_dtype == "fp4"
    assert cfg.hc_mixes == 24


def broken(**changes) -> dict:
    raw = dict(V4_PRESETS["tiny-v4"])
    for key, value in changes.items():
        if value is None:
            raw.pop(key)
        else:
            raw[key] = value
    return raw


@pytest.mark.parametrize(("changes", "expected"), [
    ({"compress_ratios": [0, 4, 16, 4]}, ("field 'compress_ratios' must have 5 entries (num_hidden_layers 4 + "
                                          "num_nextn_predict_layers 1), got 4")),
    ({"compress_ratios": [0, 4, 16, 1, 0]}, "field 'compress_ratios[3]' must be 0 (sliding), 4 (CSA) or another ratio"),
    ({"compress_ratios": "0,4"}, "field 'compress_ratios' must be a list of 5 entries"),
    ({"compress_ratios": [0, 4, 8192, 4, 0]}, ("field 'compress_ratios[2]' (8,192) must not exceed "
                                               "max_position_embeddings (4,096): a window that long never closes")),
    ({"scoring_func": "sigmoid"}, "field 'scoring_func' must be 'sqrtsoftplus'"),
    ({"num_key_value_heads": 2}, "field 'num_key_value_heads' must be 1"),
    ({"hc_mult": None}, "field 'hc_mult' is missing"),
    ({"hc_eps": -1}, "field 'hc_eps' must be a finite number > 0, got -1"),
    ({"swiglu_limit": "10"}, "field 'swiglu_limit' must be a finite number > 0"),
    ({"o_groups": 3}, "field 'o_groups' (3) must divide num_attention_heads (4)"),
    ({"num_hash_layers": 5}, "field 'num_hash_layers' (5) must not exceed num_hidden_layers (4)"),
    ({"expert_dtype": "int4"}, "field 'expert_dtype' must be 'fp4' or 'fp8'"),
    ({"quantization_config": {**V4_PRESETS["tiny-v4"]["quantization_config"], "scale_fmt": "fp32"}},
     "field 'quantization_config.scale_fmt' must be 'ue8m0'"),
    ({"model_type": "deepseek_v3"}, "field 'model_type' must be 'deepseek_v4'"),
    ({"n_group": 8}, "field 'n_group' must be 1"),
    ({"sliding_window": 10**7}, ("field 'sliding_window' (10,000,000) must not exceed max_position_embeddings "
                                 "(4,096): the window's cache is that many positions")),
    ({"hc_sinkhorn_iters": 10**6}, "field 'hc_sinkhorn_iters' must be at most 1000, got 1000000"),
    ({"hc_sinkhorn_iters": 10**9}, "field 'hc_sinkhorn_iters' must be <= 16,777,216, got 1,000,000,000"),
    ({"rope_scaling": {"type": "yarn", "factor": 0.5, "original_max_position_embeddings": 256}},
     "field 'rope_scaling.factor' must be >= 1, got 0.5"),
])
def test_each_refusal_is_one_line_naming_the_file_and_field(changes, expected, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(broken(**changes)))
    with pytest.raises(StepperError) as e:
        load_v4_config(path)
    message = str(e.value)
    assert message.startswith(f"{path}: ") and expected in message and "\n" not in message


def saved_by_transformers(name: str, folder) -> dict:
    """The config.json transformers' save_pretrained writes for a published one (its own form)."""
    transformers = pytest.importorskip("transformers")
    transformers.DeepseekV4Config(**V4_PRESETS[name]).save_pretrained(folder)
    return json.loads((folder / "config.json").read_text())


@pytest.mark.parametrize("name", ["deepseek-v4-flash", "deepseek-v4-pro"])
def test_a_config_transformers_saved_reads_as_the_published_one_without_its_mtp_block(name, tmp_path):
    raw = saved_by_transformers(name, tmp_path)
    assert "compress_ratios" not in raw and "num_hash_layers" not in raw and "rope_scaling" not in raw
    read = load_v4_config(tmp_path / "config.json")
    published = v4_preset(name)
    assert read == dataclasses.replace(published, name=read.name, num_nextn_predict_layers=0,
                                       compress_ratios=published.compress_ratios[:published.num_hidden_layers])


GONE = object()  # a field taken out


def changed(raw: dict, path: str, value) -> dict:
    """raw with the field at a dotted path ("rope_parameters.compress.factor", "layer_types.3") set,
    or taken out (GONE)."""
    raw = json.loads(json.dumps(raw))
    *outer, last = path.split(".")
    block = raw
    for key in outer:
        block = block[int(key)] if isinstance(block, list) else block[key]
    if value is GONE:
        del block[last]
    else:
        block[int(last) if isinstance(block, list) else last] = value
    return raw


@pytest.mark.parametrize(("path", "value", "expected"), [
    ("layer_types.3", "global_attention", ("field 'layer_types[3]' must be one of sliding_attention, "
     "compressed_sparse_attention, heavily_compressed_attention, got 'global_attention'")),
    ("layer_types", ["sliding_attention"] * 42, ("field 'layer_types' must have one entry per layer "
     "(num_hidden_layers 43), got 42")),
    ("compress_rates.compressed_sparse_attention", 8, ("field 'compress_rates.compressed_sparse_attention' must be 4 "
     "(stepper tells a CSA layer by its ratio 4")),
    ("compress_rates.heavily_compressed_attention", 4, ("field 'compress_rates.heavily_compressed_attention' must be "
     "a whole number >= 2 other than 4")),
    ("mlp_layer_types.5", "hash_moe", ("field 'mlp_layer_types[5]' is 'hash_moe' after a 'moe' layer: the "
     "hash-routed layers must come first")),
    ("mlp_layer_types.5", "dense", "field 'mlp_layer_types[5]' must be 'hash_moe' or 'moe', got 'dense'"),
    ("rope_parameters.main.rope_type", "yarn", "field 'rope_parameters.main.rope_type' must be 'default'"),
    ("rope_parameters.compress.attention_factor", 1.2, ("field 'rope_parameters.compress.attention_factor' must be "
     "1.0 (V4 scales no cos and sin")),
    ("rope_parameters.compress.factor", 0.5, "field 'rope_parameters.compress.factor' must be >= 1, got 0.5"),
    ("rope_parameters.compress.rope_theta", 1000.0, ("field 'rope_parameters.compress.rope_theta' is 1000.0 but "
     "compress_rope_theta is 160000: give one, or both alike")),
    ("partial_rotary_factor", 0.25, ("field 'partial_rotary_factor' is 0.25 but "
     "rope_parameters.main.partial_rotary_factor, which transformers rotates by, is 0.125")),
    ("rope_parameters.compress.partial_rotary_factor", 0.25, ("field 'rope_parameters.compress.partial_rotary_factor' "
     "is 0.25 but rope_parameters.main.partial_rotary_factor is 0.125: stepper rotates as many dims in every layer")),
    ("qk_rope_head_dim", 32, ("field 'qk_rope_head_dim' is 32 but head_dim x "
     "rope_parameters.main.partial_rotary_factor is 64 (512 x 0.125), the dims transformers rotates")),
    ("rope_parameters.compress.attention_factor", GONE, ("field 'rope_parameters.compress.attention_factor' must be "
     "1.0 (V4 scales no cos and sin; transformers multiplies them by it), absent, transformers takes")),
    ("rope_parameters.main.rope_theta", GONE, "field 'rope_parameters.main.rope_theta' is missing"),
    ("compress_rates.heavily_compressed_attention", 2**21, ("field 'compress_rates.heavily_compressed_attention' "
     "(2,097,152) must not exceed max_position_embeddings (1,048,576)")),
    ("compress_rates", {"compressed_sparse_attention": 4}, ("field 'compress_rates' has no rate for "
     "heavily_compressed_attention, which layer 3 is")),
    ("mlp_bias", True, "field 'mlp_bias' must be False (V4's experts have no bias)"),
])
def test_each_refusal_of_transformers_form_names_the_field_as_the_file_spells_it(path, value, expected, tmp_path):
    raw = changed(saved_by_transformers("deepseek-v4-flash", tmp_path), path, value)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(StepperError) as e:
        load_v4_config(tmp_path / "config.json")
    message = str(e.value)
    assert message.startswith(f"{tmp_path / 'config.json'}: ") and expected in message and "\n" not in message


def test_what_transformers_form_leaves_out_is_read_as_transformers_reads_it(tmp_path):
    """No compress_rates, mlp_layer_types, rope_parameters or partial_rotary_factor: transformers'
    defaults (HCA 128, three hash layers), the rotary dims from qk_rope_head_dim."""
    transformers = pytest.importorskip("transformers")
    raw = saved_by_transformers("deepseek-v4-flash", tmp_path)
    for field in ("compress_rates", "mlp_layer_types", "rope_parameters", "partial_rotary_factor", "num_hash_layers"):
        raw.pop(field, None)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    read, theirs = load_v4_config(tmp_path / "config.json"), transformers.DeepseekV4Config(**raw)
    kinds = {"sliding": "sliding_attention", "csa": "compressed_sparse_attention",
             "hca": "heavily_compressed_attention"}
    assert [kinds[read.layer_kind(i)] for i in range(read.num_hidden_layers)] == theirs.layer_types
    assert [read.compress_ratio(i) for i in range(4)] == [0, 0, 4, 128]
    assert ["hash_moe" if read.is_hash_layer(i) else "moe" for i in range(read.num_hidden_layers)] == (
        theirs.mlp_layer_types)
    assert read.num_hash_layers == 3 and read.qk_rope_head_dim == theirs.qk_rope_head_dim == 64
    assert (read.rope_theta, read.compress_rope_theta, read.rope_scaling) == (
        theirs.rope_parameters["main"]["rope_theta"], theirs.rope_parameters["compress"]["rope_theta"], None)
    assert theirs.rope_parameters["compress"]["rope_type"] == "default"
