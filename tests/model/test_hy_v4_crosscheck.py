"""Hy4 (`hy_v4`) as transformers makes and saves it, run by stepper as transformers runs it.

transformers' HYV4ForCausalLM at a tiny size (tests.helpers.hf_hy_v4: a dense layer and three MoE
layers, the last two reusing the index choice of the one before them, three streams, sinks, a clamp
that bites), every parameter drawn, written by save_pretrained (its files name the tensors back as
Hy4's: `self_attn.learnable_sink_param`, `hc_pre.hc_attn_layer.hc_fn`, fused experts). stepper reads
that folder; the model transformers' from_pretrained builds from it is the reference: every
tensor both show over a prompt and two decode steps, on both attention paths, at positions from
0 and from 4100 (rotary angles past 4096 on an empty cache; with YaRN too), whole and over small
tiles, and every expert and index choice. Then the same tensors under the names Hy4's published
checkpoint gives them, config.json's refusals, and the CLI on the folder."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stepper.errors import StepperError
from stepper.families import read_config
from stepper.seams.trace import Recorder
from stepper.session import RunSpec, run
from tests.helpers import hf_hy_v4
from tests.helpers.cli import stepper
from tests.helpers.compare import index_rows_apart, same_experts, small_tiles, untied
from tests.helpers.hf_steps import paired_runs

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPT = 38
STEPS = 3  # tokens generated: the prefill's and two decode steps'
PER_LAYER = ("attn_hc.post", "attn_hc.collapsed", "attn_norm", "attn_output", "ffn_hc.post", "ffn_hc.collapsed",
             "ffn_norm", "ffn_output", "ffn_streams")
GLOBAL = ("hc_head.collapsed", "final_norm", "logits")
STEP_NAMES = ("prefill", "decode0", "decode1")
LAYERS = hf_hy_v4.TINY_HY["num_hidden_layers"]
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 1024,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
CHOOSING = ((0, "topk_idx"), (1, "topk_idx"), (2, "reused_topk_idx"), (3, "reused_topk_idx"))  # full, full, shared


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hy_v4") / "saved"
    hf_hy_v4.random_model(hf_hy_v4.TINY_HY, seed=1).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def reference(saved):
    return transformers.HYV4ForCausalLM.from_pretrained(saved, dtype=torch.float32, attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def default_run(saved, reference) -> tuple[dict, dict, list[int]]:
    """The run both the choices' and the parts' tests read (attn auto: naive prefill, absorbed decode)."""
    return both(saved, reference)


def prompt_ids() -> tuple[int, ...]:
    return tuple(int(i) for i in np.random.default_rng(2).integers(3, hf_hy_v4.TINY_HY["vocab_size"], PROMPT))


def both(folder, reference, **spec) -> tuple[dict, dict, list[int]]:
    """stepper's tensors of a run over the prompt and two decode steps, transformers' over the same."""
    return paired_runs(folder, reference, prompt_ids(), STEPS, hf_hy_v4.trace_steps, **spec)


def shown_alike(mine: dict, ref: dict) -> list[str]:
    """The tensors both show that differ by more than float32 round-off (each compared whole)."""
    names = [f"{s}.layers.{i}.{n}" for s in STEP_NAMES for i in range(LAYERS) for n in PER_LAYER]
    names += [f"{s}.{n}" for s in STEP_NAMES for n in GLOBAL]
    assert set(names) <= set(ref) and set(names) <= set(mine)
    return [n for n in names if not np.allclose(array(mine[n]).reshape(ref[n].shape), ref[n], rtol=1e-4, atol=2e-5)]


def array(shown) -> np.ndarray:
    """A recorded tensor's values (a chunked prefill's are made when read)."""
    return shown.numpy() if hasattr(shown, "numpy") else shown


@pytest.mark.parametrize("attn, start", [("naive", 0), ("absorb", 0), ("naive", 4100), ("absorb", 4100)])
def test_every_tensor_both_show_matches_in_prefill_and_decode(saved, reference, attn, start):
    mine, ref, generated = both(saved, reference, attn=attn, start_pos=start)
    assert shown_alike(mine, ref) == []
    for step, token in enumerate(generated):
        assert int(np.argmax(ref[f"{STEP_NAMES[step]}.logits"][0, -1])) == token


@pytest.mark.parametrize("block", [YARN, {**YARN, "mscale": 0.7, "mscale_all_dim": 0, "attention_factor": 1.3,
                                            "truncate": False}], ids=["mscales", "attention_factor"])
def test_a_model_with_yarn_matches_past_its_original_length(tmp_path, block):
    """YaRN (factor 4 from 1024 positions) at positions from 4100, both paths: mscale_all_dim 1 (the
    softmax scale times mscale^2), or an attention_factor of its own scaling cos and sin, the correction
    range's ends unrounded and an mscale transformers then ignores; the config written back reads the same."""
    folder = tmp_path / "yarn"
    hf_hy_v4.random_model({**hf_hy_v4.TINY_HY, "rope_parameters": block}, seed=4).save_pretrained(folder)
    model = transformers.HYV4ForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                         attn_implementation="eager").eval()
    for attn in ("naive", "absorb"):
        mine, ref, _ = both(folder, model, attn=attn, start_pos=4100)
        assert shown_alike(mine, ref) == [], attn
    cfg = read_config(json.loads((folder / "config.json").read_text()), "Hy4/config.json")
    assert cfg.rope_scaling.factor == 4.0 and read_config(cfg.to_hf(), "Hy4/config.json") == cfg


