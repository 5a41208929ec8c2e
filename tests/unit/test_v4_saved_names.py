"""DeepSeek-V4's names as transformers' save_pretrained writes them (stepper.weights.deepseek_v4_saved):
every published name of a model (its layers of each kind, the globals, the quantized weights' scales)
goes to the saved name and back to itself, and the saved names are the ones transformers 5.24
wrote (tests/model/test_v4_saved_by_transformers.py reads such a folder whole)."""

from __future__ import annotations

import pytest

from stepper.errors import StepperError
from stepper.session import preset_config as v4_preset
from stepper.weights import deepseek_v4_names as v4
from stepper.weights.deepseek_v4_saved import from_saved, is_saved_layout, named_as_saved, to_saved


def published_names() -> list[str]:
    cfg = v4_preset("tiny-v4-indexer")
    names = list(v4.global_tensors(cfg))
    for layer in range(cfg.num_hidden_layers):
        names += [v4.layer_prefix(layer) + name for name in v4.layer_tensors(cfg, layer)]
    return names + [name.removesuffix(".weight") + v4.SCALE for name in names if name.endswith(".weight")]


def test_every_published_name_goes_to_its_saved_name_and_back():
    names = published_names()
    assert len(names) > 300
    saved = [to_saved(name) for name in names]
    assert [from_saved(name) for name in saved] == names
    assert len(set(saved)) == len(saved)
    assert all(name.startswith("model.") for name in saved if name != "head.weight")


@pytest.mark.parametrize(("published", "saved"), [
    ("embed.weight", "model.embed_tokens.weight"),
    ("hc_head_fn", "model.hc_head.hc_fn"),
    ("hc_head_scale", "model.hc_head.hc_scale"),
    ("norm.weight", "model.norm.weight"),
    ("head.weight", "head.weight"),
    ("layers.0.attn.kv_norm.weight", "model.layers.0.attn.norm.weight"),
    ("layers.1.attn.compressor.norm.weight", "model.layers.1.attn.compressor.norm.weight"),
    ("layers.2.ffn.experts.5.w2.weight", "model.layers.2.ffn.experts.5.w2.weight"),
    ("layers.3.hc_ffn_fn", "model.layers.3.hc_ffn_fn"),
])
def test_the_names_transformers_wrote(published, saved):
    assert to_saved(published) == saved and from_saved(saved) == published


def test_a_message_names_each_tensor_as_the_folder_holds_it():
    message = "'layers.0.attn.kv_norm.weight' is missing; 'embed.weight' has dtype I8; field 'hc_eps' is 'x'"
    assert named_as_saved(message, {"embed.weight": "embed.weight"}) == (
        "'model.layers.0.attn.norm.weight' is missing; 'embed.weight' has dtype I8; field 'hc_eps' is 'x'")


def test_layers_named_both_ways_are_refused_and_globals_alone_decide_nothing():
    assert is_saved_layout(["model.layers.0.attn.wkv.weight", "embed.weight"], "ck")
    assert not is_saved_layout(["layers.0.attn.wkv.weight", "model.norm.weight"], "ck")
    with pytest.raises(StepperError, match=r"^ck: tensors named as transformers saves DeepSeek-V4 "
                       r"\('model.layers.1.attn.wkv.weight'\) and as DeepSeek publishes it "
                       r"\('layers.0.attn.wkv.weight'\): expected one naming$"):
        is_saved_layout(["layers.0.attn.wkv.weight", "model.layers.1.attn.wkv.weight"], "ck")
