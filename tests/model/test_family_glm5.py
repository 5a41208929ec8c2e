"""GLM-5 read from its published config.json: V3.2's fields with GLM's defaults, the layers that
reuse the previous layer's index choice (from indexer_types, index_topk_pattern or
index_topk_freq / index_skip_topk_offset, as transformers derives them), each field stepper does
not honour refused by name, tiny-glm5 as GLM-5 at a small size, `synth` writing BF16 as GLM-5 is
published and the FP8 layout when the config asks (no indexer weights in a shared layer), and a
lone shared layer refused in one line."""

import copy
import dataclasses
import json

import numpy as np
import pytest
from helpers.cli import stepper
from helpers.configs import family_preset

from stepper.config import Config
from stepper.errors import StepperError
from stepper.families import read_config
from stepper.presets import PRESETS
from stepper.seams.trace import Recorder
from stepper.session import RunSpec, run
from stepper.weights.names import weight_shapes
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.synth_checkpoint import synth_checkpoint


def glm(**fields) -> Config:
    raw = copy.deepcopy(PRESETS["glm-5"])
    raw.update(fields)
    return read_config(raw, "GLM-5/config.json")


def test_the_published_sizes_read_as_glm5():
    cfg = family_preset("glm-5")
    assert (cfg.model_type, cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk) == ("glm_moe_dsa", 32, 128, 2048)
    assert (cfg.qk_head_dim, cfg.v_head_dim, cfg.first_k_dense_replace, cfg.num_hidden_layers) == (256, 256, 3, 78)
    assert cfg.indexer_rope_interleave and cfg.index_reused_layers == () and cfg.quantization is None  # BF16
    assert (cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings) == (1e6, None, 202752)


SIZES = {"name", "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
         "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
         "n_routed_experts", "num_experts_per_tok", "index_n_heads", "index_head_dim", "index_topk"}


def test_the_tiny_preset_is_glm5_with_smaller_sizes():
    """tiny-glm5 computes what GLM-5 computes: beside the sizes, only its one dense layer and its
    shared third layer (the coverage its preset's comment gives) are not GLM-5's; its special tokens
    sit as far from the end of its vocabulary as GLM-5's do."""
    tiny, full = family_preset("tiny-glm5"), family_preset("glm-5")
    differ = {f.name for f in dataclasses.fields(tiny) if getattr(tiny, f.name) != getattr(full, f.name)}
    assert differ == SIZES | {"first_k_dense_replace", "index_reused_layers", "eos_token_id", "pad_token_id"}
    assert [full.vocab_size - i for i in full.eos_token_id] == [tiny.vocab_size - i for i in tiny.eos_token_id]
    assert (tiny.bos_token_id, tiny.pad_token_id) == (None, tiny.eos_token_id[0])
    assert (tiny.rope_theta, tiny.rope_scaling, tiny.quantization) == (1e6, None, None)  # plain RoPE, BF16
    assert (tiny.n_group, tiny.topk_group) == (1, 1)
    assert (tiny.rms_norm_eps, tiny.rope_interleave, tiny.indexer_rope_interleave) == (1e-5, True, True)
    assert (tiny.first_k_dense_replace, tiny.index_reused_layers, tiny.index_topk) == (1, (2,), 4)


@pytest.mark.parametrize("fields, reused", [
    ({"index_topk_freq": 2}, tuple(range(2, 78, 2))),  # offset 2: layers 0, 1, 3, 5, ... full
    ({"index_topk_freq": 3, "index_skip_topk_offset": 4}, tuple(i for i in range(4, 78) if (i - 3) % 3)),
    ({"index_topk_pattern": "FFS" * 26}, tuple(range(2, 78, 3))),
    ({"indexer_types": ["full"] * 77 + ["shared"]}, (77,)),
])
def test_the_shared_layers_follow_transformers_rule(fields, reused):
    assert glm(**fields).index_reused_layers == reused


