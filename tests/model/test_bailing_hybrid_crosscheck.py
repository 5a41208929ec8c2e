"""Ling 3 (`bailing_hybrid`) as transformers makes and saves it, run by stepper as transformers runs it.

transformers' BailingHybridForCausalLM at a tiny size (tests.helpers.hf_bailing_hybrid: KDA, MLA, KDA,
MLA; a dense first layer, then MoE layers of 8 experts in 4 groups), every parameter drawn, written by
save_pretrained in Ling's published names (`model.word_embeddings`, `attention.*`, `attention.dense`,
`mlp.gate.expert_bias`, each expert apart). stepper reads that folder; the model transformers'
from_pretrained builds from it is the reference: every tensor stepper shows over a 70-token prompt
(longer than one 64-token chunk of the delta rule) and two decode steps, both forms of the delta
rule, both MLA paths, at positions from 0 and from 4100 (rotary angles past 4096), with YaRN, and
with the unbounded (softplus) forget gate; relative error <= 1e-5. Then what the files hold, a
missing tensor named as they name it, config.json's refusals, and the CLI on the folder."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from stepper import families
from stepper.errors import StepperError
from stepper.families import read_config
from stepper.model.cache import KVCache
from stepper.seams.trace import Emitter, Recorder
from stepper.weights.checkpoint import Checkpoint
from tests.helpers import hf_bailing_hybrid
from tests.helpers.cli import stepper
from tests.helpers.compare import compare

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPT, DECODE = 70, 2
TINY = hf_bailing_hybrid.TINY_LING
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 1024,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
# what the comparison must have covered, each not all zero: both kinds of layer, Ling's own tensors, both phases
COVERED = ("prefill.rope_cos", "prefill.layers.0.self_attn.forget_gate", "prefill.layers.0.self_attn.output_gate",
           "prefill.layers.0.self_attn.state_per_chunk", "decode1.layers.2.self_attn.state",
           "prefill.layers.1.self_attn.head_gate", "prefill.layers.1.self_attn.q_pe_rope",
           "decode0.layers.3.self_attn.k_pe_rope", "decode1.layers.3.self_attn.attn_output_gated",
           "decode0.layers.1.self_attn.attn_weights", "prefill.layers.2.mlp.routed_output", "decode1.logits")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return hf_bailing_hybrid.saved(tmp_path_factory.mktemp("ling") / "saved", TINY, seed=1)


@pytest.fixture(scope="module")
def ids() -> np.ndarray:
    return np.random.default_rng(3).integers(2, TINY["vocab_size"], (1, PROMPT + DECODE))


@pytest.fixture(scope="module")
def reference(saved, ids):
    return hf_bailing_hybrid.trace(hf_bailing_hybrid.load(saved), ids[:, :PROMPT], ids[:, PROMPT:])


def stepper_trace(folder, ids, delta_rule: str = "auto", attn: str = "naive", start: int = 0) -> dict[str, np.ndarray]:
    """stepper's model of the folder (its family's), prefill at positions start .. start+PROMPT-1 on an
    empty cache, then a decode step per remaining id."""
    ckpt = Checkpoint(folder, families.load_config)
    model = families.family_for(ckpt.config).build(ckpt)
    model.options = dataclasses.replace(model.options, delta_rule=delta_rule)
    cache, recorder = KVCache(model.config.num_hidden_layers), Recorder()
    steps = [("prefill", slice(0, PROMPT))] + [(f"decode{j}", slice(PROMPT + j, PROMPT + j + 1)) for j in range(DECODE)]
    for phase, span in steps:
        model.forward(ids[:, span], np.arange(span.start, span.stop) + start, Emitter([recorder]).phase(phase), cache,
                      attn=attn)
    return {name: np.asarray(array) for name, array in recorder.tensors().items()}


def mismatches(mine: dict, ref: dict) -> dict[str, str]:
    """Every tensor stepper shows that transformers' trace lacks or that differs from it."""
    assert len(mine) > 300
    lacking = {n: "not in transformers' trace" for n in mine if n not in ref}
    return {**lacking, **{n: why for n in sorted(mine) if n in ref and (why := compare(n, mine, ref))}}


