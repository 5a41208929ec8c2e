"""A port's workflow for each MLA family transformers 5.24 runs: `stepper fixtures export` a tiny
model of the family, load the fixture's weights folder with transformers' `from_pretrained` (the
published layout), dump every module's output and input with hooks (no stepper naming involved),
and `stepper fixtures verify --names transformers` reads that dump through the family's naming
table: every tensor a module gives matches, at the family's own modeling file and line, and a
perturbed module output is named as the first divergence.

Sarvam has no modeling file of its own (transformers runs DeepseekV3ForCausalLM, so its names are
transformers.json's, q_proj included: its q_lora_rank is null); GLM-4.7-Flash, Mistral Small 4,
Youtu and A.X-K1 name their modules as DeepSeek-V3 does, each in its own file (derived tables:
transformers.json's names at the family's lines, A.X-K1 adding its post_mlp_layernorm). A.X-K2 has
a table of its own: its gated norms, fused query and gate projection and indexer change what most
of V3.2's names hold. So has LongCat-Flash (two sublayers a layer, self_attn.0 / mlps.1 for stepper's
sub0. / sub1., a shortcut MoE with zero experts), whose published checkpoint from_pretrained refuses:
its model is built from the config and given the experts fused, zeros in the zero experts' slots.
Kimi Linear and Ling 3 (bailing_hybrid) mix KDA and MLA layers: a name spelt alike in both (q_proj,
o_proj, Ling's g_proj) is read as the kind of layer it is in. Mistral Large 4's text model is named
under model.language_model. of its vision-language wrapper, loaded by its class.
"""

import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from helpers.cli import stepper
from safetensors.numpy import save_file
from test_naming import every_module, perturbed

from stepper.errors import StepperError
from stepper.fixtures.aliases import TABLES, read_table, tables


@pytest.fixture(autouse=True)
def families():
    if not os.environ.get("STEPPER_REQUIRE_CROSSCHECK"):
        pytest.importorskip("torch")
        pytest.importorskip("transformers")


def hooked_dump(folder: Path, path: Path) -> dict[str, np.ndarray]:
    """Every module's output (and first positional input) of transformers' own model of the
    fixture's weights, over the fixture's steps with one cache, saved to `path`."""
    from helpers.hf_families import load

    model = load(folder / "weights")
    dump = every_module(model, json.loads((folder / "manifest.json").read_text())["inputs"]["steps"])
    save_file(dump, str(path))
    return dump


def verified(fixture: Path, dump: Path, tmp_path: Path, name: str) -> tuple[int, dict]:
    report = tmp_path / f"{name}.json"
    result = stepper("fixtures", "verify", fixture, dump, "--names", "transformers", "--allow-missing",
                     "--report", report, "--plain")
    assert result.stderr == "", result.stderr
    return result.returncode, json.loads(report.read_text())


