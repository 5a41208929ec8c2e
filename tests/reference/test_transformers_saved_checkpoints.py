"""A porting engineer's first step, for every family transformers 5.24 builds: a tiny random model
made by transformers from the tiny preset's config.json (the class transformers' auto mapping names,
Mistral 4's own), its weights drawn afresh (norms about 1, biases where stepper's config reads one,
the rest of a size whose contributions show), saved with save_pretrained (safetensors), is run by
`stepper run` past position 0: every layer's output and the logits are transformers' own on the same
tokens, as the model from_pretrained builds from that folder computes them.

What transformers writes is not always the published layout stepper was built on: A.X-K1 keeps
post_mlp_layernorm in its MoE layers alone and saves each MoE router's zero bias; Kimi Linear saves
its dense layers' MLP under block_sparse_moe.; MiniCPM3's config.json gets rope_parameters. The
presets transformers builds no model from, and why, are in NOT_BUILT."""

import json
import os
import re

import pytest

if not os.environ.get("STEPPER_REQUIRE_CROSSCHECK"):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")

import torch
import transformers
from helpers.cli import stepper
from helpers.compare import rel_err
from helpers.configs import TINY
from safetensors.numpy import load_file
from transformers import AutoConfig, AutoModelForCausalLM

from stepper.session import preset_config

IDS = (17, 402, 99, 3, 256)
START = 5  # past position 0: the rotary tables of positions 5 to 9
TOLERANCE = 1e-5
KIMI_K2 = "model_type kimi_k2 (Kimi K2's config.json) names no transformers model (the crosscheck runs it as V3)"
V4 = ("compress_ratios has 16 (so that a short prompt closes HCA windows), and transformers 5.24 reads only 0, 4 "
      "and 128 (a KeyError); a V4 model transformers makes and saves: tests/model/test_v4_saved_by_transformers.py")
NOT_BUILT = {"tiny": KIMI_K2, "tiny-int4": KIMI_K2, "tiny-v4": V4, "tiny-v4-indexer": V4}
LAYER_OUTPUT = {"tiny-hy4": "ffn_streams"}  # a layer's output where it is not the one residual stream `output`
# transformers saves a gate_proj and an up_proj for each zero expert (their slots in its fused gate_up_proj,
# which it never reads): no run reads them either, and the run says so (docs/mla-families.md, LongCat)
LONGCAT_NOTE = ("note: model.safetensors: 'model.layers.0.mlp.experts.10.gate_proj.weight' and 7 more tensor(s) are "
                "in layer 0 but no tensor of that layer as config.json describes it, and in 1 more layer(s): this run "
                "goes on without them, as config.json says (stepper inspect lists them)")


def drawn(model, name: str) -> None:
    """Every floating tensor of the model drawn again, seeded: a norm's weight 1 + 0.1 z, a router's
    bias 0.1 z where stepper's config of the preset reads one (else transformers' zeros, as its
    checkpoint of A.X-K1 holds them), anything else 0.1 z."""
    router_bias = preset_config(name).router_bias
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for key, tensor in model.state_dict().items():
            if not tensor.is_floating_point() or (key.endswith("e_score_correction_bias") and not router_bias):
                continue
            z = torch.randn(tensor.shape, generator=generator, dtype=torch.float32)
            tensor.copy_(1 + 0.1 * z if key.endswith("norm.weight") else 0.1 * z)


OWN_CLASS = ("Mistral4ForCausalLM", "MistralLarge4ForConditionalGeneration")  # not in transformers' auto mapping


def made(config):
    """transformers' model of the config: the class its auto mapping names (Mistral 4's and Mistral Large 4's own,
    which it does not list)."""
    if config.architectures[0] in OWN_CLASS:
        return getattr(transformers, config.architectures[0])(config)
    return AutoModelForCausalLM.from_config(config)


def saved_by_transformers(name: str, folder):
    """The preset's config.json as stepper writes it (an FP8 preset's without its quantization_config:
    transformers makes a model of float weights from a config), a model transformers builds from it,
    drawn and saved to folder / "saved"; transformers' model of that folder, float32, eager."""
    folder.mkdir()
    written = preset_config(name).to_hf()
    if (written.get("quantization_config") or {}).get("quant_method") == "fp8":
        del written["quantization_config"]
    (folder / "config.json").write_text(json.dumps(written))
    model = made(AutoConfig.from_pretrained(folder))
    drawn(model, name)
    model.save_pretrained(folder / "saved")
    loader = type(model) if type(model).__name__ in OWN_CLASS else AutoModelForCausalLM
    return loader.from_pretrained(folder / "saved", dtype=torch.float32, attn_implementation="eager",
                                  experts_implementation="eager").eval()


@pytest.mark.parametrize("name", [n for n in TINY if n not in NOT_BUILT])
def test_a_model_transformers_saves_runs_in_stepper_as_in_transformers(name, tmp_path):
    model = saved_by_transformers(name, tmp_path / name)
    dump = tmp_path / "stepper.safetensors"
    output = LAYER_OUTPUT.get(name, "output")
    out = stepper("run", "--model", tmp_path / name / "saved", "--ids", ",".join(map(str, IDS)), "--start-pos", START,
                  "--attn", "naive", "--dump", dump, "--only", f"layers.*.{output}", "--only", "logits", "--plain")
    assert out.returncode == 0 and not out.stderr, out.stderr
    notes = [line for line in out.stdout.splitlines() if line.startswith("note:")]
    assert notes == ([LONGCAT_NOTE] if name == "tiny-longcat" else []), notes
    mine = load_file(str(dump))
    with torch.no_grad():
        ref = model(torch.tensor([IDS]), position_ids=torch.arange(START, START + len(IDS))[None],
                    output_hidden_states=True)
    layers = sum(re.fullmatch(rf"layers\.\d+\.{output}", n) is not None for n in mine)  # LongCat's sublayers' too
    compared = {f"layers.{i}.{output}": ref.hidden_states[i + 1] for i in range(layers - 1)}  # the last: normed
    compared["logits"] = ref.logits
    errors = {n: rel_err(mine[n].reshape(want.shape), want.numpy()) for n, want in compared.items()}
    assert max(errors.values()) <= TOLERANCE, errors


@pytest.mark.parametrize("name", list(NOT_BUILT))
def test_the_presets_transformers_builds_no_model_from_still_cannot_be_built(name, tmp_path):
    """Should transformers learn to build one, NOT_BUILT's note is out of date: this fails."""
    with pytest.raises((ValueError, KeyError)):
        saved_by_transformers(name, tmp_path / name)
