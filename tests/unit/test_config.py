"""Config parsing: published values, both model types, and inconsistent configs named by field."""

import json

import pytest
from helpers.cli import refused, stepper
from helpers.configs import family_preset

from stepper import families
from stepper.config import load_config
from stepper.errors import StepperError
from stepper.presets import PRESETS, V4_PRESETS, preset


def test_presets_parse_and_round_trip_through_config_json():
    for name in PRESETS:
        cfg = family_preset(name)  # any family's, through the registry
        again = families.read_config(json.loads(json.dumps(cfg.to_hf())), name)
        assert again == cfg, name


def test_kimi_k2_published_values():
    cfg = preset("kimi-k2")
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.n_routed_experts,
            cfg.num_experts_per_tok) == (7168, 64, 384, 8)
    assert (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim) == (1536, 512, 128, 64)
    assert (cfg.n_group, cfg.topk_group, cfg.routed_scaling_factor, cfg.rope_theta) == (1, 1, 2.827, 50000.0)
    assert cfg.rope_scaling.factor == 32.0 and cfg.rope_scaling.beta_fast == 1.0
    assert cfg.is_moe_layer(1) and not cfg.is_moe_layer(0)


def test_deepseek_v3_published_values():
    cfg = preset("deepseek-v3")
    assert (cfg.num_attention_heads, cfg.n_routed_experts, cfg.n_group, cfg.topk_group) == (128, 256, 8, 4)
    assert (cfg.first_k_dense_replace, cfg.routed_scaling_factor, cfg.rope_theta) == (3, 2.5, 10000.0)
    assert cfg.rope_scaling.factor == 40.0 and cfg.rope_scaling.beta_fast == 32.0
    assert cfg.is_moe_layer(3) and not cfg.is_moe_layer(2)


def test_tiny_is_kimi_shaped_with_a_partial_fp8_block():
    cfg = preset("tiny")
    assert cfg.model_type == "kimi_k2" and cfg.n_group == 1 and cfg.rope_scaling.factor == 32.0
    assert cfg.num_attention_heads > 1 and cfg.n_shared_experts == 1 and cfg.first_k_dense_replace == 1
    assert 24 <= cfg.n_routed_experts <= 64 and cfg.num_hidden_layers > cfg.first_k_dense_replace
    assert any(n % 128 for n in (cfg.hidden_size, cfg.q_lora_rank, cfg.kv_lora_rank + cfg.qk_rope_head_dim))


def test_rope_parameters_block_is_read_too(make_config):
    yarn = dict(PRESETS["tiny"]["rope_scaling"])
    yarn.pop("type")
    cfg = make_config(rope_scaling=None, rope_theta=None,
                      rope_parameters={"rope_type": "yarn", "rope_theta": 777.0, **yarn})
    assert cfg.rope_theta == 777.0 and cfg.rope_scaling.factor == 32.0


def _rope_block(name: str) -> tuple[dict, str, str]:
    """The preset's config, the name of its rope block and that block's kind."""
    raw = dict(PRESETS.get(name) or V4_PRESETS[name])
    block = "rope_parameters" if "rope_parameters" in raw else "rope_scaling"
    return raw, block, raw[block].get("rope_type", raw[block].get("type"))


@pytest.mark.parametrize("name", ["tiny", "tiny-mistral4", "tiny-v4", "tiny-minicpm3", "tiny-sarvam"])
@pytest.mark.parametrize("newer_is_default", [True, False])
def test_a_rope_block_whose_type_and_rope_type_disagree_is_refused(tmp_path, name, newer_is_default):
    """`type` won where transformers reads `rope_type` first: a YaRN checkpoint ran without YaRN (or
    the reverse), exit 0. Which one a tool reads changes the answer, so neither is guessed."""
    raw, block, kind = _rope_block(name)
    kinds = {"rope_type": "default", "type": kind} if newer_is_default else {"rope_type": kind, "type": "default"}
    (tmp_path / "config.json").write_text(json.dumps({**raw, block: {**raw[block], **kinds}}))
    assert refused(stepper("run", "--model", tmp_path / "config.json", "--layer", "1")) == (
        f"{tmp_path / 'config.json'}: field '{block}.rope_type' is {kinds['rope_type']!r} but {block}.type is "
        f"{kinds['type']!r}: give one, or both alike")