@pytest.mark.parametrize("preset, model_type, source", [
    ("tiny-glm4-flash", "glm4_moe_lite", "models/glm4_moe_lite/modeling_glm4_moe_lite.py"),
    ("tiny-mistral4", "mistral4", "models/mistral4/modeling_mistral4.py"),
    ("tiny-youtu", "youtu", "models/youtu/modeling_youtu.py"),
    ("tiny-axk1", "axk1", "models/axk1/modeling_axk1.py"),
    ("tiny-sarvam", "sarvam_mla", "models/deepseek_v3/modeling_deepseek_v3.py"),
    ("tiny-axk2", "axk2", "models/axk2/modeling_axk2.py"),
])
def test_a_hooked_transformers_dump_of_the_family_verifies_through_the_cli(preset, model_type, source, tmp_path):
    fixture = tmp_path / preset
    exported = stepper("fixtures", "export", fixture, "--model", preset, "--decode", "1", "--plain")
    assert exported.returncode == 0, exported.stderr
    assert json.loads((fixture / "weights" / "config.json").read_text())["model_type"] == model_type
    dump = hooked_dump(fixture, tmp_path / "hf.safetensors")

    code, report = verified(fixture, tmp_path / "hf.safetensors", tmp_path, "good")
    assert code == 0, [c for c in report["tensors"] if c["status"] == "mismatch"][:3]
    assert report["unrecognised"] == [] and not report["ambiguous"], report["unrecognised"][:5]
    matched = {c["name"]: c for c in report["tensors"] if c["status"] == "match"}
    o_proj_reads = "attn_output_gated" if model_type == "axk2" else "attn_output"
    every = {"embed", "rope_cos", "layers.1.self_attn.compressed_kv_norm", f"layers.1.self_attn.{o_proj_reads}",
             "layers.1.attn_residual", "layers.2.output", "norm", "logits"}
    assert {f"prefill.{n}" for n in every} | {f"decode0.{n}" for n in every} <= set(matched)
    assert "prefill.layers.1.self_attn.kv" in matched  # kv_b_proj; the absorbed decode step has none:
    assert "absorb attention path" in report["not_placed"]["decode0.model.layers.1.self_attn.kv_b_proj"]
    assert {c["read_as"]["source"].split(":")[0] for c in matched.values()} == {source}
    if model_type != "youtu":  # dense only
        assert {"prefill.layers.1.mlp.gate.topk_idx", "decode0.layers.1.mlp.routed_output"} <= set(matched)
    if model_type == "axk1":
        assert matched["prefill.layers.1.mlp.post_mlp_layernorm"]["candidate"] == \
            "prefill.model.layers.1.mlp.post_mlp_layernorm"
    if model_type == "axk2":
        gated_norms(matched, report["not_placed"])
    else:
        q = "q_proj" if model_type == "sarvam_mla" else "q_b_proj"
        assert matched["prefill.layers.1.self_attn.q"]["candidate"] == f"prefill.model.layers.1.self_attn.{q}"

    perturbed(dump, "decode0.model.layers.1.self_attn.kv_a_layernorm", tmp_path / "bad.safetensors")
    code, report = verified(fixture, tmp_path / "bad.safetensors", tmp_path, "bad")
    assert code == 1 and report["first_divergence"]["name"] == "decode0.layers.1.self_attn.compressed_kv_norm"


def gated_norms(matched: dict, not_placed: dict) -> None:
    """A.X-K2's gated norm modules give the gated output, their .norm the RMSNorm's (a dense layer's
    post_attention_layernorm is plain); its fused query and gate projection is listed with its reason."""
    candidate = {name: c["candidate"].removeprefix("prefill.model.layers.") for name, c in matched.items()}
    assert candidate["prefill.layers.1.input_layernorm_gated"] == "1.input_layernorm"
    assert candidate["prefill.layers.1.input_layernorm"] == "1.input_layernorm.norm"
    assert candidate["prefill.layers.1.post_attention_layernorm_gated"] == "1.post_attention_layernorm"
    assert candidate["prefill.layers.1.post_attention_layernorm"] == "1.post_attention_layernorm.norm"
    assert candidate["prefill.layers.0.post_attention_layernorm"] == "0.post_attention_layernorm"
    assert candidate["prefill.layers.1.mlp.gate.topk_idx"] == "1.mlp.gate[2]"
    assert candidate["prefill.layers.1.self_attn.indexer.topk_idx"] == "1.self_attn.indexer"
    assert "self_attn.q_gate" in not_placed["prefill.model.layers.1.self_attn.q_gate_proj"]
    assert "input_layernorm_gate" in not_placed["prefill.model.layers.1.input_layernorm.mlp"]


