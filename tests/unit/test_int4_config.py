"""compressed-tensors quantization_config: Kimi-K2-Thinking's read, each module's storage decided by
targets and ignore, and everything stepper cannot honour refused in one line naming the field."""

import copy

import pytest

from stepper.config import Int4Groups
from stepper.errors import StepperError
from stepper.weights.names import storage_dtype

KIMI = {
    "config_groups": {"group_0": {
        "input_activations": None, "output_activations": None, "targets": ["Linear"],
        "weights": {"actorder": None, "block_structure": None, "dynamic": False, "group_size": 32, "num_bits": 4,
                    "observer": "minmax", "observer_kwargs": {}, "strategy": "group", "symmetric": True, "type": "int"},
    }},
    "format": "pack-quantized",
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
    "kv_cache_scheme": None, "quant_method": "compressed-tensors", "quantization_status": "compressed",
}


def with_change(path: str, value):
    block = copy.deepcopy(KIMI)
    *parents, last = path.split(".")
    inner = block
    for key in parents:
        inner = inner[key]
    if value is KeyError:
        del inner[last]
    else:
        inner[last] = value
    return block


def test_kimi_k2_thinking_experts_are_int4_and_the_rest_bf16(make_config):
    cfg = make_config(quantization_config=KIMI)
    assert cfg.quantization is None and cfg.int4 == Int4Groups()
    int4 = ["model.layers.1.mlp.experts.0.gate_proj.weight", "model.layers.2.mlp.experts.31.down_proj.weight"]
    bf16 = ["model.layers.1.mlp.shared_experts.up_proj.weight", "model.layers.0.mlp.down_proj.weight",
            "model.layers.1.self_attn.kv_b_proj.weight", "lm_head.weight", "model.embed_tokens.weight",
            "model.layers.1.mlp.gate.weight", "model.layers.1.input_layernorm.weight"]
    assert [storage_dtype(cfg, n) for n in int4] == ["INT4"] * 2
    assert [storage_dtype(cfg, n) for n in bf16] == ["BF16"] * len(bf16)
    assert storage_dtype(cfg, "model.layers.1.mlp.gate.e_score_correction_bias") == "F32"
    assert make_config(quantization_config=cfg.to_hf()["quantization_config"]).int4 == cfg.int4  # round trip


def test_ignore_takes_plain_names_and_patterns_from_the_start(make_config):
    cfg = make_config(quantization_config=with_change("ignore", ["model.layers.1.mlp.experts.3.up_proj", "re:.*down"]))
    assert storage_dtype(cfg, "model.layers.1.mlp.experts.3.up_proj.weight") == "BF16"
    assert storage_dtype(cfg, "model.layers.1.mlp.experts.4.up_proj.weight") == "INT4"
    assert storage_dtype(cfg, "model.layers.1.mlp.experts.4.down_proj.weight") == "BF16"
    assert storage_dtype(cfg, "model.layers.1.self_attn.o_proj.weight") == "INT4"  # not ignored any more
    assert storage_dtype(cfg, "lm_head.weight") == "INT4"


@pytest.mark.parametrize("path, value, field, says", [
    ("config_groups.group_0.weights.num_bits", 8, "config_groups.group_0.weights.num_bits", "must be 4"),
    ("config_groups.group_0.weights.group_size", 128, "config_groups.group_0.weights.group_size", "must be 32"),
    ("config_groups.group_0.weights.symmetric", False, "config_groups.group_0.weights.symmetric", "must be true"),
    ("config_groups.group_0.weights.type", "float", "config_groups.group_0.weights.type", 'must be "int"'),
    ("config_groups.group_0.weights.strategy", "channel", "config_groups.group_0.weights.strategy", 'must be "group"'),
    ("config_groups.group_0.weights.actorder", "group", "config_groups.group_0.weights.actorder", "must be null"),
    ("config_groups.group_0.weights.dynamic", True, "config_groups.group_0.weights.dynamic", "must be false"),
    ("config_groups.group_0.weights.num_bits", KeyError, "config_groups.group_0.weights.num_bits", "is missing"),
    ("config_groups.group_0.input_activations", {"num_bits": 8, "type": "float"},
     "config_groups.group_0.input_activations", "must be null"),
    ("format", "int-quantized", "format", 'must be "pack-quantized"'),
    ("config_groups.group_0.format", "float-quantized", "config_groups.group_0.format", 'must be "pack-quantized"'),
    ("quantization_status", "frozen", "quantization_status", 'must be "compressed"'),
    ("kv_cache_scheme", {"num_bits": 8}, "kv_cache_scheme", "must be null"),
    ("config_groups.group_1", KIMI["config_groups"]["group_0"], "config_groups", "exactly one config group"),
    ("ignore", ["re:(unclosed"], "ignore", "not a regular expression"),
    ("ignore", "lm_head", "ignore", "must be a list"),
    ("config_groups.group_0.targets", [], "config_groups.group_0.targets", "must be a list"),
])
def test_what_stepper_cannot_honour_is_one_line_naming_the_field(make_config, path, value, field, says):
    with pytest.raises(StepperError) as refused:
        make_config(quantization_config=with_change(path, value))
    message = str(refused.value)
    assert "\n" not in message
    assert (message.startswith("test config (tiny): field 'quantization_config.")
            and f"quantization_config.{field}'" in message)
    assert says in message


def test_an_unknown_quant_method_names_both_that_stepper_reads(make_config):
    with pytest.raises(StepperError, match="must be 'fp8' or 'compressed-tensors', got 'awq'"):
        make_config(quantization_config={"quant_method": "awq"})
