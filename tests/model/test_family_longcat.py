"""LongCat-Flash read from its published config.json: its own field names translated (num_layers,
ffn_hidden_size, expert_ffn_hidden_size, moe_topk, zero_expert_num), each field stepper does not
honour refused by name, `synth` writing its layout (sublayer modules `.0.` / `.1.`, the router's
classifier over real and zero experts, no weights for the zero experts), a lone layer run with its
two caches, and the routing map showing zero experts as such."""

import copy
import io
import json

import numpy as np
import pytest
from helpers.configs import family_preset
from rich.console import Console

from stepper.config import Config
from stepper.errors import StepperError
from stepper.families import read_config
from stepper.presets import PRESETS
from stepper.seams.trace import Recorder
from stepper.session import RunSpec, run
from stepper.views import routing_map
from stepper.weights.names import weight_shapes
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.synth_checkpoint import synth_checkpoint


def longcat(**fields) -> Config:
    raw = copy.deepcopy(PRESETS["longcat-flash"])
    raw.update(fields)
    return read_config(raw, "LongCat-Flash-Chat/config.json")


def test_the_published_config_reads_as_longcat_flash():
    cfg = family_preset("longcat-flash")
    assert (cfg.num_hidden_layers, cfg.intermediate_size, cfg.moe_intermediate_size) == (28, 12288, 2048)
    assert (cfg.n_routed_experts, cfg.zero_experts, cfg.router_experts, cfg.num_experts_per_tok) == (512, 256, 768, 12)
    assert cfg.scoring_func == "softmax" and not cfg.norm_topk_prob and cfg.routed_scaling_factor == 6.0
    assert cfg.mla_lora_scales and cfg.shortcut_moe and cfg.n_shared_experts == 0
    shapes = weight_shapes(cfg)
    assert shapes["model.layers.0.mlp.router.classifier.weight"] == (768, 6144)
    assert shapes["model.layers.0.self_attn.1.kv_b_proj.weight"] == (64 * 256, 512)
    assert "model.layers.0.mlps.1.down_proj.weight" in shapes
    assert "model.layers.0.mlp.experts.512.up_proj.weight" not in shapes
    written = cfg.to_hf()
    assert (written["num_layers"], written["moe_topk"], written["zero_expert_num"]) == (28, 12, 256)
    assert read_config(written, "again") == read_config({**PRESETS["longcat-flash"], "_name_or_path": None}, "again")


@pytest.mark.parametrize("fields, message", [
    ({"zero_expert_type": "zero"}, "field 'zero_expert_type' must be 'identity'"),
    ({"router_bias": True}, "field 'router_bias' must be False"),
    ({"mla_scale_q_lora": False}, "field 'mla_scale_q_lora' must be True"),
    ({"head_dim": 128}, "field 'head_dim' must equal qk_rope_head_dim"),
    ({"qk_head_dim": 100}, "field 'qk_head_dim' must be qk_nope_head_dim \\+ qk_rope_head_dim"),
    ({"moe_topk": 800}, r"field 'moe_topk' \(800\) must not exceed n_routed_experts \(512\) \+ zero_expert_num"),
    ({"n_routed_experts": 2, "zero_expert_num": 4}, r"field 'moe_topk' \(12\) must not exceed n_routed_experts \(2\)"),
    ({"expert_ffn_hidden_size": "x"}, "field 'expert_ffn_hidden_size' must be an integer"),
    ({"num_layers": None}, "field 'num_layers' is null"),
])
def test_a_field_stepper_does_not_honour_is_refused_by_name(fields, message):
    with pytest.raises(StepperError, match=message) as refused:
        longcat(**fields)
    assert str(refused.value).startswith("LongCat-Flash-Chat/config.json")


def test_synth_writes_the_layout_and_a_lone_layer_keeps_two_caches(tmp_path):
    folder = synth_checkpoint(SyntheticWeights(family_preset("tiny-longcat"), seed=0), tmp_path / "tiny-longcat")
    written = json.loads((folder / "config.json").read_text())
    assert written["model_type"] == "longcat_flash" and written["zero_expert_num"] == 4 and written["num_layers"] == 2
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.layers.1.self_attn.1.q_b_proj.weight" in index and "model.layers.1.mlps.0.up_proj.weight" in index
    assert "model.layers.1.mlp.router.classifier.weight" in index
    rec = Recorder()
    run(RunSpec(model=str(folder), layer=1, prompt_len=5, decode=2, attn="naive"), [rec])
    t = rec.tensors()
    # each attention sublayer attends over its own cache: 5 prompt positions, then 6, then 7
    keys = [t[f"decode1.layers.1.sub{j}.self_attn.key_states"] for j in (0, 1)]
    assert keys[0].shape[2] == 7 == keys[1].shape[2] and not np.array_equal(keys[0], keys[1])


def test_the_routing_map_shows_zero_experts_as_such():
    idx = np.array([[0, 9, 3], [10, 11, 8]])  # 8 real experts, zero experts 8..11
    weight = np.full((2, 3), 0.3, dtype=np.float32)
    console = Console(width=100, record=True, file=io.StringIO(), no_color=True)
    console.print(routing_map.routing_map(idx, weight, 12, zero_experts=4))
    text = console.export_text()
    assert "e0 0.30  z1 0.30  e3 0.30" in text and "z2 0.30  z3 0.30  z0 0.30" in text
    assert "zero experts z0-z3 (columns 8-11, identity: no compute) took 4 of the 6 choices" in text


def test_the_cache_per_position_counts_both_attention_sublayers():
    from stepper.model.cache import cache_bytes_per_token
    cfg = family_preset("tiny-longcat")  # kv_lora 64, rope 16, 4 heads of 48 + 32
    assert cache_bytes_per_token(cfg, "absorb") == 2 * (64 + 16) * 4
    assert cache_bytes_per_token(cfg, "naive") == 2 * 4 * (48 + 32) * 4


def test_inspect_counts_the_zero_experts_beside_the_routed_ones(tmp_path):
    """The run's header says "8 + 4 zero experts"; inspect said "8 routed experts" beside a router of 12 rows."""
    from helpers.cli import stepper

    folder = synth_checkpoint(SyntheticWeights(family_preset("tiny-longcat"), seed=0), tmp_path / "tiny-longcat")
    out = stepper("inspect", folder, "--plain")
    assert out.returncode == 0, out.stderr
    assert "2 layers (0 dense), 8 routed + 4 zero experts · 4 shards" in out.stdout.splitlines()[0]