def longcat_from_published(folder: Path):
    """transformers' LongCat-Flash model of a checkpoint in the published layout (the routed experts one
    by one). from_pretrained refuses it: its conversion stacks the 8 routed experts' gate and up weights,
    [8, 2 x 96, 256], where the model allocates a slot for each zero expert too, [12, 2 x 96, 256]. So
    the model is built from the config and given a state dict whose gate_up_proj holds zeros in the zero
    experts' slots (it never reads them: they are identities), down_proj the 8 routed experts."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    stored = {n: t.float() for shard in sorted(folder.glob("*.safetensors")) for n, t in load_file(shard).items()}
    state = {n: t for n, t in stored.items() if ".mlp.experts." not in n}
    for i in range(config.num_layers):
        p = f"model.layers.{i}.mlp.experts."
        routed = range(config.n_routed_experts)
        gate_up = [torch.cat([stored[f"{p}{e}.gate_proj.weight"], stored[f"{p}{e}.up_proj.weight"]]) for e in routed]
        state[p + "gate_up_proj"] = torch.stack(gate_up + [torch.zeros_like(gate_up[0])] * config.zero_expert_num)
        state[p + "down_proj"] = torch.stack([stored[f"{p}{e}.down_proj.weight"] for e in routed])
    model.load_state_dict(state, strict=True)
    return model.eval()


def test_a_hooked_transformers_dump_of_longcat_verifies_through_the_cli(tmp_path):
    """LongCat-Flash's two sublayers (transformers' self_attn.0 / mlps.1, stepper's sub0. / sub1.) and its
    shortcut MoE with zero experts, read through its own table; its model loaded as longcat_from_published
    says, since from_pretrained refuses the published layout."""
    from transformers import LongcatFlashForCausalLM

    fixture = tmp_path / "tiny-longcat"
    exported = stepper("fixtures", "export", fixture, "--model", "tiny-longcat", "--decode", "1", "--plain")
    assert exported.returncode == 0, exported.stderr
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):  # gate_up_proj [8, ...] stored, [12, ...] made
        LongcatFlashForCausalLM.from_pretrained(fixture / "weights")
    model = longcat_from_published(fixture / "weights")
    dump = every_module(model, json.loads((fixture / "manifest.json").read_text())["inputs"]["steps"])
    save_file(dump, str(tmp_path / "hf.safetensors"))
    assert (dump["prefill.model.layers.1.mlp.router[2]"] >= 8).any()  # zero experts were chosen

    code, report = verified(fixture, tmp_path / "hf.safetensors", tmp_path, "good")
    assert code == 0, [c for c in report["tensors"] if c["status"] == "mismatch"][:3]
    assert report["unrecognised"] == [] and not report["ambiguous"], report["unrecognised"][:5]
    matched = {c["name"]: c for c in report["tensors"] if c["status"] == "match"}
    every = {"embed", "layers.1.mlp.gate.topk_idx", "layers.1.mlp.routed_output", "layers.1.output", "logits"}
    every |= {f"layers.1.sub{j}.{n}" for j in (0, 1) for n in ("input_layernorm", "self_attn.compressed_kv_norm",
              "self_attn.attn_output", "attn_residual", "post_attention_layernorm", "mlp.act", "mlp_output")}
    assert {f"prefill.{n}" for n in every} | {f"decode0.{n}" for n in every} <= set(matched)
    candidate = {name: c["candidate"].removeprefix("prefill.model.layers.") for name, c in matched.items()}
    assert candidate["prefill.layers.1.sub1.self_attn.q"] == "1.self_attn.1.q_b_proj"
    assert candidate["prefill.layers.1.sub0.self_attn.kv"] == "1.self_attn.0.kv_b_proj"
    assert candidate["prefill.layers.1.sub1.input_layernorm"] == "1.input_layernorm.1"
    assert candidate["prefill.layers.1.mlp.gate.topk_idx"] == "1.mlp.router[2]"
    assert "mlp.zero_expert_output" in report["not_placed"]["prefill.model.layers.1.mlp.experts.identity_expert"]
    assert {c["read_as"]["source"].split(":")[0] for c in matched.values()} == {
        "models/longcat_flash/modeling_longcat_flash.py"}

    perturbed(dump, "decode0.model.layers.1.self_attn.1.kv_a_layernorm", tmp_path / "bad.safetensors")
    code, report = verified(fixture, tmp_path / "bad.safetensors", tmp_path, "bad")
    assert code == 1 and report["first_divergence"]["name"] == "decode0.layers.1.sub1.self_attn.compressed_kv_norm"


def hooked_export(tmp_path, preset: str):
    """The preset's fixture (one decode step) in tmp_path, transformers' model of its weights folder
    (loaded as written), and that model's dump with every module hooked, saved as hf.safetensors."""
    from helpers.hf_families import load

    fixture = tmp_path / preset
    exported = stepper("fixtures", "export", fixture, "--model", preset, "--decode", "1", "--plain")
    assert exported.returncode == 0, exported.stderr
    model = load(fixture / "weights")
    dump = every_module(model, json.loads((fixture / "manifest.json").read_text())["inputs"]["steps"])
    save_file(dump, str(tmp_path / "hf.safetensors"))
    return fixture, model, dump


