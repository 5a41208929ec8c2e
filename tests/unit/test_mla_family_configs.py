"""The MLA families' config.json readers (stepper/families): each published config read into
stepper's MLA config with its renamed fields and defaults, written back by `published` as the
family writes it, and a field stepper does not build refused naming that field."""

import copy
import dataclasses
import json
import math
import re

import numpy as np
import pytest
from helpers.cli import refused, stepper
from helpers.configs import family_preset

from stepper import families
from stepper.config import MAX_COUNT, Config
from stepper.errors import StepperError
from stepper.families.youtu import YoutuModel
from stepper.model import Transformer
from stepper.presets import PRESETS
from stepper.weights.names import unread_layer_shapes, weight_shapes, zero_layer_shapes
from stepper.weights.seeded import SyntheticWeights


def read(raw: dict) -> Config:
    return families.read_config(copy.deepcopy(raw), "config.json")


def refusal(raw: dict) -> str:
    with pytest.raises(StepperError) as e:
        read(raw)
    return str(e.value)


@pytest.mark.parametrize("name", ["tiny-sarvam", "sarvam-105b", "tiny-youtu", "youtu-llm-2b", "tiny-glm4-flash",
                                  "glm-4.7-flash", "tiny-axk1", "a.x-k1",
                                  "tiny-mistral4", "mistral-small-4", "tiny-minicpm3", "minicpm3-4b", "tiny-glm5",
                                  "glm-5", "tiny-axk2", "a.x-k2", "tiny-longcat", "longcat-flash"])
def test_the_published_config_reads_back_from_what_synth_writes(name):
    cfg = family_preset(name)
    assert read(cfg.to_hf()) == dataclasses.replace(cfg, name="config.json")


def test_sarvam_reads_its_older_names_as_deepseek_v3s():
    raw = PRESETS["tiny-sarvam"]
    cfg = read(raw)
    assert (cfg.n_routed_experts, cfg.n_shared_experts) == (raw["num_experts"], raw["num_shared_experts"]) == (16, 1)
    assert cfg.rope_scaling.factor == 4.0 and cfg.q_lora_rank is None  # deepseek_yarn is YaRN
    assert read({**raw, "head_dim": 12345}) == cfg  # vLLM's cache width, not the attention's: not read
    written = cfg.to_hf()
    assert "n_routed_experts" not in written and written["rope_scaling"]["type"] == "deepseek_yarn"
    full = family_preset("sarvam-105b")  # SarvamMLAConfig's defaults: 32 layers of 128 experts, top 8, one group
    assert (full.num_hidden_layers, full.n_routed_experts, full.num_experts_per_tok, full.n_group) == (32, 128, 8, 1)


def test_sarvam_105b_routes_over_all_experts_and_scales_its_softmax_by_yarn():
    cfg = family_preset("sarvam-105b")  # no n_group in its config.json: transformers' one group (families/sarvam_mla)
    assert (cfg.n_group, cfg.topk_group, cfg.max_position_embeddings) == (1, 1, 131072)
    model = Transformer(SyntheticWeights(cfg))  # 192^-0.5 x (0.1 ln 40 + 1)^2, the cos/sin factor 1
    assert model.softmax_scale == pytest.approx(192**-0.5 * (0.1 * math.log(40) + 1) ** 2, rel=1e-12)
    assert round(model.softmax_scale, 5) == 0.13523 and model.rope_mscale == 1.0