@pytest.mark.parametrize("form", ["chunked", "recurrent"])
def test_every_tensor_matches_transformers(saved, ids, reference, form):
    mine = stepper_trace(saved, ids, form)
    assert mismatches(mine, reference) == {}
    for name in COVERED:
        assert name in mine and np.abs(reference[name]).max() > 0, name
    assert mine["prefill.layers.0.self_attn.state_per_chunk"].shape == (1, 4, 2, 12, 12)  # 64 + 6 tokens, K = 12
    assert mine["prefill.layers.1.self_attn.head_gate"].shape == (1, PROMPT, 4)  # one logit per head
    g = mine["prefill.layers.2.self_attn.forget_gate"]  # within [kda_lower_bound, 0] = [-3, 0] (float32 reaches the
    assert g.max() <= 0 and g.min() >= -3 and g.min() < -2 and g.std() > 0.1  # ends), not stuck at one


@pytest.mark.parametrize("attn", ["naive", "absorb"])
def test_past_position_4096_on_both_mla_paths(saved, ids, attn):
    """The prompt at positions 4100..4169, the decode steps after: the MLA layers' rotary angles
    past 4096 (the absorbed path's own tensors, q_nope_absorbed and attn_output_latent, transformers
    does not make: everything else it does)."""
    ref = hf_bailing_hybrid.trace(hf_bailing_hybrid.load(saved), ids[:, :PROMPT], ids[:, PROMPT:], start=4100)
    mine = stepper_trace(saved, ids, attn=attn, start=4100)
    if attn == "absorb":
        mine = {n: a for n, a in mine.items() if not n.endswith(("q_nope_absorbed", "attn_output_latent"))}
    assert mismatches(mine, ref) == {}


# YaRN blocks transformers reads each its own way: mscale and mscale_all_dim 1 (cos and sin times their ratio, 1;
# the softmax scale times mscale_all_dim's mscale^2), neither (cos and sin times 0.1 ln 4 + 1), mscale_all_dim
# alone (the same, though stepper's ratio would read mscale as 1), an attention_factor of its own with the
# correction range's ends left unrounded (truncate false)
YARNS = {"both": YARN, "neither": {k: v for k, v in YARN.items() if not k.startswith("mscale")},
         "all_dim_alone": {**{k: v for k, v in YARN.items() if k != "mscale"}, "mscale_all_dim": 0.7},
         "attention_factor": {**YARN, "attention_factor": 0.8, "truncate": False, "beta_fast": 24.0}}


@pytest.mark.parametrize("name", [*YARNS, "softplus"])
def test_yarn_as_transformers_reads_it_and_the_unbounded_forget_gate(tmp_path, ids, name):
    """Each YaRN block from position 4100; and kda_safe_gate false: g = -exp(A_log) softplus(f_proj(x)
    + dt_bias), with no bound. Each config written back reads the same."""
    fields = {"kda_safe_gate": False} if name == "softplus" else {"rope_parameters": YARNS[name]}
    folder = hf_bailing_hybrid.saved(tmp_path / name, {**TINY, **fields}, seed=4)
    ref = hf_bailing_hybrid.trace(hf_bailing_hybrid.load(folder), ids[:, :PROMPT], ids[:, PROMPT:], start=4100)
    assert mismatches(stepper_trace(folder, ids, start=4100), ref) == {}, name
    cfg = read_config(json.loads((folder / "config.json").read_text()), "Ling/config.json")
    assert read_config(cfg.to_hf(), "Ling/config.json") == cfg
    if name == "softplus":
        assert cfg.kda_lower_bound is None and ref["prefill.layers.0.self_attn.forget_gate"].min() < -5
    else:
        assert cfg.rope_scaling.factor == 4.0 and cfg.rope_scaling.truncate == (name != "attention_factor")