def test_tiled_attention_and_a_chunked_prefill_match_too(saved, reference, monkeypatch):
    """Scores too many to hold (WHOLE_SCORES cut to 64) and tiles of 2 heads x 4 queries x 7 keys
    on two threads: the online softmax starts from each head's sink and rescales across key tiles;
    a prefill run 16 positions at a time gives the same tensors."""
    small_tiles(monkeypatch)
    for spec in ({"attn": "naive"}, {"attn": "absorb", "chunk": 16}):
        mine, ref, _ = both(saved, reference, **spec)
        assert shown_alike(mine, ref) == [], spec


def test_every_expert_and_index_choice_is_the_same(default_run):
    mine, ref, _ = default_run
    for n, step in enumerate(STEP_NAMES):
        for layer in range(1, LAYERS):  # the MoE layers: the same experts, the same weights
            assert same_experts(mine, ref, f"{step}.layers.{layer}.mlp.gate."), (step, layer)
        for layer, name in CHOOSING:
            chosen = mine[f"{step}.layers.{layer}.self_attn.indexer.{name}"][0]  # [T, Ki], -1: none
            theirs = ref[f"{step}.layers.{layer}.topk_indices"][0]  # [T, Ki], past the query's own: masked
            last = np.arange(PROMPT) if n == 0 else np.array([PROMPT + n - 1])  # each row's own position
            assert index_rows_apart(chosen, theirs, last) == [], (step, layer)
    assert all(len(set(row.tolist())) == 4 for row in mine["prefill.layers.1.self_attn.indexer.topk_idx"][0, 4:])
    for step in STEP_NAMES:  # one top-k: no row's 4th and 5th best scores tie, so the choice is no seed's luck
        for layer in (0, 1):
            assert untied(mine[f"{step}.layers.{layer}.self_attn.indexer.index_scores"][0], 4), (step, layer)


def test_the_clamp_bites_and_the_sinks_take_weight(default_run):
    """What makes the run above a test of Hy4's parts: some routed expert values are clamped, and
    each head's weights sum to less than 1 (the sink's share)."""
    mine, _, _ = default_run
    assert mine["prefill.layers.1.mlp.experts.clamp_counts"].sum() > 0
    sums = mine["prefill.layers.1.self_attn.attn_weights"].sum(axis=-1)  # [B, H, T]
    assert np.all(sums < 1 - 1e-3) and np.all(sums > 0)


def published(saved, folder, rename) -> object:
    """The saved tensors written again to `folder` under the names rename(name) gives."""
    from safetensors.numpy import load_file, save_file

    folder.mkdir()
    (folder / "config.json").write_text((saved / "config.json").read_text())
    save_file({rename(n): v for n, v in load_file(str(saved / "model.safetensors")).items()},
              str(folder / "model.safetensors"))
    return folder


def as_published(name: str) -> str:
    """transformers' save of Hy4 -> the names of Hy4's published files: `hc_attn_layer.hc_pre.hc_fn`,
    `model.hc_head.hc_head_fn`, and the dense and shared experts' `gate_proj` (transformers writes
    `linear_gate` wherever its rename back finds `.gate_proj`)."""
    for site in ("attn", "mlp"):
        name = name.replace(f".hc_pre.hc_{site}_layer.", f".hc_{site}_layer.hc_pre.")
    name = name.replace("model.hc_pre.hc_head.", "model.hc_head.")
    return name if ".self_attn." in name else name.replace(".linear_gate.", ".gate_proj.")


def test_the_published_names_read_the_same(saved, tmp_path):
    folder = published(saved, tmp_path / "published", as_published)
    from safetensors import safe_open

    with safe_open(folder / "model.safetensors", "np") as f:
        assert {"model.layers.0.mlp.gate_proj.weight", "model.layers.1.hc_attn_layer.hc_pre.hc_fn",
                "model.hc_head.hc_head_fn", "model.layers.2.self_attn.linear_gate.weight"} <= set(f.keys())
    want, ours = Recorder(), Recorder()
    run(RunSpec(model=str(saved), ids=prompt_ids()[:9], decode=1), [want])
    run(RunSpec(model=str(folder), ids=prompt_ids()[:9], decode=1), [ours])
    assert np.array_equal(want.tensors()["decode0.logits"], ours.tensors()["decode0.logits"])