def test_youtu_is_dense_and_tied():
    cfg = read(PRESETS["tiny-youtu"])
    assert cfg.tie_word_embeddings and cfg.zeroed_pad_row == 999 and cfg.n_routed_experts == 0
    assert not any(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
    assert "lm_head.weight" not in weight_shapes(cfg) and "model.layers.0.mlp.gate_proj.weight" in weight_shapes(cfg)
    untied = read({**PRESETS["tiny-youtu"], "tie_word_embeddings": False})
    assert not untied.tie_word_embeddings and "lm_head.weight" in weight_shapes(untied)
    assert family_preset("youtu-llm-2b").rope_theta == 1600000


def test_glm4_flash_dense_layers_follow_mlp_layer_types():
    raw = PRESETS["tiny-glm4-flash"]
    assert [read(raw).is_moe_layer(i) for i in range(3)] == [False, True, True]
    two_dense = read({**raw, "first_k_dense_replace": 2, "mlp_layer_types": ["dense", "dense", "sparse"]})
    assert [two_dense.is_moe_layer(i) for i in range(3)] == [False, False, True]
    every_other = read({**raw, "num_hidden_layers": 5, "first_k_dense_replace": None,
                        "mlp_layer_types": ["dense", "dense", "sparse", "dense", "sparse"]})
    assert (every_other.first_k_dense_replace, every_other.moe_layer_freq) == (2, 2)
    full = family_preset("glm-4.7-flash")  # v_head_dim 256 next to nope 192; 46 MoE layers of 64 experts
    assert (full.v_head_dim, full.qk_nope_head_dim, full.rms_norm_eps) == (256, 192, 1e-5)
    assert sum(full.is_moe_layer(i) for i in range(full.num_hidden_layers)) == 46


def test_axk1_has_its_moe_output_norm_and_no_router_bias():
    cfg = read(PRESETS["tiny-axk1"])
    assert cfg.moe_output_norm and not cfg.router_bias
    shapes = weight_shapes(cfg)
    assert not any(n.endswith("e_score_correction_bias") for n in shapes)
    norms = [f"model.layers.{i}.post_mlp_layernorm.weight" for i in range(cfg.num_hidden_layers)]
    assert [name in shapes for name in norms] == [False, True, True]  # read in the MoE layers alone
    assert unread_layer_shapes(cfg, 0) == {norms[0]: (320,)} and unread_layer_shapes(cfg, 1) == {}  # published
    assert zero_layer_shapes(cfg, 1) == {"model.layers.1.mlp.gate.e_score_correction_bias": (32,)}  # transformers'
    assert zero_layer_shapes(cfg, 0) == {}
    full = family_preset("a.x-k1")
    assert (full.n_routed_experts, full.n_group, full.topk_group, full.num_hidden_layers) == (192, 8, 4, 61)


def test_mistral4_scales_queries_routes_by_softmax_and_fuses_its_experts():
    cfg = read(PRESETS["tiny-mistral4"])
    assert (cfg.scoring_func, cfg.router_bias, cfg.fused_experts) == ("softmax", False, True)
    assert (cfg.query_scale.beta, cfg.query_scale.original_max_position_embeddings) == (0.1, 4096)
    full = family_preset("mistral-small-4")  # Mistral4Config's defaults: YaRN x128 from 8192, beta 0.1
    assert (full.rope_scaling.factor, full.rope_scaling.original_max_position_embeddings) == (128.0, 8192)
    assert (full.n_routed_experts, full.num_experts_per_tok, full.first_k_dense_replace) == (128, 4, 0)
    assert read({**PRESETS["tiny-mistral4"], "rope_parameters": {
        **PRESETS["tiny-mistral4"]["rope_parameters"], "llama_4_scaling_beta": 0.0}}).query_scale is None


@pytest.mark.parametrize("raw, field", [
    ({**PRESETS["tiny-mistral4"], "rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                      "original_max_position_embeddings": 4096}},
     "llama_4_scaling_beta"),
    ({**PRESETS["tiny-mistral4"], "rope_parameters": {**PRESETS["tiny-mistral4"]["rope_parameters"],
                                                      "partial_rotary_factor": 1.0}},
     "rope_parameters.partial_rotary_factor"),
    ({**PRESETS["tiny-mistral4"], "moe_layer_freq": 2}, "moe_layer_freq"),
    ({**PRESETS["tiny-mistral4"], "quantization_config": {"quant_method": "fp8"}},  # 128x128 blocks: not published
     "quantization_config.weight_block_size"),
    ({**PRESETS["tiny-axk1"], "q_lora_rank": None}, "q_lora_rank"),
    ({**PRESETS["tiny-axk1"], "mlp_layer_types": ["dense", "sparse", "dense"]}, "mlp_layer_types"),
    ({**PRESETS["tiny-axk1"], "scoring_func": "softmax"}, "scoring_func"),
    ({**PRESETS["tiny-glm4-flash"], "partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({**PRESETS["tiny-glm4-flash"], "rope_parameters": {"rope_theta": 1e6, "partial_rotary_factor": 0.5}},
     "rope_parameters.partial_rotary_factor"),
    ({**PRESETS["tiny-glm4-flash"], "first_k_dense_replace": 2}, "first_k_dense_replace"),
    ({**PRESETS["tiny-glm4-flash"], "mlp_layer_types": ["dense", "sparse", "dense"]}, "mlp_layer_types"),
    ({**PRESETS["tiny-youtu"], "n_routed_experts": 8}, "n_routed_experts"),
    ({**PRESETS["tiny-youtu"], "pad_token_id": 1000}, "pad_token_id"),
    ({**PRESETS["tiny-youtu"], "qk_head_dim": 64}, "qk_head_dim"),
    ({**PRESETS["tiny-youtu"], "rope_interleave": False}, "rope_interleave"),
    ({**PRESETS["tiny-sarvam"], "rope_interleave": False}, "rope_interleave"),
    ({**PRESETS["tiny-sarvam"], "q_head_dim": 64}, "q_head_dim"),
    ({**PRESETS["tiny-sarvam"], "n_routed_experts": 8}, "num_experts"),
    ({**PRESETS["tiny-sarvam"], "moe_layer_freq": 2}, "moe_layer_freq"),
    ({**PRESETS["tiny-sarvam"], "num_experts": 1.5}, "num_experts"),  # read as n_routed_experts, named as given
    ({**PRESETS["tiny-sarvam"], "num_shared_experts": -1}, "num_shared_experts"),
    ({**PRESETS["tiny-sarvam"], "num_experts_per_tok": 17}, "num_experts_per_tok' (17) must not exceed num_experts"),
])
def test_a_field_stepper_does_not_build_is_refused_by_name(raw, field):
    assert f"field '{field}" in refusal(raw)


ODD = ("x", None, [], {}, -1, 0, 1.5, True, [1, 2], {"a": 1}, 10**12)
FAMILY_PRESETS = ("tiny-sarvam", "tiny-youtu", "tiny-glm4-flash", "tiny-axk1", "tiny-mistral4")
FAMILY_FIELDS = ("mlp_layer_types", "num_experts", "num_shared_experts", "head_dim", "q_head_dim", "rope_interleave",
                 "partial_rotary_factor", "pad_token_id", "tie_word_embeddings", "rope_parameters", "rope_scaling",
                 "first_k_dense_replace", "moe_layer_freq", "n_routed_experts")


@pytest.mark.parametrize("name", FAMILY_PRESETS)
def test_any_odd_value_of_any_field_is_read_or_refused_with_a_stepper_error(name):
    """Every field of the family's preset (and the fields families read), each set to an odd value,
    in the rope block too: read, or refused with a StepperError (one line), never another exception."""
    base = PRESETS[name]
    block = "rope_parameters" if "rope_parameters" in base else "rope_scaling"
    rope = base.get(block) or {}
    variants = [{**base, field: value} for field in (*base, *FAMILY_FIELDS) for value in ODD]
    variants += [{**base, block: {**rope, key: value}} for key in (*rope, "llama_4_scaling_beta",
                                                                   "original_max_position_embeddings") for value in ODD]
    for raw in variants:
        try:
            read(raw)
        except StepperError as e:
            assert "\n" not in str(e) and "config.json" in str(e)


MISTRAL3 = {"architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3", "image_token_index": 10,
            "text_config": PRESETS["tiny-mistral4"], "vision_config": {"model_type": "pixtral", "hidden_size": 32}}


def test_mistral_small_4_reads_from_its_vision_language_wrapper():
    cfg = read(MISTRAL3)
    text = read(PRESETS["tiny-mistral4"])
    assert dataclasses.replace(cfg, wrapper=None, name="x") == dataclasses.replace(text, name="x")
    assert cfg.wrapper.text_prefix == "language_model." and set(cfg.wrapper.unused_fields) == {"image_token_index",
                                                                                                "vision_config"}


@pytest.mark.parametrize("raw, field", [
    ({**MISTRAL3, "text_config": {**PRESETS["tiny-mistral4"], "model_type": "ministral3"}}, "text_config.model_type"),
    ({**MISTRAL3, "text_config": None}, "text_config.model_type"),
    ({**MISTRAL3, "tie_word_embeddings": True}, "tie_word_embeddings"),
    ({**MISTRAL3, "text_config": {**PRESETS["tiny-mistral4"], "moe_layer_freq": 2}}, "moe_layer_freq"),
])
def test_the_wrapper_refuses_by_name(raw, field):
    assert f"field '{field}'" in refusal(raw)


# One field of each family's config.json that stepper does not build, as that config.json spells it
# (LongCat's moe_topk and num_layers, Sarvam's num_experts, Youtu's rope_parameters.rope_theta are
# read under DeepSeek-V3's names, and refused under their own), and the refusal's exact words.
REFUSED = [
    ("tiny-sarvam", {"num_experts": "x"}, "field 'num_experts'"),
    ("tiny-youtu", {"rope_parameters": {"rope_theta": -1.0, "rope_type": "default"}},
     "rope_parameters: field 'rope_theta'"),
    ("tiny-glm4-flash", {"partial_rotary_factor": 0.5}, "field 'partial_rotary_factor'"),
    ("tiny-axk1", {"scoring_func": "softmax"}, "field 'scoring_func'"),
    ("tiny-mistral4", {"quantization_config": {"quant_method": "fp8"}},
     "field 'quantization_config.weight_block_size'"),
    ("tiny-mistral4", {"rope_parameters": "yarn"}, "field 'rope_parameters'"),
    ("tiny-minicpm3", {"mlp_bias": True}, "field 'mlp_bias'"),
    ("tiny-minicpm3", {"hidden_size": 2}, "field 'hidden_size'"),  # v_head_dim, absent, would be hidden / heads
    ("tiny-glm5", {"indexer_types": ["shared", "full", "full"]}, "field 'indexer_types'"),
    ("tiny-axk2", {"gated_norm_rank": 0}, "field 'gated_norm_rank'"),
    ("tiny-longcat", {"moe_topk": 13}, "field 'moe_topk'"),  # 8 experts + 4 zero experts
    ("tiny-longcat", {"num_layers": 0}, "field 'num_layers'"),
    ("tiny-longcat", {"expert_ffn_hidden_size": "x"}, "field 'expert_ffn_hidden_size'"),
]


@pytest.mark.parametrize("name, fields, named", REFUSED)
def test_the_cli_refuses_a_field_naming_it_as_the_family_spells_it(tmp_path, name, fields, named):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**PRESETS[name], **fields}))
    result = stepper("run", "--model", folder)
    assert result.returncode == 2 and result.stdout == "" and result.stderr.strip().count("\n") == 0
    assert "Traceback" not in result.stderr and f"config.json: {named} " in result.stderr
    assert len(re.findall("field '", result.stderr)) == 1, result.stderr