@pytest.mark.parametrize("kinds", [{"rope_type": "yarn"}, {"type": "yarn"}, {"rope_type": "yarn", "type": "yarn"}])
def test_a_rope_block_gives_its_kind_by_either_name_or_both_alike(make_config, kinds):
    yarn = {k: v for k, v in PRESETS["tiny"]["rope_scaling"].items() if k not in ("type", "rope_type")}
    assert make_config(rope_scaling={**yarn, **kinds}).rope_scaling.factor == 32.0


@pytest.mark.parametrize(
    "fields, named",
    [
        ({"num_key_value_heads": 2}, "num_key_value_heads"),
        ({"num_experts_per_tok": 64}, "num_experts_per_tok"),
        ({"n_group": 5}, "n_group"),
        ({"n_group": 4, "topk_group": 8}, "topk_group"),
        ({"n_group": 4, "topk_group": 1, "num_experts_per_tok": 9}, "num_experts_per_tok"),
        ({"hidden_size": None}, "hidden_size"),
        ({"hidden_size": "320"}, "hidden_size"),
        ({"hidden_size": 0}, "hidden_size"),
        ({"num_attention_heads": True}, "num_attention_heads"),
        ({"qk_rope_head_dim": 15}, "qk_rope_head_dim"),
        ({"first_k_dense_replace": 9}, "first_k_dense_replace"),
        ({"model_type": "llama"}, "model_type"),
        ({"scoring_func": "softmax"}, "scoring_func"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling.type"),
        ({"rope_scaling": {"type": "yarn", "factor": 32.0}}, "original_max_position_embeddings"),
        ({"routed_scaling_factor": float("nan")}, "routed_scaling_factor"),
        ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128]}}, "weight_block_size"),
        ({"tie_word_embeddings": True}, "tie_word_embeddings"),
        ({"tie_word_embeddings": "false"}, "tie_word_embeddings"),
    ],
)
def test_inconsistent_configs_are_rejected_naming_the_field(make_config, fields, named):
    with pytest.raises(StepperError, match=named):
        make_config(**fields)


def test_load_config_reports_malformed_files(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{ not json")
    with pytest.raises(StepperError, match="config.json: not valid JSON"):
        load_config(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(StepperError, match="expected a JSON object"):
        load_config(bad)
    with pytest.raises(StepperError, match="no such file"):
        load_config(tmp_path / "missing.json")


@pytest.mark.parametrize("field", ["rope_theta", "rms_norm_eps", "routed_scaling_factor", "n_shared_experts"])
def test_a_null_where_null_means_nothing_is_refused_naming_the_field(tmp_path, field):
    """rope_theta: null once ran with 10000, a silent wrong answer; transformers refuses these nulls too."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**PRESETS["tiny"], field: None}))
    with pytest.raises(StepperError) as raised:
        load_config(path)
    assert str(raised.value).startswith(f"{path}: field '{field}' is null: leave it out for its default (")


def test_a_null_that_published_configs_hold_reads_as_absent(tmp_path):
    path = tmp_path / "config.json"
    tiny = {key: value for key, value in PRESETS["tiny"].items() if key not in ("n_group", "topk_group")}
    path.write_text(json.dumps({**tiny, "n_group": None, "topk_group": None, "num_key_value_heads": None}))
    cfg = load_config(path)
    assert (cfg.n_group, cfg.topk_group, cfg.to_hf()["num_key_value_heads"]) == (1, 1, cfg.num_attention_heads)
    path.write_text(json.dumps({**PRESETS["tiny"], "hidden_size": None}))
    with pytest.raises(StepperError, match="field 'hidden_size' is null$"):
        load_config(path)


def test_tied_embeddings_are_refused_in_one_line_naming_file_and_field(tmp_path):
    """Kimi K2 and DeepSeek-V3 never tie lm_head to the embedding; a config that does would
    otherwise run with a separate lm_head. Untied (false, or absent) is read, and written back."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**PRESETS["tiny"], "tie_word_embeddings": True}))
    with pytest.raises(StepperError) as raised:
        load_config(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: field 'tie_word_embeddings' must be false") and "\n" not in message
    for untied in (False, None):
        path.write_text(json.dumps({**PRESETS["tiny"], "tie_word_embeddings": untied}))
        assert load_config(path).to_hf()["tie_word_embeddings"] is False