def test_a_hooked_transformers_dump_of_kimi_linear_verifies_through_the_cli(tmp_path):
    """tiny-kimi-linear: KDA layers 0-2 (layer 0 dense, then MoE) and MLA layer 3, each module's
    name read as the kind of layer it is in (a KDA layer's o_proj:input at line 714, the MLA
    layer's at 314). The fixture's weights folder loads as written: its config.json gives token ids
    inside the tiny vocabulary of 1000 (without them transformers' KimiLinearConfig takes the
    published model's, pad 163839, and nn.Embedding refuses that padding_idx)."""
    fixture, model, dump = hooked_export(tmp_path, "tiny-kimi-linear")
    assert model.model.embed_tokens.padding_idx == model.config.pad_token_id == 999

    code, report = verified(fixture, tmp_path / "hf.safetensors", tmp_path, "good")
    assert code == 0, [c for c in report["tensors"] if c["status"] == "mismatch"][:3]
    assert report["unrecognised"] == [] and not report["ambiguous"], report["unrecognised"][:5]
    matched = {c["name"]: c for c in report["tensors"] if c["status"] == "match"}
    kda = {f"layers.0.self_attn.{n}" for n in ("q_proj", "v_proj", "forget_gate", "output_gate", "core_out",
                                                "gated_output", "attn_output", "o_proj")}
    mla = {f"layers.3.self_attn.{n}" for n in ("q", "kv_a", "compressed_kv_norm", "attn_weights", "attn_output")}
    every = {"embed", "layers.0.mlp.act", "layers.1.mlp.gate.topk_idx", "layers.2.mlp.routed_output", "norm", "logits"}
    assert {f"{p}.{n}" for p in ("prefill", "decode0") for n in kda | mla | every} <= set(matched)
    assert "prefill.layers.3.self_attn.kv" in matched and "absorb attention path" in \
        report["not_placed"]["decode0.model.layers.3.self_attn.kv_b_proj"]
    source = "models/kimi_linear/modeling_kimi_linear.py"
    assert {c["read_as"]["source"].split(" @")[0] for c in matched.values()} >= {f"{source}:714", f"{source}:314"}
    assert matched["prefill.layers.0.self_attn.attn_output"]["read_as"]["source"].startswith(f"{source}:714 ")
    assert matched["prefill.layers.3.self_attn.attn_output"]["read_as"]["source"].startswith(f"{source}:314 ")
    assert matched["prefill.layers.3.self_attn.q"]["candidate"] == "prefill.model.layers.3.self_attn.q_proj"
    assert "before the sigmoid" in report["not_placed"]["prefill.model.layers.0.self_attn.b_proj"]

    perturbed(dump, "decode0.model.layers.2.self_attn.forget_gate", tmp_path / "bad.safetensors")
    code, report = verified(fixture, tmp_path / "bad.safetensors", tmp_path, "bad")
    assert code == 1 and report["first_divergence"]["name"] == "decode0.layers.2.self_attn.forget_gate"