def test_the_files_hold_lings_names_and_stepper_reads_them(saved):
    from safetensors import safe_open

    with safe_open(saved / "model.safetensors", "np") as f:
        held = set(f.keys())
    assert {"model.word_embeddings.weight", "model.layers.1.attention.dense.weight",
            "model.layers.0.attention.f_proj.weight", "model.layers.1.mlp.gate.expert_bias",
            "model.layers.0.attention.q_conv1d.weight", "model.layers.1.mlp.experts.7.down_proj.weight"} <= held
    assert not any(".self_attn." in n or "embed_tokens" in n for n in held)
    ckpt = Checkpoint(saved, families.load_config)
    assert ckpt.has("model.embed_tokens.weight") and ckpt.has("model.layers.1.mlp.gate.e_score_correction_bias")


def test_synth_writes_lings_names_and_they_read_back_to_the_same_run(tmp_path):
    """`stepper synth --model tiny-ling3` writes the files as Ling's are named (write_name, read_name's
    inverse); a run on them is the preset's run."""
    out = stepper("synth", "--model", "tiny-ling3", "--out", tmp_path / "ling")
    assert out.returncode == 0, out.stderr
    held = set(json.loads((tmp_path / "ling" / "model.safetensors.index.json").read_text())["weight_map"])
    assert {"model.word_embeddings.weight", "model.layers.1.attention.dense.weight",
            "model.layers.1.mlp.gate.expert_bias", "model.layers.0.attention.f_proj.weight"} <= held
    assert not any(".self_attn." in n or "embed_tokens" in n or "e_score" in n for n in held)
    ran = [stepper("run", "--model", model, "--only", "logits", "--plain").stdout.splitlines()[-3:-1]
           for model in (tmp_path / "ling", "tiny-ling3")]
    assert ran[0] == ran[1] and "min" in ran[0][0]


def test_a_missing_tensor_is_named_as_the_files_name_it(saved, tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text((saved / "config.json").read_text())
    tensors = load_file(str(saved / "model.safetensors"))
    del tensors["model.layers.1.attention.g_proj.weight"]
    save_file(tensors, str(folder / "model.safetensors"))
    out = stepper("run", "--model", folder, "--layer", "1", "--plain")
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "'model.layers.1.attention.g_proj.weight' is missing" in lines[0], out.stderr


REFUSED = [
    ({"q_lora_rank": 16}, "q_lora_rank"),
    ({"num_key_value_heads": 2}, "num_key_value_heads"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"attention_bias": True}, "attention_bias"),
    ({"qk_rope_head_dim": 7}, "qk_rope_head_dim"),
    ({"layer_types": ["linear_attention"] * 3}, "layer_types"),
    ({"layer_types": ["linear_attention", "sliding_attention", "full_attention", "full_attention"]}, "layer_types"),
    ({"mlp_layer_types": ["dense", "sparse", "dense", "sparse"]}, "mlp_layer_types"),
    ({"rope_parameters": {**YARN, "attention_factor": -0.5}}, "rope_parameters.attention_factor"),
    ({"rope_parameters": {**YARN, "truncate": "no"}}, "rope_parameters.truncate"),
    ({"num_experts": 6}, "num_expert_group"),
    ({"num_experts": 4}, "num_expert_group"),  # one expert a group: a group scores by its top 2
    ({"num_experts": 0}, "num_experts"),
    ({"num_experts_per_token": 5}, "num_experts_per_token"),  # more than the 2 kept groups of 2 hold
    ({"num_experts_per_tok": 3}, "num_experts_per_tok"),  # transformers' other name, the two disagreeing
    ({"n_group": 3, "num_expert_group": None}, "n_group"),  # the other name, named in the message
    ({"kda_lower_bound": "low"}, "kda_lower_bound"),
    ({"kda_lower_bound": 0.5}, "kda_lower_bound"),
    ({"quantization_config": {"quant_method": "fp8"}}, "quantization_config"),
]


@pytest.mark.parametrize("changes, field", REFUSED, ids=[field for _, field in REFUSED])
def test_a_config_stepper_cannot_run_as_transformers_does_is_refused_naming_the_field(saved, changes, field):
    raw = {**json.loads((saved / "config.json").read_text()), **changes}
    raw = {k: v for k, v in raw.items() if v is not None}
    with pytest.raises(StepperError) as e:
        read_config(raw, "Ling/config.json")
    block, _, inner = field.rpartition(".")  # a rope block's field is named after the block
    assert str(e.value).startswith(f"Ling/config.json: {block + ': ' if block else ''}field '{inner}'"), str(e.value)