@pytest.mark.parametrize("name, fields, layers, named", [
    ("tiny-axk2", {"mlp_layer_types": ["dense", "sparse", "sparse"]}, MAX_COUNT, "mlp_layer_types"),
    ("tiny-glm5", {"mlp_layer_types": ["dense", "sparse", "sparse"]}, MAX_COUNT, "indexer_types"),  # 3 for 65536
    ("tiny-axk2", {}, 10**12, "num_hidden_layers"),  # more layers than a config can have
    ("glm-5", {}, 10**12, "num_hidden_layers"),
])
def test_a_huge_layer_count_is_refused_without_listing_its_layers(name, fields, layers, named):
    """The per-layer lists (mlp_layer_types, indexer_types) are compared by length first, and the
    count itself has a bound: a config of 10^12 layers is refused in a moment, never a list of
    10^12 entries built."""
    raw = {**PRESETS[name], **fields, "num_hidden_layers": layers}
    assert f"field '{named}'" in refusal(raw)
    assert read({**raw, "mlp_layer_types": None, "num_hidden_layers": 3}).num_hidden_layers == 3


TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def token_ids(cfg) -> list[int]:
    """Every special token id the config gives (eos_token_id may be a list)."""
    values = [getattr(cfg, k) for k in TOKEN_IDS]
    return [i for v in values if v is not None for i in (v if isinstance(v, tuple) else (v,))]