def test_a_hooked_transformers_dump_of_ling3_verifies_through_the_cli(tmp_path):
    """tiny-ling3 (bailing_hybrid): Kimi Linear's layers as Ling 3 has them, KDA layers 0 and 2
    (layer 0 dense), MLA layers 1 and 3, every module's name read as the kind of layer it is in:
    g_proj is KDA's output gate at line 784 and the MLA heads' gate (head_gate) at 417, o_proj reads
    attn_output in a KDA layer and attn_output_gated in an MLA one. The fixture's weights folder (Ling's
    published names) loads with from_pretrained as written, and the table names exactly the modules
    the hooks see, but a self_attn's input (called with keyword arguments only)."""
    fixture, model, dump = hooked_export(tmp_path, "tiny-ling3")
    assert model.model.embed_tokens.padding_idx == model.config.pad_token_id == 992
    table = {entry["name"] for entry in json.loads((TABLES / "transformers-bailing_hybrid.json").read_text())["names"]}
    seen = {re.sub(r"\.layers\.\d+(?=$|[.:\[])", ".layers.{i}", name.split(".", 1)[1]) for name in dump}
    assert table - seen == {"model.layers.{i}.self_attn:input"} and seen <= table, seen - table

    code, report = verified(fixture, tmp_path / "hf.safetensors", tmp_path, "good")
    assert code == 0, [c for c in report["tensors"] if c["status"] == "mismatch"][:3]
    assert report["unrecognised"] == [] and not report["ambiguous"], report["unrecognised"][:5]
    matched = {c["name"]: c for c in report["tensors"] if c["status"] == "match"}
    kda = {f"layers.0.self_attn.{n}" for n in ("q_proj", "k_proj", "v_proj", "forget_gate", "output_gate", "core_out",
                                                "gated_output", "attn_output", "o_proj")}
    mla = {f"layers.1.self_attn.{n}" for n in ("q", "kv_a", "compressed_kv_norm", "head_gate", "attn_weights",
                                                "attn_output_gated", "o_proj")}
    every = {"embed", "rope_cos", "rope_sin", "layers.0.mlp.act", "layers.1.mlp.gate.topk_idx",
             "layers.2.mlp.routed_output", "layers.3.output", "norm", "logits"}
    assert {f"{p}.{n}" for p in ("prefill", "decode0") for n in kda | mla | every} <= set(matched)
    assert "prefill.layers.1.self_attn.attn_output" not in matched  # before the heads' gate: no module's
    assert "prefill.layers.3.self_attn.kv" in matched and "absorb attention path" in \
        report["not_placed"]["decode0.model.layers.3.self_attn.kv_b_proj"]
    source = "models/bailing_hybrid/modeling_bailing_hybrid.py"
    assert {c["read_as"]["source"].split(":")[0] for c in matched.values()} == {source}
    read_as = {name: (c["candidate"], c["read_as"]["source"].split(" @")[0]) for name, c in matched.items()}
    assert read_as["prefill.layers.0.self_attn.output_gate"] == ("prefill.model.layers.0.self_attn.g_proj",
                                                                 f"{source}:784")
    assert read_as["prefill.layers.1.self_attn.head_gate"] == ("prefill.model.layers.1.self_attn.g_proj",
                                                               f"{source}:417")
    assert read_as["prefill.layers.0.self_attn.attn_output"] == ("prefill.model.layers.0.self_attn.o_proj:input",
                                                                 f"{source}:786")
    assert read_as["prefill.layers.1.self_attn.attn_output_gated"] == (
        "prefill.model.layers.1.self_attn.o_proj:input", f"{source}:421")
    assert read_as["prefill.layers.1.self_attn.q"] == ("prefill.model.layers.1.self_attn.q_proj", f"{source}:383")
    assert "bounded sigmoid" in report["not_placed"]["prefill.model.layers.0.self_attn.forget_gate.f_proj"]

    for module, first in (("layers.2.self_attn.forget_gate", "layers.2.self_attn.forget_gate"),
                          ("layers.3.self_attn.g_proj", "layers.3.self_attn.head_gate")):
        bad = perturbed(dump, f"decode0.model.{module}", tmp_path / f"bad-{first}.safetensors")
        code, report = verified(fixture, bad, tmp_path, f"bad-{first}")
        assert code == 1 and report["first_divergence"]["name"] == f"decode0.{first}"


