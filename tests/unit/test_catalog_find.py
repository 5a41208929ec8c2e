"""`stepper explain` and the debugger's `e` find catalogue entries by what a user types: a name, a
glob, a checkpoint parameter, a word of names, another implementation's name; a typo gets the
nearest names."""

from __future__ import annotations

import dataclasses

import pytest

from stepper import catalog
from stepper.presets import preset
from stepper.views.explain import also_named, emitted_by, not_found
from stepper.weights.names import is_linear, weight_shapes

CAT = catalog.around(preset("kimi-k2"))  # the families around MLA's Transformer (DeepSeek-V4's names are apart)
LAYER_ENDS = {"hidden_states", "output"}


def found(query: str) -> list[str]:
    return [e["name"] for e in CAT.find(query)]


# What each parameter of a layer computes, from the math of the layer (not from the catalogue).
PRODUCES = {
    "model.embed_tokens.weight": ["embed"],
    "model.layers.0.input_layernorm.weight": ["input_layernorm"],
    "model.layers.0.self_attn.q_a_proj.weight": ["self_attn.q_a"],
    "model.layers.0.self_attn.q_a_layernorm.weight": ["self_attn.q_a_norm"],
    "model.layers.0.self_attn.q_b_proj.weight": ["self_attn.q"],
    "model.layers.0.self_attn.kv_a_proj_with_mqa.weight": ["self_attn.kv_a"],
    "model.layers.0.self_attn.kv_a_layernorm.weight": ["self_attn.compressed_kv_norm"],
    "model.layers.0.self_attn.kv_b_proj.weight": ["self_attn.kv", "self_attn.q_nope_absorbed"],
    "model.layers.0.self_attn.o_proj.weight": ["self_attn.o_proj"],
    "model.layers.0.post_attention_layernorm.weight": ["post_attention_layernorm"],
    "model.layers.0.mlp.gate_proj.weight": ["mlp.gate_proj"],
    "model.layers.0.mlp.up_proj.weight": ["mlp.up_proj"],
    "model.layers.0.mlp.down_proj.weight": ["mlp_output"],
    "model.layers.1.mlp.gate.weight": ["mlp.gate.logits"],
    "model.layers.1.mlp.gate.e_score_correction_bias": ["mlp.gate.scores_for_choice"],
    "model.layers.1.mlp.experts.7.gate_proj.weight": ["mlp.routed_output"],
    "model.layers.1.mlp.experts.7.up_proj.weight": ["mlp.routed_output"],
    "model.layers.1.mlp.experts.7.down_proj.weight": ["mlp.routed_output"],
    "model.layers.1.mlp.shared_experts.gate_proj.weight": ["mlp.shared_output"],
    "model.layers.1.mlp.shared_experts.down_proj.weight": ["mlp.shared_output"],
    "model.norm.weight": ["norm"],
    "lm_head.weight": ["logits", "logits_uncapped"],  # Mistral Large 4 caps the latter
}


@pytest.mark.parametrize("parameter", sorted(PRODUCES))
def test_a_parameter_leads_to_the_tensors_computed_from_it(parameter):
    assert found(parameter) == PRODUCES[parameter]
    short = parameter.removeprefix("model.").split(".", 2)[2] if ".layers." in parameter else parameter
    assert found(short) == PRODUCES[parameter], short  # self_attn.q_a_proj.weight, without the layer
    wrapped = "language_model." + parameter  # a multimodal wrapper's checkpoint (Kimi K2.5)
    assert found(wrapped) == PRODUCES[parameter], wrapped
    if is_linear(parameter):  # its FP8 scales lead to the same tensors
        assert found(parameter + "_scale_inv") == PRODUCES[parameter]


@pytest.mark.parametrize("q_lora_rank", [192, None])
def test_every_parameter_of_a_checkpoint_leads_somewhere_inside_the_layer(q_lora_rank):
    cfg = dataclasses.replace(preset("tiny"), q_lora_rank=q_lora_rank)
    for parameter in weight_shapes(cfg):
        names = found(parameter)
        assert names, parameter
        assert not LAYER_ENDS & set(names), f"{parameter}: {names}"
    if q_lora_rank is None:  # MLA's q and Kimi Linear's KDA q_proj both read a q_proj.weight: the model's layer says
        query = "model.layers.2.self_attn.q_proj.weight"
        assert found(query) == ["self_attn.q", "self_attn.q_proj"]
        assert [e["name"] for e in emitted_by(CAT, CAT.find(query), cfg, query)] == ["self_attn.q"]