@pytest.mark.parametrize("tiny, full, from_end", [
    ("tiny-youtu", "youtu-llm-2b", (256, 255)), ("tiny-axk1", "a.x-k1", (149, 149)),
    ("tiny-axk2", "a.x-k2", (149, 149)),
    ("tiny-sarvam", "sarvam-105b", None), ("tiny-mistral4", "mistral-small-4", None),
    ("tiny-minicpm3", "minicpm3-4b", None), ("tiny-glm5", "glm-5", None), ("tiny-longcat", "longcat-flash", None)])
def test_the_special_token_ids_are_read_and_written_back(tiny, full, from_end):
    """Each preset's ids as its config.json gives them, written back by the family's writer; the
    tiny one's inside its vocabulary: bos and eos as far from its end as the published ones
    (from_end) where those lie past 1,000."""
    for name in (tiny, full):
        written = {k: v for k, v in family_preset(name).to_hf().items() if k in TOKEN_IDS}
        assert written and written == {k: PRESETS[name][k] for k in TOKEN_IDS if k in PRESETS[name]}
    small, big = family_preset(tiny), family_preset(full)
    assert token_ids(small) and all(0 <= i < small.vocab_size for i in token_ids(small))
    if from_end:
        assert (small.vocab_size - small.bos_token_id, small.vocab_size - small.eos_token_id) == from_end
        assert (big.vocab_size - big.bos_token_id, big.vocab_size - big.eos_token_id) == from_end