def test_a_hooked_transformers_dump_of_kimi_k25_verifies_through_the_cli(tmp_path):
    """A Kimi K2.5 checkpoint (`stepper synth --layout kimi_k25`, BF16) loaded as transformers'
    Kimi_K25ForConditionalGeneration: the text model's modules are named under
    model.language_model., the embedding is called by Kimi_K25Model and lm_head by the wrapper.
    Every text weight loads; the vision tower's do not: stepper writes the tower's sizes as vt_*
    fields, which transformers' Kimi_K25VisionConfig does not read, so it builds its default tower
    (1152 wide) and the tiny tower's tensors do not fit it. A text prompt never runs the tower."""
    import torch
    from transformers import Kimi_K25ForConditionalGeneration

    checkpoint, fixture = tmp_path / "k25", tmp_path / "fixture"
    synth = stepper("synth", "--model", "tiny", "--layout", "kimi_k25", "--quant", "bf16", "--out", checkpoint)
    assert synth.returncode == 0, synth.stderr
    exported = stepper("fixtures", "export", fixture, "--model", checkpoint, "--decode", "1", "--plain")
    assert exported.returncode == 0, exported.stderr
    model, info = Kimi_K25ForConditionalGeneration.from_pretrained(
        checkpoint, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager",
        ignore_mismatched_sizes=True, output_loading_info=True)
    unread = [k if isinstance(k, str) else k[0] for kind in ("missing_keys", "mismatched_keys") for k in info[kind]]
    assert not info["unexpected_keys"] and unread
    assert all(k.startswith(("model.vision_tower.", "model.mm_projector.")) for k in unread), unread
    dump = every_module(model.eval(), json.loads((fixture / "manifest.json").read_text())["inputs"]["steps"])
    save_file(dump, str(tmp_path / "hf.safetensors"))

    code, report = verified(fixture, tmp_path / "hf.safetensors", tmp_path, "good")
    assert code == 0, [c for c in report["tensors"] if c["status"] == "mismatch"][:3]
    assert report["unrecognised"] == [] and not report["ambiguous"], report["unrecognised"][:5]
    matched = {c["name"]: c for c in report["tensors"] if c["status"] == "match"}
    every = {"embed", "rope_cos", "layers.1.self_attn.q", "layers.1.self_attn.compressed_kv_norm",
             "layers.1.mlp.gate.topk_idx", "layers.2.output", "norm", "logits"}
    assert {f"{p}.{n}" for p in ("prefill", "decode0") for n in every} <= set(matched)
    assert matched["prefill.layers.1.self_attn.q"]["candidate"] == \
        "prefill.model.language_model.layers.1.self_attn.q_b_proj"
    assert matched["prefill.embed"]["read_as"]["source"].startswith("models/kimi_k25/modeling_kimi_k25.py:678 ")
    assert {c["read_as"]["source"].split(":")[0] for c in matched.values()} == {
        "models/kimi_k25/modeling_kimi_k25.py", "models/deepseek_v3/modeling_deepseek_v3.py"}
    listed = [json.loads(line) for line in stepper("fixtures", "names", "--model", checkpoint, "--json").stdout
              .splitlines()]
    assert {"name": "model.language_model.embed_tokens", "canonical": "embed",
            "source": "models/kimi_k25/modeling_kimi_k25.py:678"}.items() <= next(
        row for row in listed if row["name"] == "model.language_model.embed_tokens").items()

    perturbed(dump, "decode0.model.language_model.layers.1.self_attn.kv_a_layernorm", tmp_path / "bad.safetensors")
    code, report = verified(fixture, tmp_path / "bad.safetensors", tmp_path, "bad")
    assert code == 1 and report["first_divergence"]["name"] == "decode0.layers.1.self_attn.compressed_kv_norm"


