"""DeepSeek-V4's names: each tensor the model reads (transformers' module names) maps to the name
the published checkpoint stores it under, transformers' own conversion mapping for deepseek_v4
renames that published name back to the same module name, and the published listing of the
reader (stepper.weights.deepseek_v4_names) has the same tensors with the same shapes."""

from __future__ import annotations

import pytest

from stepper.families.deepseek_v4_weights import published_name, weight_shapes
from stepper.session import preset_config as v4_preset

pytest.importorskip("transformers")


def test_transformers_renames_every_published_name_back():
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    from transformers.core_model_loading import WeightConverter, apply_converters, apply_renamings

    mapping = get_checkpoint_conversion_mapping("deepseek_v4")
    renamings = [m for m in mapping if not isinstance(m, WeightConverter)]
    converters = [m for m in mapping if isinstance(m, WeightConverter)]
    names = weight_shapes(v4_preset("tiny-v4"))
    wrong = []
    for name in names:
        published = published_name(name)
        assert not published.startswith("model.")
        back, _ = apply_converters(apply_renamings(published, renamings), converters)
        if ".mlp.experts." in name:  # transformers packs the experts: w1 and w3 into gate_up_proj, w2 into down_proj
            leaf = "down_proj" if name.endswith("down_proj.weight") else "gate_up_proj"
            expected = name.removeprefix("model.").rsplit(".experts.", 1)[0] + ".experts." + leaf
        else:
            expected = name.removeprefix("model.")
        if back != expected:
            wrong.append((name, published, back))
    assert wrong == []
    assert len(set(map(published_name, names))) == len(names)


def test_a_csa_layer_is_stored_under_deepseeks_names():
    cfg = v4_preset("tiny-v4")
    layer = sorted(published_name(n) for n in weight_shapes(cfg) if n.startswith("model.layers.1.")
                   and ".experts." not in n)
    assert layer == sorted(f"layers.1.{n}" for n in (
        "attn_norm.weight", "ffn_norm.weight", "hc_attn_fn", "hc_attn_base", "hc_attn_scale", "hc_ffn_fn",
        "hc_ffn_base", "hc_ffn_scale", "attn.wq_a.weight", "attn.q_norm.weight", "attn.wq_b.weight",
        "attn.wkv.weight", "attn.kv_norm.weight", "attn.wo_a.weight", "attn.wo_b.weight", "attn.attn_sink",
        "attn.compressor.wkv.weight", "attn.compressor.wgate.weight", "attn.compressor.ape",
        "attn.compressor.norm.weight", "attn.indexer.wq_b.weight", "attn.indexer.weights_proj.weight",
        "attn.indexer.compressor.wkv.weight", "attn.indexer.compressor.wgate.weight", "attn.indexer.compressor.ape",
        "attn.indexer.compressor.norm.weight", "ffn.gate.weight", "ffn.gate.tid2eid",
        "ffn.shared_experts.w1.weight", "ffn.shared_experts.w2.weight", "ffn.shared_experts.w3.weight"))


@pytest.mark.parametrize("preset", ["tiny-v4", "deepseek-v4-flash"])
def test_the_models_names_are_the_published_listing_of_the_same_config(preset):
    from stepper.weights import deepseek_v4_names as listing

    cfg = v4_preset(preset)
    published = dict(listing.global_tensors(cfg))
    for layer in range(cfg.num_hidden_layers):
        published |= {listing.layer_prefix(layer) + k: t for k, t in listing.layer_tensors(cfg, layer).items()}
    mine = {published_name(name): shape for name, shape in weight_shapes(cfg).items()}
    assert mine == {name: t.shape for name, t in published.items()}