@pytest.mark.parametrize("name, field, value", [
    ("tiny-youtu", "bos_token_id", 128000), ("tiny-axk1", "eos_token_id", 163691),
    ("tiny-minicpm3", "eos_token_id", [2, 73440]), ("tiny-longcat", "bos_token_id", -1), ("tiny", "eos_token_id", 1000),
    ("tiny-glm5", "pad_token_id", -1), ("tiny-mistral4", "pad_token_id", -1000)])
def test_a_token_id_outside_the_vocabulary_is_read_and_written_back_as_transformers_takes_it(name, field, value):
    """transformers' configuration classes keep the published model's ids for a tiny vocabulary
    (YoutuConfig's bos 128000) and configs on the Hub write pad_token_id -1: transformers loads them
    with a warning, the model reads none, so stepper reads them too, and writes them back as given."""
    cfg = read({**PRESETS[name], field: value})
    assert getattr(cfg, field) == (tuple(value) if isinstance(value, list) else value)
    assert cfg.to_hf()[field] == value


@pytest.mark.parametrize("name, field, value, shown", [
    ("tiny-glm5", "pad_token_id", 154820, "154820"), ("tiny-youtu", "pad_token_id", 1000, "1000"),
    ("tiny-longcat", "pad_token_id", -1001, "-1001")])
def test_a_pad_token_id_no_embedding_row_has_is_refused_naming_the_field(name, field, value, shown):
    """transformers' embedding takes pad_token_id as its padding row: torch counts a negative one from the
    end, and refuses one past either end."""
    assert refusal({**PRESETS[name], field: value}) == (
        f"config.json: field '{field}' must be a token id in -1000..999 (vocab_size 1000; transformers' embedding "
        f"takes it as its padding row), got {shown}")


@pytest.mark.parametrize("field, value, shown", [
    ("bos_token_id", "1", "'1'"), ("bos_token_id", True, "True"), ("eos_token_id", [2, 2.5], "[2, 2.5]"),
    ("eos_token_id", [], "[]"), ("pad_token_id", True, "True")])
def test_a_token_id_that_is_no_whole_number_is_refused_naming_the_field(field, value, shown):
    kind = "a token id or a list of them" if field == "eos_token_id" else "a token id"
    assert refusal({**PRESETS["tiny-axk1"], field: value}) == (
        f"config.json: field '{field}' must be {kind} (a whole number), got {shown}")


def test_a_pad_token_id_past_the_vocabulary_is_one_line_from_synth_and_run(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**PRESETS["tiny-axk1"], "pad_token_id": 163691}))
    for command in (("run", "--model", config, "--plain"), ("synth", "--model", config, "--out", tmp_path / "ck")):
        assert refused(stepper(*command)) == (f"{config}: field 'pad_token_id' must be a token id in -1000..999 "
                                              "(vocab_size 1000; transformers' embedding takes it as its padding "
                                              "row), got 163691")
    assert not (tmp_path / "ck").exists()


def test_youtus_zeroed_pad_row_is_its_pad_token_id():
    assert family_preset("tiny-youtu").zeroed_pad_row == family_preset("tiny-youtu").pad_token_id == 999
    assert read({**PRESETS["tiny-youtu"], "pad_token_id": None}).zeroed_pad_row is None


def test_youtus_pad_token_id_of_minus_one_zeroes_the_last_row_as_torchs_embedding_does():
    """nn.Embedding(padding_idx=-1) takes row vocab_size - 1 as its padding row, which Youtu zeroes:
    token 999 embeds to zeros and, the embedding tied as lm_head, has the logit 0."""
    cfg = read({**PRESETS["tiny-youtu"], "pad_token_id": -1})
    assert cfg.zeroed_pad_row == 999 and cfg.pad_token_id == -1 and cfg.to_hf()["pad_token_id"] == -1
    rows = YoutuModel(SyntheticWeights(cfg, 0)).embed(np.array([[998, 999]]))
    assert rows[0, 0].any() and not rows[0, 1].any()