def test_a_missing_tensor_is_named_as_the_files_name_it(saved, tmp_path):
    folder = published(saved, tmp_path / "broken", as_published)
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["model.layers.1.hc_attn_layer.hc_pre.hc_scale"]
    save_file(tensors, str(folder / "model.safetensors"))
    out = stepper("run", "--model", folder, "--layer", "1", "--plain")
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "'model.layers.1.hc_attn_layer.hc_pre.hc_scale' is missing" in lines[0], out.stderr


def test_inspect_and_run_on_the_folder(saved):
    listed = stepper("inspect", saved, "--plain")
    assert listed.returncode == 0 and not listed.stderr, listed.stderr
    assert "hy_v4" in listed.stdout.splitlines()[0] and "problem" not in listed.stdout
    ran = stepper("run", "--model", saved, "--layers", "0:4", "--plain")
    assert ran.returncode == 0 and not ran.stderr, ran.stderr
    assert "attn_hc.post" in ran.stdout and "self_attn.indexer.reused_topk_idx" in ran.stdout


def hy_config(**fields) -> dict:
    raw = transformers.HYV4Config(**hf_hy_v4.TINY_HY).to_dict()
    raw.update(fields)
    return raw


def test_the_config_reads_as_transformers_builds_it():
    cfg = read_config(hy_config(), "Hy4/config.json")
    assert (cfg.model_type, cfg.hc_mult, cfg.hc_magnitude, cfg.hc_eps, cfg.swiglu_limit) == ("hy_v4", 3, 1.5, 1e-3, 0.6)
    assert (cfg.first_k_dense_replace, cfg.index_reused_layers, cfg.index_n_heads, cfg.index_topk) == (1, (2, 3), 8, 4)
    assert (cfg.rope_interleave, cfg.indexer_rope_last, cfg.indexer_norm_eps) == (False, True, 0.05)
    assert cfg.attention_sinks and cfg.gate_proj and cfg.fused_experts and cfg.rope_theta == 10000.0
    again = read_config(json.loads(json.dumps(cfg.to_hf())), "Hy4/config.json")
    assert again == cfg
    full = read_config({"model_type": "hy_v4"}, "Hy4/config.json")  # transformers' defaults
    assert (full.num_hidden_layers, full.hidden_size, full.index_reused_layers[:4]) == (34, 2816, (2, 3, 4, 6))


@pytest.mark.parametrize("fields, message", [
    ({"attention_bias": True}, "field 'attention_bias' must be false"),
    ({"layer_types": ["sliding_attention"] * 4}, "field 'layer_types' must be 'indexed_attention' for each"),
    ({"q_lora_rank": None}, "field 'q_lora_rank' is missing"),
    ({"quantization_config": {"quant_method": "fp8"}}, "field 'quantization_config' is not built"),
    ({"rope_parameters": {**YARN, "attention_factor": 0}}, "rope_parameters: field 'attention_factor' must be"),
    ({"rope_parameters": {**YARN, "truncate": 1}}, "rope_parameters: field 'truncate' must be true or false"),
    ({"indexer_types": ["shared", "full", "full", "full"]}, "field 'indexer_types' must start with a 'full' layer"),
    ({"mlp_layer_types": ["dense", "sparse", "dense", "dense"]}, "field 'mlp_layer_types' must be dense layers then"),
    ({"swiglu_limit": 0}, "field 'swiglu_limit' must be"),
    ({"hc_mult": 0}, "field 'hc_mult' must be >= 1"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "field 'rope_parameters.partial_rotary_factor' must be 1.0"),
])
def test_a_field_stepper_does_not_honour_is_refused_by_name(fields, message):
    with pytest.raises(StepperError, match=message) as refused:
        read_config(hy_config(**fields), "Hy4/config.json")
    assert str(refused.value).startswith("Hy4/config.json")


def test_a_remote_folder_runs_as_the_local_one(saved, monkeypatch, tmp_path):
    """The folder served over HTTP range requests: the same tensors, its files' names renamed alike,
    less fetched than the whole file (the embedding's rows of other tokens stay on the server)."""
    pytest.importorskip("huggingface_hub")
    from stepper.weights import remote
    from tests.helpers.range_server import RangeServer
    from tests.helpers.remote_cache import cache_settings

    monkeypatch.setattr(remote, "_chosen", cache_settings(tmp_path))
    want, ours = Recorder(), Recorder()
    run(RunSpec(model=str(saved), ids=prompt_ids()[:9], decode=1), [want])
    with RangeServer(saved.parent) as server:
        run(RunSpec(model=f"{server.url}/{saved.name}/", ids=prompt_ids()[:9], decode=1), [ours])
    assert list(ours.tensors()) == list(want.tensors())
    for name, value in want.tensors().items():
        np.testing.assert_array_equal(array(ours.tensors()[name]), array(value), err_msg=name)
    assert server.sent < (saved / "model.safetensors").stat().st_size
