"""An INT4 checkpoint laid out as Kimi-K2-Thinking, written by an independent writer
(compressed-tensors' packer, safetensors' torch writer), run by stepper from the directory, against
transformers' DeepseekV3ForCausalLM on the exactly dequantized weights: every named tensor within
1e-5 relative, prefill and cached decode, at position 0 and past 4096, on the naive MLA path and the
absorbed one (whose kv_b_proj, BF16 as stored, is split into its per-head key and value halves).

The config's rms_norm_eps is 1e-5, as Kimi-K2-Thinking's is: transformers builds q_a_layernorm and
kv_a_layernorm with eps 1e-6 whatever the config says, and stepper must do the same.
Expert inputs that are not a multiple of 32 (partial groups, and here partial words): the packer
writes them, compressed-tensors refuses to decompress them, and stepper refuses them in one line.
"""

import dataclasses
import os

import numpy as np
import pytest

if not os.environ.get("STEPPER_REQUIRE_CROSSCHECK"):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("compressed_tensors")

from helpers.compare import absorbed_against_naive, compare, rel_err
from helpers.files import linked
from helpers.hf_reference import hf_trace
from helpers.kimi_int4 import write_kimi_int4

from stepper.errors import StepperError
from stepper.presets import preset
from stepper.seams.trace import Recorder
from stepper.session import RunSpec, run
from stepper.weights.checkpoint import Checkpoint
from stepper.weights.names import weight_shapes
from stepper.weights.stored import Bf16Matrix, Int4Matrix

PROMPT = (17, 402, 999, 3, 256, 77, 640)


def kimi_int4_config(moe_intermediate_size: int) -> dict:
    cfg = dataclasses.replace(preset("tiny"), quantization=None, rms_norm_eps=1e-5, num_hidden_layers=2,
                              n_routed_experts=8, moe_intermediate_size=moe_intermediate_size)
    return cfg.to_hf()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    config = kimi_int4_config(96)
    folder = tmp_path_factory.mktemp("kimi-int4") / "ckpt"
    shapes = weight_shapes(preset("tiny").__class__.from_hf(config))
    exact = write_kimi_int4(folder, config, shapes, seed=3, latent_gain=0.01)
    return folder, config, exact


def test_experts_are_read_as_int4_and_the_rest_as_bf16(checkpoint):
    folder, _, exact = checkpoint
    ckpt = Checkpoint(folder)
    ckpt.check(range(ckpt.config.num_hidden_layers), with_globals=True)
    expert = ckpt.matrix("model.layers.1.mlp.experts.5.down_proj.weight")
    assert isinstance(expert, Int4Matrix)
    np.testing.assert_array_equal(expert.dequantize(), exact["model.layers.1.mlp.experts.5.down_proj.weight"])
    for bf16 in ("model.layers.1.mlp.shared_experts.down_proj.weight", "model.layers.0.mlp.gate_proj.weight",
                 "model.layers.1.self_attn.q_b_proj.weight", "lm_head.weight"):
        weight = ckpt.matrix(bf16)
        assert isinstance(weight, Bf16Matrix)  # kept as stored, decoded tile by tile
        np.testing.assert_array_equal(weight.dequantize(), exact[bf16])


@pytest.mark.parametrize("attn", ["naive", "absorb"])
@pytest.mark.parametrize("start_pos, decode", [(0, 2), (4093, 3)])
def test_every_named_tensor_matches_transformers(checkpoint, start_pos, decode, attn):
    folder, config, exact = checkpoint
    rec = Recorder()
    result = run(RunSpec(model=str(folder), ids=PROMPT, start_pos=start_pos, decode=decode, attn=attn), [rec])
    mine = rec.tensors()
    steps = [np.array([[t]]) for t in result.generated]
    ref = hf_trace(config, exact, np.array([PROMPT]), start_pos=start_pos, decode_ids=steps)
    if attn == "absorb":  # transformers has the naive path only: the names both make
        mine, ref = absorbed_against_naive(mine, ref)
    assert list(mine) and set(mine) == set(ref), sorted(set(mine) ^ set(ref))
    failures = {name: why for name in mine if (why := compare(name, mine, ref))}
    assert not failures, failures