def test_an_hf_module_name_gives_that_modules_outputs_only():
    assert found("model.layers.1.mlp.gate") == ["mlp.gate.logits", "mlp.gate.topk_idx", "mlp.gate.topk_weight"]
    assert found("model.layers.12.self_attn.kv_a_proj_with_mqa") == [
        "self_attn.kv_a", "self_attn.compressed_kv", "self_attn.k_pe"]
    assert found("model.layers.3") == ["hidden_states", "output"]  # the decoder layer's own input and output
    for entry in CAT.entries:
        if catalog.hf_module(entry):  # every other module is matched without the layer's ends
            query = entry["aliases"]["hf_module"].split()[0].replace("{i}", "1")
            assert entry["name"] in found(query) and not LAYER_ENDS & set(found(query)), query
    assert found("model.layers.x.mlp.gate") == []  # {i} stands for a layer number only


def test_a_word_finds_every_name_containing_it():
    assert found("topk") == ["mlp.gate.topk_idx", "mlp.gate.topk_weight", "self_attn.indexer.topk_idx",
                             "self_attn.indexer.exact_topk_idx", "self_attn.indexer.reused_topk_idx"]
    assert found("group") == ["mlp.gate.group_scores", "mlp.gate.group_mask", "mlp.gate.group_max"]
    assert found("k_pe") == ["self_attn.k_pe"]  # a whole last part wins over names containing it
    assert also_named(CAT, "k_pe", CAT.find("k_pe")) == "also with 'k_pe' in the name: self_attn.k_pe_rope"
    logits = also_named(CAT, "logits", CAT.find("logits"))
    assert logits == "also with 'logits' in the name: mlp.gate.logits, logits_uncapped"
    assert also_named(CAT, "topk", CAT.find("topk")) == ""


def test_other_implementations_names_but_not_the_prose_around_them():
    assert found("kv_cmpr") == ["self_attn.compressed_kv", "self_attn.compressed_kv_norm"]  # llama.cpp
    assert found("ffn_moe_logits") == ["mlp.gate.logits"]
    assert found("Qcur") == ["self_attn.query_states"]
    assert found("pe_cache") == ["self_attn.k_pe_rope"]  # DeepSeek inference/model.py
    for prose in ("the", "sum", "when", "before"):
        assert found(prose) == [], prose


def test_a_typo_gets_the_nearest_names():
    assert found("compresed_kv") == []
    message = not_found(CAT, "compresed_kv")
    assert message.startswith("no tensor named 'compresed_kv' in the catalogue; did you mean compressed_kv")
    assert "did you mean" in not_found(CAT, "layers.1.self_attn.q_pe_rop")
    assert "did you mean" not in not_found(CAT, "nothing_like_this")


LONGCAT_PRODUCES = {  # LongCat-Flash's published names: two sublayers (.0. / .1., mlps), the router's classifier
    "model.layers.0.self_attn.1.q_b_proj.weight": ["self_attn.q"],
    "model.layers.0.input_layernorm.1.weight": ["input_layernorm"],
    "model.layers.0.mlps.1.up_proj.weight": ["mlp.up_proj"],
    "model.layers.0.mlps.0.down_proj.weight": ["mlp_output"],
    "model.layers.0.mlp.router.classifier.weight": ["mlp.gate.logits"],
    "model.layers.0.mlp.router.e_score_correction_bias": ["mlp.gate.scores_for_choice"],
}


@pytest.mark.parametrize("parameter", sorted(LONGCAT_PRODUCES))
def test_a_longcat_parameter_leads_to_the_tensors_computed_from_it(parameter):
    """`stepper explain model.layers.0.mlps.1.up_proj.weight --model tiny-longcat` found nothing, and the
    router's classifier led to mlp_output; the names are those `stepper inspect` lists."""
    assert found(parameter) == LONGCAT_PRODUCES[parameter]
