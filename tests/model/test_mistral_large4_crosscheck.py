"""Mistral Large 4 (`mistral_large4`) as transformers makes and saves it, run by stepper as transformers runs it.

transformers' MistralLarge4ForConditionalGeneration at a tiny size (tests.helpers.hf_mistral_large4: a dense
layer and three MoE layers, the third a NoPE layer, 8 experts in 2 groups, YaRN with attention_factor 1), every
parameter drawn (LeRoPE's alpha, the learned query scales, the indexer's LayerNorm biases among them), written
by save_pretrained: Mistral's consolidated names by default (`layers.0.attention.wq.weight`, `lerope.alpha`,
experts one by one), or transformers' own (`model.language_model.*`, fused experts). stepper reads either; the
model transformers' from_pretrained builds is the reference: every tensor both show over a prompt and two
decode steps, on both attention paths, from position 0 and from 4100, whole and over small tiles, chunked, and
every expert and index choice. Then config.json's refusals, and the CLI on the folder."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import load_file

from stepper.errors import StepperError
from stepper.families import read_config
from tests.helpers import hf_mistral_large4 as hf
from tests.helpers.cli import stepper
from tests.helpers.compare import index_rows_apart, same_experts, small_tiles, untied
from tests.helpers.hf_steps import paired_runs

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPT = 38
STEPS = 3  # tokens generated: the prefill's and two decode steps'
STEP_NAMES = ("prefill", "decode0", "decode1")
LAYERS = hf.TINY_TEXT["num_hidden_layers"]
# stepper's name -> the reference's (tests.helpers.hf_mistral_large4.trace_steps)
PER_LAYER = {"hidden_states": "hidden_states", "input_layernorm": "input_layernorm", "self_attn.o_proj": "attn_output",
             "post_attention_layernorm": "post_attention_layernorm", "mlp_output": "mlp_output", "output": "output",
             "self_attn.indexer.q_input_norm": "indexer.q_input_norm"}
GLOBAL = ("rope_cos", "rope_sin", "norm", "logits_uncapped", "logits")
NOPE = 2  # TINY_TEXT's no_rope_layers


def folder_of(tmp_path_factory, name: str, fields: dict, **save) -> object:
    folder = tmp_path_factory.mktemp("mistral_large4") / name
    hf.random_model(fields, seed=1).save_pretrained(folder, **save)
    return folder


def reference_of(folder):
    return transformers.MistralLarge4ForConditionalGeneration.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return folder_of(tmp_path_factory, "consolidated", hf.TINY_TEXT)


@pytest.fixture(scope="module")
def reference(saved):
    return reference_of(saved)


@pytest.fixture(scope="module")
def default_run(saved, reference) -> tuple[dict, dict, list[int]]:
    return both(saved, reference)


def prompt_ids() -> tuple[int, ...]:
    return tuple(int(i) for i in np.random.default_rng(2).integers(3, hf.TINY_TEXT["vocab_size"], PROMPT))


def both(folder, reference, **spec) -> tuple[dict, dict, list[int]]:
    """stepper's tensors of a run over the prompt and two decode steps, transformers' over the same."""
    return paired_runs(folder, reference, prompt_ids(), STEPS, hf.trace_steps, **spec)


def array(shown) -> np.ndarray:
    return shown.numpy() if hasattr(shown, "numpy") else shown


def shown_alike(mine: dict, ref: dict) -> list[str]:
    """The tensors both show that differ by more than float32 round-off (each compared whole), the query
    scales' factors among them ([H, T] here, [B, H, T] and the indexer's [B, T, Hi] there)."""
    pairs = {f"{s}.layers.{i}.{n}": f"{s}.layers.{i}.{r}" for s in STEP_NAMES for i in range(LAYERS)
             for n, r in PER_LAYER.items()}
    pairs |= {f"{s}.{n}": f"{s}.{n}" for s in STEP_NAMES for n in GLOBAL}
    pairs |= {f"{s}.layers.{i}.self_attn.{n}": f"{s}.layers.{i}.{n}" for s in STEP_NAMES for i in range(LAYERS)
              for n in ("softmax_scaling", "indexer.softmax_scaling")}
    pairs = {n: r for n, r in pairs.items() if ".indexer." not in n or r in ref}  # a "shared" layer has none
    assert set(pairs) <= set(mine) and set(pairs.values()) <= set(ref) and len(pairs) > 30 * len(STEP_NAMES)
    return [n for n, r in pairs.items()
            if not np.allclose(array(mine[n]).reshape(ref[r].shape), ref[r], rtol=1e-4, atol=2e-5)]


@pytest.mark.parametrize("attn, start", [("naive", 0), ("absorb", 0), ("naive", 4100), ("absorb", 4100)])
def test_every_tensor_both_show_matches_in_prefill_and_decode(saved, reference, attn, start):
    mine, ref, generated = both(saved, reference, attn=attn, start_pos=start)
    assert shown_alike(mine, ref) == []
    for step, token in enumerate(generated):
        assert int(np.argmax(ref[f"{STEP_NAMES[step]}.logits"][0, -1])) == token


def test_the_nope_layer_rotates_nothing_and_the_others_do(default_run):
    """Layer 2 shows no rotary key or query dims, its heads whole (kv_b's nope + rope + v per head); the
    others show theirs, and the capped logits are 30 tanh(uncapped / 30)."""
    mine, _, _ = default_run
    assert "prefill.layers.2.self_attn.k_pe" not in mine and "prefill.layers.2.self_attn.q_pe_rope" not in mine
    assert "prefill.layers.2.self_attn.indexer.q_rope" not in mine
    assert "prefill.layers.1.self_attn.k_pe_rope" in mine and "prefill.layers.1.self_attn.indexer.q_rope" in mine
    keys = array(mine["prefill.layers.2.self_attn.key_states"])
    assert keys.shape[-1] == hf.TINY_TEXT["qk_nope_head_dim"] + hf.TINY_TEXT["qk_rope_head_dim"]
    raw = array(mine["prefill.logits_uncapped"])
    assert np.allclose(array(mine["prefill.logits"]), 30 * np.tanh(raw / 30), atol=1e-6)


def test_tiled_attention_and_a_chunked_prefill_match_too(saved, reference, monkeypatch):
    """Scores too many to hold (WHOLE_SCORES cut to 64) and tiles of 2 heads x 4 queries x 7 keys on two
    threads; a prefill run 16 positions at a time gives the same tensors."""
    small_tiles(monkeypatch)
    for spec in ({"attn": "naive"}, {"attn": "absorb", "chunk": 16}):
        mine, ref, _ = both(saved, reference, **spec)
        assert shown_alike(mine, ref) == [], spec


def test_every_expert_and_index_choice_is_the_same(default_run):
    mine, ref, _ = default_run
    for n, step in enumerate(STEP_NAMES):
        for layer in range(1, LAYERS):  # the MoE layers: the same experts, the same weights
            assert same_experts(mine, ref, f"{step}.layers.{layer}.mlp.gate."), (step, layer)
        for layer in range(LAYERS):
            chosen = mine[f"{step}.layers.{layer}.self_attn.indexer.topk_idx"][0]  # [T, Ki], -1: none
            theirs = ref[f"{step}.layers.{layer}.topk_indices"][0]  # [T, Ki], past the query's own: masked
            last = np.arange(PROMPT) if n == 0 else np.array([PROMPT + n - 1])
            assert index_rows_apart(chosen, theirs, last) == [], (step, layer)
            if f"{step}.layers.{layer}.self_attn.indexer.index_scores" in mine:  # one top-k: no tie at the 4th
                assert untied(mine[f"{step}.layers.{layer}.self_attn.indexer.index_scores"][0], 4), (step, layer)


def test_transformers_own_layout_reads_the_same(tmp_path_factory, default_run):
    """save_original_format=False: model.language_model.*, lm_head.weight, each layer's experts fused; the
    same tensors as the consolidated files give."""
    folder = folder_of(tmp_path_factory, "transformers", hf.TINY_TEXT, save_original_format=False)
    stored = set(load_file(str(folder / "model.safetensors")))
    assert "model.language_model.layers.1.mlp.experts.gate_up_proj" in stored and "lm_head.weight" in stored
    mine, ref, _ = both(folder, reference_of(folder))
    assert shown_alike(mine, ref) == []
    consolidated, _, _ = default_run
    assert np.array_equal(array(mine["decode1.logits"]), array(consolidated["decode1.logits"]))


def test_a_shared_indexer_layer_matches(tmp_path_factory):
    """indexer_types with a "shared" layer (the last full one's choice) and the NoPE layer first (layer 0)."""
    fields = {**hf.TINY_TEXT, "indexer_types": ["full", "full", "shared", "full"], "no_rope_layers": [0, 1, 1, 1]}
    folder = folder_of(tmp_path_factory, "shared", fields)
    for attn in ("naive", "absorb"):
        mine, ref, _ = both(folder, reference_of(folder), attn=attn, start_pos=4100)
        assert shown_alike(mine, ref) == [], attn
    assert "prefill.layers.2.self_attn.indexer.reused_topk_idx" in mine


SHARING = {**hf.TINY_TEXT, "no_rope_layers": [1, 0, 1, 0], "kv_source_layers": [0, 1, 0, 1],
           "indexer_types": ["full", "full", "full", "shared"]}


@pytest.fixture(scope="module")
def sharing(tmp_path_factory):
    folder = folder_of(tmp_path_factory, "sharing", SHARING)
    return folder, reference_of(folder)


@pytest.mark.parametrize("spec", [{"attn": "naive"}, {"attn": "absorb", "start_pos": 4100},
                                  {"attn": "absorb", "chunk": 16}, {"attn": "naive", "chunk": 16, "start_pos": 4100}])
def test_layers_reading_an_earlier_layers_latent_match(sharing, spec):
    """Layer 2 reads layer 0's latent and turned key with an indexer of its own; layer 3, a NoPE layer,
    reads NoPE layer 1's and reuses layer 2's index choice (transformers' "reuse"): neither has a kv_a
    of its own, each up-projects the latent with its own kv_b."""
    mine, ref, _ = both(*sharing, **spec)
    assert shown_alike(mine, ref) == [], spec
    for layer, source in ((2, 0), (3, 1)):
        assert f"prefill.layers.{layer}.self_attn.kv_a" not in mine
        assert np.array_equal(array(mine[f"decode1.layers.{layer}.self_attn.shared_latent"]),
                              array(mine[f"decode1.layers.{source}.self_attn.compressed_kv_norm"]))
    assert "decode1.layers.2.self_attn.q_pe_rope" in mine and "decode1.layers.2.self_attn.k_pe_rope" not in mine


def test_a_reader_runs_after_its_source_not_alone(sharing):
    folder, _ = sharing
    alone = stepper("run", "--model", str(folder), "--layer", "2")
    assert alone.returncode == 2 and "reads the latent of layer 0" in alone.stderr and "--layers 2:3" in alone.stderr
    shown = stepper("run", "--model", str(folder), "--layers", "2:3", "--prompt-len", "5", "--plain")
    assert shown.returncode == 0 and "layers.2.self_attn.shared_latent" in shown.stdout, shown.stderr
    listing = stepper("inspect", str(folder))
    assert listing.returncode == 0, listing.stderr


def text_config(**fields) -> dict:
    return {"model_type": "mistral_large4", "text_config": {**hf.TINY_TEXT, **fields}}


@pytest.mark.parametrize("fields", [
    {}, {"no_rope_layers": None, "no_rope_layer_interval": 2}, {"no_rope_layers": [1, 1, 0, 1, 0, 0]},
    {"index_topk_pattern": "FSFS"}, {"index_topk_freq": 2, "index_skip_topk_offset": 1},
    {"mlp_layer_types": ["dense", "dense", "sparse", "sparse"]}, {"rope_parameters": None},
    {"rope_parameters": {**hf.TINY_TEXT["rope_parameters"], "attention_factor": 1.25, "truncate": False}},
    {key: SHARING[key] for key in ("no_rope_layers", "kv_source_layers", "indexer_types")},
    {"no_rope_layers": [1, 1, 1, 1], "kv_source_layers": [0, 0, 0, 3]},
    {"rope_parameters": None,
     "rope_scaling": {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 100}},
    {"rope_scaling": {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512, "attention_factor": 1.1}},
    {"n_routed_experts": None, "num_local_experts": 16}, {"n_routed_experts": None, "num_experts": 16},
])
def test_config_json_reads_as_transformers_reads_it(fields):
    """The per-layer facts (NoPE layers, shared indexers, dense layers) and the YaRN block as
    MistralLarge4TextConfig derives them; the config written back reads the same."""
    raw = text_config(**fields)
    raw["text_config"] = {k: v for k, v in raw["text_config"].items() if v is not None or k == "rope_parameters"}
    cfg = read_config(raw, "ML4/config.json")
    theirs = transformers.MistralLarge4Config(**{**raw, "vision_config": hf.TINY_VISION}).text_config
    layers = range(theirs.num_hidden_layers)
    assert [int(i not in cfg.nope_layers) for i in layers] == list(theirs.no_rope_layers[:len(layers)])
    assert ["shared" if cfg.index_reused(i) else "full" for i in layers] == list(theirs.indexer_types)
    assert ["sparse" if cfg.is_moe_layer(i) else "dense" for i in layers] == list(theirs.mlp_layer_types)
    assert [cfg.kv_source(i) for i in layers] == list(theirs.kv_source_layers)
    assert cfg.n_routed_experts == theirs.n_routed_experts
    rope = theirs.rope_parameters
    assert cfg.rope_scaling.factor == rope["factor"] and cfg.rope_scaling.attention_factor == pytest.approx(
        rope.get("attention_factor") or 0.1 * np.log(rope["factor"]) + 1)
    assert read_config(cfg.to_hf(), "ML4/config.json") == cfg
    transformers.MistralLarge4Config(**cfg.to_hf())  # transformers builds the config stepper writes


REFUSED = [
    ({"q_lora_rank": 16}, "q_lora_rank"), ({"norm_topk_prob": False}, "norm_topk_prob"),
    ({"final_logit_softcapping": None}, "final_logit_softcapping"), ({"rope_interleave": False}, "rope_interleave"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"rope_parameters": {**hf.TINY_TEXT["rope_parameters"], "llama_4_scaling_beta": 0.1}},
     "rope_parameters.llama_4_scaling_beta"),
    ({"quantization_config": {"quant_method": "fp8"}}, "quantization_config"),
    ({"attention_bias": True}, "attention_bias"),
    ({"no_rope_layers": [1, 1, 0]}, "no_rope_layers"), ({"no_rope_layers": [1, 2, 0, 1]}, "no_rope_layers"),
    ({"kv_source_layers": [0, 0, 2, 2]}, "kv_source_layers"),  # layer 3 (RoPE) would read layer 0, not NoPE layer 2
    ({"no_rope_layers": [1, 1, 1, 1], "kv_source_layers": [0, 1, 0, 1]}, "kv_source_layers"),  # 2 would read 1
    ({"no_rope_layers": [0, 1, 1, 1], "kv_source_layers": [0, 0, 2, 3]}, "kv_source_layers"),  # none of its kind
    ({"kv_source_layers": [0, 0, 1, 3]}, "kv_source_layers"),  # a chain: layer 1 reads layer 0's in turn
    ({"kv_source_layers": [0, 2, 2, 3]}, "kv_source_layers"),  # a later layer's
    ({"indexer_types": ["shared", "full", "full", "full"]}, "indexer_types"),
    ({"layer_types": ["full_attention"] * 4}, "layer_types"), ({"scoring_func": "sigmoid"}, "scoring_func"),
    ({"n_group": 8}, "n_group"), ({"model_type": "deepseek_v3"}, "text_config.model_type"),
]


@pytest.mark.parametrize("fields, field", REFUSED, ids=[f.split(".")[-1] for _, f in REFUSED])
def test_what_stepper_does_not_build_is_refused_by_name(fields, field):
    with pytest.raises(StepperError, match=f"field '{field}'" if "." not in field else field):
        read_config(text_config(**fields), "ML4/config.json")


def test_a_text_model_config_alone_is_refused():
    with pytest.raises(StepperError, match="MistralLarge4ForConditionalGeneration"):
        read_config({**hf.TINY_TEXT, "model_type": "mistral_large4_text"}, "ML4/config.json")


def test_the_cli_runs_and_inspects_the_saved_folder(saved):
    listing = stepper("inspect", str(saved))
    assert listing.returncode == 0, listing.stderr
    assert "lerope.alpha" in listing.stdout or "rotary_emb.alpha" in listing.stdout
    result = stepper("run", "--model", str(saved), "--layer", "2", "--prompt-len", "5")
    assert result.returncode == 0, result.stderr
    assert "layers.2.self_attn.key_states" in result.stdout and "k_pe" not in result.stdout