def test_a_hooked_transformers_dump_of_mistral_large4_verifies_through_the_cli(tmp_path):
    """tiny-mistral-large4 (layer 0 dense, then MoE): layer 2 reads layer 0's latent and reuses layer 1's
    index choice, so it has no kv_a modules (its kv_b_proj:input is self_attn.shared_latent) and no indexer
    (its self_attn[2] is indexer.reused_topk_idx); layer 3 rotates nothing: its kv_a_proj_with_mqa is the
    latent alone and its softmax_scaling:input the whole query (the table's "nope" names), and its kv_b_proj
    (whole heads, which the fixture shows split) is listed with why.
    transformers has no causal LM of it: the checkpoint (stepper synth, Mistral's consolidated names, no
    vision tower) loads as MistralLarge4ForConditionalGeneration, the text model's modules under
    model.language_model., the vision tower and projector drawn afresh (a text prompt never runs them)."""
    import torch
    from transformers import MistralLarge4ForConditionalGeneration

    checkpoint, fixture = tmp_path / "ml4", tmp_path / "fixture"
    synth = stepper("synth", "--model", "tiny-mistral-large4", "--out", checkpoint)
    assert synth.returncode == 0, synth.stderr
    exported = stepper("fixtures", "export", fixture, "--model", checkpoint, "--decode", "1", "--plain")
    assert exported.returncode == 0, exported.stderr
    model, info = MistralLarge4ForConditionalGeneration.from_pretrained(
        checkpoint, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager",
        output_loading_info=True)
    assert not info["unexpected_keys"] and not info["mismatched_keys"] and info["missing_keys"]
    assert all(k.startswith(("model.vision_tower.", "model.multi_modal_projector.")) for k in info["missing_keys"])
    dump = every_module(model.eval(), json.loads((fixture / "manifest.json").read_text())["inputs"]["steps"])
    save_file(dump, str(tmp_path / "hf.safetensors"))
    layers = "model.language_model.layers."
    table = {e["name"] for e in json.loads((TABLES / "transformers-mistral_large4.json").read_text())["names"]}
    seen = {re.sub(r"\.layers\.\d+(?=$|[.:\[])", ".layers.{i}", name.split(".", 1)[1]) for name in dump}
    assert table - seen == {layers + "{i}.self_attn:input"} and seen <= table, seen - table

    code, report = verified(fixture, tmp_path / "hf.safetensors", tmp_path, "good")
    assert code == 0, [c for c in report["tensors"] if c["status"] == "mismatch"][:3]
    assert report["unrecognised"] == [] and not report["ambiguous"], report["unrecognised"][:5]
    matched = {c["name"]: c for c in report["tensors"] if c["status"] == "match"}
    every = {"embed", "rope_cos", "layers.0.mlp.act", "layers.1.self_attn.q_nope", "layers.1.mlp.gate.topk_idx",
             "layers.1.self_attn.indexer.q_input_norm", "layers.1.self_attn.indexer.q_scaled",
             "layers.1.self_attn.indexer.topk_idx", "layers.2.self_attn.shared_latent",
             "layers.2.self_attn.indexer.reused_topk_idx", "layers.3.self_attn.compressed_kv", "layers.3.output",
             "norm", "logits_uncapped"}
    assert {f"{p}.{n}" for p in ("prefill", "decode0") for n in every} <= set(matched)
    assert {"prefill.layers.1.self_attn.query_states", "prefill.layers.3.self_attn.query_states"} <= set(matched)
    assert "absorb attention path" in report["not_placed"][f"decode0.{layers}1.self_attn.softmax_scaling"]
    assert "NoPE layer" in report["not_placed"][f"prefill.{layers}3.self_attn.kv_b_proj"]
    assert f"prefill.{layers}1.self_attn.kv_b_proj" not in report["not_placed"]
    compared = {c["candidate"]: c["name"] for c in report["tensors"] if c["status"] == "match"} | report["other_names"]
    for step in ("prefill", "decode0"):  # (other_names: a tensor's other names, each compared)
        placed = {f"{step}.{layers}3.self_attn.kv_a_proj_with_mqa": f"{step}.layers.3.self_attn.compressed_kv",
                  f"{step}.{layers}3.self_attn.softmax_scaling:input": f"{step}.layers.3.self_attn.q",
                  f"{step}.{layers}1.self_attn.kv_a_proj_with_mqa": f"{step}.layers.1.self_attn.kv_a"}
        assert placed.items() <= compared.items()
    candidate = {name: c["candidate"].removeprefix(f"prefill.{layers}") for name, c in matched.items()}
    assert candidate["prefill.layers.1.self_attn.q_nope"] == "1.self_attn.softmax_scaling:input"
    assert candidate["prefill.layers.2.self_attn.shared_latent"] == "2.self_attn.kv_b_proj:input"
    assert candidate["prefill.layers.2.self_attn.indexer.reused_topk_idx"] == "2.self_attn[2]"
    assert candidate["prefill.logits_uncapped"] == "prefill.lm_head" and "prefill.logits" not in matched
    assert {c["read_as"]["source"].split(":")[0] for c in matched.values()} == {
        "models/mistral_large4/modeling_mistral_large4.py"}

    # kv_b_proj:input holds every attended position: perturbed in the prefill, where the fixture has them all
    for step, module, first in (("prefill", "1.self_attn.softmax_scaling", "layers.1.self_attn.query_states"),
                                ("prefill", "2.self_attn.kv_b_proj:input", "layers.2.self_attn.shared_latent"),
                                ("prefill", "3.self_attn.kv_a_proj_with_mqa", "layers.3.self_attn.compressed_kv"),
                                ("prefill", "3.self_attn.softmax_scaling:input", "layers.3.self_attn.q"),
                                ("decode0", "3.self_attn.indexer.softmax_scaling",
                                 "layers.3.self_attn.indexer.q_scaled")):
        bad = perturbed(dump, f"{step}.{layers}{module}", tmp_path / f"bad-{first}.safetensors")
        code, report = verified(fixture, bad, tmp_path, f"bad-{first}")
        assert code == 1 and report["first_divergence"]["name"] == f"{step}.{first}"


