"""What a layer emits is learned from its code (stepper.families.derive): the same names in a
prefill and a decode step, the branches each config takes, the masked future of the tensors over
the attended positions, all from a miniature of the config, never from the full-size one."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.configs import family_preset

from stepper.families import deepseek, derive
from stepper.model.options import LayerOptions
from stepper.presets import PRESETS, preset

OPTIONS = [LayerOptions(attention=a, index_scoring=s) for a in ("naive", "absorb") for s in ("exact", "fp8")]


@pytest.mark.parametrize("name", list(PRESETS))
def test_a_decode_step_emits_the_names_of_the_prefill_in_the_same_order(name):
    cfg = family_preset(name)  # any family's, through the registry
    for layer in range(cfg.num_hidden_layers):
        for options in OPTIONS:
            prefill = [e.key for e in derive.layer_emits(cfg, layer, options, "prefill")]
            decode = [e.key for e in derive.layer_emits(cfg, layer, options, "decode")]
            assert prefill == decode, (name, layer, options)


def test_the_branches_follow_the_config():
    v3, v2, v32 = preset("tiny-v3"), preset("tiny-v2"), preset("tiny-v32")
    dense, moe = derive.layer_keys(v3, 0), derive.layer_keys(v3, v3.num_hidden_layers - 1)
    assert "mlp.act" in dense and "mlp.gate.logits" not in dense and "mlp.gate.scores_for_choice" in moe
    assert derive.layer_keys(v3, 1, "absorb").count("self_attn.q_nope_absorbed") == 1
    assert "self_attn.kv" not in derive.layer_keys(v3, 1, "absorb") and "self_attn.kv" in derive.layer_keys(v3, 1)
    v2_moe = derive.layer_keys(v2, v2.num_hidden_layers - 1)
    assert "self_attn.q_a" not in v2_moe and "mlp.gate.softmax_scores" in v2_moe and "mlp.gate.scores" not in v2_moe
    fp8 = derive.layer_keys(v32, 1, "naive", "fp8")
    assert fp8.index("self_attn.indexer.q_rotated") < fp8.index("self_attn.q_a") and "self_attn.indexer.q" in fp8
    assert "self_attn.indexer.q_rotated" not in derive.layer_keys(v32, 1, "naive", "exact")


def test_the_masked_future_is_what_the_code_puts_there():
    found = derive.masked_future(preset("tiny-v32"), 1, "naive", "fp8")
    assert found == {"self_attn.attn_scores": -np.inf, "self_attn.attn_weights": 0.0,
                     "self_attn.indexer.index_scores": -np.inf, "self_attn.indexer.mask": -np.inf,
                     "self_attn.indexer.topk_idx": -1.0, "self_attn.indexer.exact_index_scores": -np.inf,
                     "self_attn.indexer.exact_topk_idx": -1.0}
    assert derive.masked_future(preset("tiny"), 0, "absorb") == {"self_attn.attn_scores": -np.inf,
                                                                  "self_attn.attn_weights": 0.0}


def test_a_full_size_config_is_derived_on_its_miniature():
    cfg = preset("kimi-k2")
    mini = deepseek.miniature(cfg, 5)
    assert (mini.hidden_size, mini.num_hidden_layers, mini.n_routed_experts, mini.quantization) == (16, 1, 2, None)
    assert mini.is_moe_layer(0) and not deepseek.miniature(cfg, 0).is_moe_layer(0)
    shapes = {e.key: e.shape for e in derive.layer_emits(cfg, 5)}
    assert shapes["self_attn.attn_scores"] == (1, 2, derive.PREFILL, derive.PREFILL)  # the miniature's, not K2's