@pytest.mark.parametrize("fields, message", [
    ({"attention_bias": True}, "field 'attention_bias' must be False"),
    ({"indexer_types": ["shared"] + ["full"] * 77}, "field 'indexer_types' must start with a 'full' layer"),
    ({"indexer_types": ["full"] * 3}, "field 'indexer_types' must give 'full' or 'shared'"),
    ({"index_topk_pattern": "FX" * 39}, "field 'index_topk_pattern' must give 'F' or 'S'"),
    ({"mlp_layer_types": ["dense"] * 78}, "field 'mlp_layer_types' must be the first 3 layers 'dense'"),
    ({"scoring_func": "softmax"}, "field 'scoring_func' must be 'sigmoid'"),
    ({"q_lora_rank": None}, "field 'q_lora_rank' is missing"),
])
def test_a_field_stepper_does_not_honour_is_refused_by_name(fields, message):
    with pytest.raises(StepperError, match=message) as refused:
        glm(**fields)
    assert str(refused.value).startswith("GLM-5/config.json")


def test_synth_writes_bf16_without_the_shared_layers_indexer_and_runs_as_the_preset(tmp_path):
    cfg = family_preset("tiny-glm5")
    folder = synth_checkpoint(SyntheticWeights(cfg, seed=0), tmp_path / "tiny-glm5")
    written = json.loads((folder / "config.json").read_text())
    assert written["model_type"] == "glm_moe_dsa" and written["indexer_types"] == ["full", "full", "shared"]
    assert "quantization_config" not in written and "rope_scaling" not in written  # BF16, plain RoPE: GLM-5's
    assert written["rope_theta"] == 1e6
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.layers.1.self_attn.indexer.wk.weight" in index and not any(n.endswith("_scale_inv") for n in index)
    assert not any(n.startswith("model.layers.2.self_attn.indexer") for n in index)
    assert set(weight_shapes(cfg)) <= set(index)
    mine, theirs = Recorder(), Recorder()
    run(RunSpec(model="tiny-glm5", prompt_len=7, decode=1), [mine])
    run(RunSpec(model=str(folder), prompt_len=7, decode=1), [theirs])
    a, b = mine.tensors(), theirs.tensors()
    assert list(a) == list(b) and "decode0.layers.2.self_attn.indexer.reused_mask" in a
    assert all(np.array_equal(a[n], b[n]) for n in a)
    listed = stepper("inspect", folder, "--layers", "1:3")  # read through the registry, checked as a run checks it
    assert listed.returncode == 0, listed.stderr
    assert "self_attn.indexer.wq_b.weight" in listed.stdout


def test_synth_writes_the_fp8_layout_when_the_config_asks(tmp_path):
    """GLM-5-FP8 is a separate checkpoint: a GLM-5 config.json with an FP8 quantization_config is
    written and read with block scales, the shared layer still without indexer weights."""
    fp8 = dict(PRESETS["tiny-v3"]["quantization_config"])
    raw = {**copy.deepcopy(PRESETS["tiny-glm5"]), "quantization_config": fp8}
    cfg = read_config(raw, "tiny-glm5-fp8/config.json")
    folder = synth_checkpoint(SyntheticWeights(cfg, seed=0), tmp_path / "tiny-glm5-fp8")
    written = json.loads((folder / "config.json").read_text())
    assert written["quantization_config"]["quant_method"] == "fp8" and written["indexer_types"][2] == "shared"
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.layers.1.self_attn.indexer.wk.weight_scale_inv" in index
    assert not any(n.startswith("model.layers.2.self_attn.indexer") for n in index)
    mine, theirs = Recorder(), Recorder()
    run(RunSpec(model="tiny-glm5", prompt_len=7), [mine], weights=SyntheticWeights(cfg, seed=0))
    run(RunSpec(model=str(folder), prompt_len=7), [theirs])
    a, b = mine.tensors(), theirs.tensors()
    assert list(a) == list(b) and all(np.array_equal(a[n], b[n]) for n in a)


def test_a_lone_shared_layer_is_refused_in_one_line():
    result = stepper("run", "--model", "tiny-glm5", "--layer", "2")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0 and "layer 2 runs no indexer" in result.stderr
    assert stepper("run", "--model", "tiny-glm5", "--layer", "1").returncode == 0
