"""DeepSeek-V4's names: each tensor the model reads (transformers' module names) maps to the name
the published checkpoint stores it under, and transformers' own conversion mapping for
deepseek_v4 renames that published name back to the same module name."""

from __future__ import annotations

import pytest

from stepper.families.deepseek_v4_config import v4_preset
from stepper.families.deepseek_v4_weights import published_name, published_storage, weight_shapes

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


def test_published_storage_follows_the_checkpoint():
    cfg = v4_preset("tiny-v4")
    storage = {published_name(n): published_storage(cfg, published_name(n)) for n in weight_shapes(cfg)}
    assert storage["layers.1.attn.wq_a.weight"] == "F8_E4M3"
    assert storage["layers.1.attn.compressor.wkv.weight"] == "BF16"
    assert storage["layers.1.attn.indexer.wq_b.weight"] == "F8_E4M3"
    assert storage["layers.1.attn.indexer.compressor.wgate.weight"] == "BF16"
    assert storage["layers.1.attn.indexer.weights_proj.weight"] == "BF16"
    assert storage["layers.1.ffn.experts.3.w2.weight"] == "FP4"
    assert storage["layers.1.ffn.shared_experts.w1.weight"] == "F8_E4M3"
    assert storage["layers.1.ffn.gate.tid2eid"] == "I64" and storage["layers.2.ffn.gate.bias"] == "F32"
    assert storage["layers.0.hc_attn_fn"] == "F32" and storage["hc_head_scale"] == "F32"
    assert storage["layers.1.attn.attn_sink"] == "F32" and storage["layers.1.attn.compressor.ape"] == "F32"
    assert storage["embed.weight"] == storage["head.weight"] == storage["layers.0.attn_norm.weight"] == "BF16"