READ = [
    {},  # BailingHybridConfig's defaults: 42 layers, MLA every 6th, two dense ones first, rope_theta 6e6
    {"num_hidden_layers": 12, "layer_group_size": 3, "first_k_dense_replace": 0, "rope_theta": 1e6},
    {"num_hidden_layers": 4, "mlp_layer_types": ["dense", "dense", "dense", "sparse"],
     "layer_types": ["full_attention", "linear_attention", "linear_attention", "full_attention"]},
    {"num_experts_per_tok": 4, "n_group": 4, "norm_topk_prob": False, "max_position_embeddings": 1000,
     "num_local_experts": 32, "n_shared_experts": 2, "topk_group": 2},  # transformers' other names
    {"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}, "kda_safe_gate": False},
    {"kda_lower_bound": -2.0, "head_dim": 64, "linear_head_dim": 96, "linear_num_heads": 16,
     "linear_conv_kernel_dim": 3, "tie_word_embeddings": True},
]


@pytest.mark.parametrize("fields", READ, ids=range(len(READ)))
def test_a_config_reads_as_transformers_reads_it(fields):
    """stepper's reading of a config.json against transformers' BailingHybridConfig of the same
    fields: which layers are KDA and which MoE, the rotary base, the KDA sizes, the router's sizes
    under either name, the forget gate's bound (None: the softplus gate)."""
    raw = {"model_type": "bailing_hybrid", **fields}
    cfg, theirs = read_config(raw, "Ling/config.json"), transformers.BailingHybridConfig(**fields)
    layers = range(theirs.num_hidden_layers)
    assert cfg.kda_layers == tuple(i for i in layers if theirs.layer_types[i] == "linear_attention")
    assert [cfg.is_moe_layer(i) for i in layers] == [theirs.mlp_layer_types[i] == "sparse" for i in layers]
    assert cfg.rope_theta == theirs.rope_parameters["rope_theta"]
    assert (cfg.linear_head_dim, cfg.linear_num_heads, cfg.short_conv_kernel_size) == (
        theirs.linear_head_dim, theirs.linear_num_heads, theirs.linear_conv_kernel_dim)
    assert (cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group, cfg.norm_topk_prob,
            cfg.n_shared_experts, cfg.max_position_embeddings, cfg.routed_scaling_factor) == (
        theirs.num_experts, theirs.num_experts_per_token, theirs.num_expert_group, theirs.topk_group,
        theirs.moe_renormalize, theirs.num_shared_experts, theirs.model_max_length, theirs.routed_scaling_factor)
    assert cfg.kda_lower_bound == (theirs.kda_lower_bound if theirs.kda_safe_gate else None)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim,
            cfg.v_head_dim, cfg.rms_norm_eps) == (theirs.num_hidden_layers, theirs.hidden_size, theirs.kv_lora_rank,
                                                  theirs.qk_nope_head_dim, theirs.qk_rope_head_dim, theirs.v_head_dim,
                                                  theirs.rms_norm_eps)
    assert read_config(cfg.to_hf(), "Ling/config.json") == cfg


def test_inspect_and_run_on_the_folder(saved):
    listed = stepper("inspect", saved, "--plain")
    assert listed.returncode == 0 and not listed.stderr, listed.stderr
    assert "bailing_hybrid" in listed.stdout.splitlines()[0] and "problem" not in listed.stdout
    assert "'model.embed_tokens.weight' is stored as 'model.word_embeddings.weight'" in " ".join(listed.stdout.split())
    ran = stepper("run", "--model", saved, "--decode", "2", "--plain")
    assert ran.returncode == 0 and not ran.stderr, ran.stderr
    assert "decode1.layers.3.self_attn.head_gate" in ran.stdout
    drawn = stepper("run", "--model", saved, "--layers", "0:1", "--show", "state", "--only", "*.state", "--plain")
    assert drawn.returncode == 0 and "how fast each key channel forgets" in drawn.stdout + drawn.stderr, drawn.stderr