def test_every_transformers_table_line_calls_the_module_it_names():
    """Each transformers name's line, in the installed modeling file its table was read from (the
    same file: its sha256 as the table gives it), calls the module the name ends with (a decoder
    layer's by the loop's variable, a ModuleList's item by its index, as LongCat's self_attn[0], Kimi K2.5's
    embed_tokens by the accessor that returns it): a
    derived table's line map is checked, not only its names."""
    import transformers

    root = Path(transformers.__file__).parent
    for path in sorted(TABLES.glob("transformers*.json")):
        for file, seal in json.loads(path.read_text())["source"]["files"].items():
            assert hashlib.sha256((root / file).read_bytes()).hexdigest()[:16] == seal["sha256"], (path.name, file)
    for alias in tables()["transformers"]:
        path = re.sub(r"(:input|\[\d+\])$", "", alias.name).split(".")
        module = path[-1]
        calls = {"{i}": ["layer("], "embed_tokens": ["self.embed_tokens(", "self.get_input_embeddings()("]}
        if module.isdigit():
            calls[module] = [f"self.{path[-2]}[{module}]("]
        line = (root / alias.file).read_text().splitlines()[alias.line - 1]
        assert any(call in line for call in calls.get(module, [f"self.{module}("])), \
            (alias.model_types, alias.name, alias.where, line.strip())


def test_a_derived_table_must_give_a_line_for_each_line_it_derives(tmp_path):
    table = json.loads((TABLES / "transformers-youtu.json").read_text())
    del table["derives"]["lines"]["447"]
    (tmp_path / "t.json").write_text(json.dumps(table))
    with pytest.raises(StepperError, match=r"t.json: derives from transformers.json: expected a transformers table "
                                           r"of its own and this file's line for each line it cites \(116, 193"):
        read_table(tmp_path / "t.json", "transformers")
    table["derives"]["lines"]["447"] = 357
    (tmp_path / "t.json").write_text(json.dumps(table))
    names = {a.name: a for a in read_table(tmp_path / "t.json", "transformers")}
    assert names["model.layers.{i}.self_attn.kv_a_layernorm"].where == "models/youtu/modeling_youtu.py:357"
    assert "model.layers.{i}.mlp.gate[0]" not in names  # its line is null: Youtu has no MoE


def test_a_derived_table_may_put_the_names_under_another_module_path():
    """Kimi K2.5's table is V3's names under model.language_model., at V3's own lines, but for the
    two calls Kimi K2.5's files make (the embedding, lm_head)."""
    names = {a.name: a for a in read_table(TABLES / "transformers-kimi_k25.json", "transformers")}
    assert not any(name.startswith("model.layers.") for name in names)
    assert names["model.language_model.layers.{i}.self_attn.kv_b_proj"].where == \
        "models/deepseek_v3/modeling_deepseek_v3.py:416"
    assert names["model.language_model.embed_tokens"].where == "models/kimi_k25/modeling_kimi_k25.py:678"
    assert names["lm_head"].where == "models/kimi_k25/modeling_kimi_k25.py:838"
    assert len(names) == len(read_table(TABLES / "transformers.json", "transformers"))


@pytest.mark.parametrize("preset, model_type, name, rows", [
    ("tiny-kimi-linear", "kimi_linear", "model.layers.{i}.self_attn.o_proj:input", [
        (["self_attn.attn_output", "kda"], "models/kimi_linear/modeling_kimi_linear.py:714"),
        (["self_attn.attn_output", "mla"], "models/kimi_linear/modeling_kimi_linear.py:314")]),
    ("tiny-ling3", "bailing_hybrid", "model.layers.{i}.self_attn.g_proj", [
        (["self_attn.output_gate", "kda"], "models/bailing_hybrid/modeling_bailing_hybrid.py:784"),
        (["self_attn.head_gate", "mla"], "models/bailing_hybrid/modeling_bailing_hybrid.py:417")]),
])
def test_hybrid_names_read_at_80_columns(preset, model_type, name, rows):
    """`stepper fixtures names --model tiny-kimi-linear` (tiny-ling3) in an 80-column terminal: each
    name on its line, and one spelt alike in both kinds of layer given for each, with its line."""
    from helpers.terminal import on_terminal

    screen = on_terminal("fixtures", "names", "--model", preset, columns=80)
    assert screen.code == 0 and screen.lines[0] == f"transformers, {model_type} (read at 5.24.0)"
    found = [i for i, line in enumerate(screen.lines) if line == name]
    assert [(screen.lines[i + 1].split(), screen.lines[i + 2].strip()) for i in found] == rows