def test_the_latent_norms_use_eps_1e6_as_transformers_does(checkpoint):
    """The latents are small (mean square near 1e-4), so the config's 1e-5 in their norms would move
    them by percents: stepper's match transformers', the config's eps would not."""
    folder, config, exact = checkpoint
    rec = Recorder()
    run(RunSpec(model=str(folder), ids=PROMPT, attn="naive"), [rec])
    mine, ref = rec.tensors(), hf_trace(config, exact, np.array([PROMPT]))
    for before, after, norm in (("q_a", "q_a_norm", "q_a_layernorm"),
                                ("compressed_kv", "compressed_kv_norm", "kv_a_layernorm")):
        x = mine[f"layers.0.self_attn.{before}"].astype(np.float64)
        gain = exact[f"model.layers.0.self_attn.{norm}.weight"]
        with_config_eps = x / np.sqrt((x * x).mean(-1, keepdims=True) + config["rms_norm_eps"]) * gain
        assert rel_err(mine[f"layers.0.self_attn.{after}"], ref[f"layers.0.self_attn.{after}"]) <= 1e-5
        assert rel_err(with_config_eps, ref[f"layers.0.self_attn.{after}"]) > 1e-3


def test_transformers_own_loading_rounds_each_expert_weight_to_bf16(checkpoint, tmp_path):
    """transformers reads the same files through compressed-tensors, which decompresses each
    expert as code x scale in the scale's dtype: every weight is the exact one rounded to BF16
    (docs/numerics.md). Its logits then differ from stepper's, computed on the exact weights, by
    far more than the 1e-5 above, and by about what that rounding explains.

    transformers 5.24 fuses the per-expert tensors into its experts' parameters only for
    model_type deepseek_v3: with kimi_k2 (as Kimi's config.json says) it leaves the INT4 tensors
    unread and the experts newly initialised. So it reads the files under a config.json that says
    deepseek_v3 and is otherwise the same."""
    import ml_dtypes
    import torch
    from transformers import DeepseekV3ForCausalLM

    folder, _, exact = checkpoint
    linked(folder, tmp_path, but={"config.json"})
    config = folder.joinpath("config.json").read_text()
    (tmp_path / "config.json").write_text(config.replace('"kimi_k2"', '"deepseek_v3"'))
    model = DeepseekV3ForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32, attn_implementation="eager",
                                                  experts_implementation="eager").eval()
    for parameter in model.parameters():  # its decompressed experts are BF16; float32 holds their values exactly
        parameter.data = parameter.data.float()
    fused = model.state_dict()["model.layers.1.mlp.experts.gate_up_proj"][2].float().numpy()  # [2 * moe_inter, d]
    expert = np.concatenate([exact[f"model.layers.1.mlp.experts.2.{p}_proj.weight"] for p in ("gate", "up")])
    np.testing.assert_array_equal(fused, expert.astype(ml_dtypes.bfloat16).astype(np.float32))
    assert np.abs(fused - expert).max() > 0  # not the exact weights
    rec = Recorder()
    run(RunSpec(model=str(folder), ids=PROMPT, attn="naive"), [rec])
    with torch.no_grad():
        theirs = model(torch.tensor([PROMPT])).logits.numpy()
    error = rel_err(rec.tensors()["logits"], theirs)
    assert 1e-4 < error < 1e-2, error


def test_partial_groups_are_refused_in_one_line(tmp_path):
    config = kimi_int4_config(100)  # down_proj's 100 inputs: three groups of 32 and 4 left over
    write_kimi_int4(tmp_path / "ckpt", config, weight_shapes(preset("tiny").__class__.from_hf(config)))
    with pytest.raises(StepperError) as refused:
        run(RunSpec(model=str(tmp_path / "ckpt"), ids=PROMPT), [])
    lines = str(refused.value).splitlines()
    assert "'model.layers.1.mlp.experts.0.down_proj.weight' [320, 100]: 100 inputs are not a whole number of groups " \
           "of 32" in lines[1]
    assert len(lines) == 1 + 8  # one line per expert's down_proj, nothing else
