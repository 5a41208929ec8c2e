"""LongCat-Flash (`longcat_flash`, meituan-longcat/LongCat-Flash-Chat): DeepSeek-V3's MLA and
SwiGLU in a layer of another shape (transformers' models/longcat_flash):
- each of `num_layers` layers holds two attention sublayers and two dense-MLP sublayers, and a
  MoE that reads the first sublayer's post-attention norm and is added at the layer's end
  (stepper.model.longcat);
- the router is a softmax over `n_routed_experts` + `zero_expert_num` experts, chosen by score
  plus bias, weights the chosen scores times routed_scaling_factor (no renormalisation); a zero
  expert returns its input (identity);
- MLA's query times sqrt(hidden / q_lora_rank), its normalised kv latent times
  sqrt(hidden / kv_lora_rank) (model.lora_scale).
Field names: num_layers, ffn_hidden_size, expert_ffn_hidden_size, moe_topk, zero_expert_num.
A field stepper does not honour is refused by name.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from stepper.config import TOKEN_ID_FIELDS, Config, Fields, _parse, model_name
from stepper.families import deepseek
from stepper.families.family import Family
from stepper.model.longcat import longcat_layer
from stepper.untrusted import said

MODEL_TYPE = "longcat_flash"
ARCHITECTURE = "LongcatFlashForCausalLM"
RENAMED = {"num_layers": "num_hidden_layers", "ffn_hidden_size": "intermediate_size",
           "expert_ffn_hidden_size": "moe_intermediate_size", "moe_topk": "num_experts_per_tok"}
SPELLED = {new: old for old, new in RENAMED.items()}  # a refusal names the field as LongCat's config.json does
SHARED = ("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "q_lora_rank", "kv_lora_rank",
          "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts", "routed_scaling_factor",
          "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings", "hidden_act",
          "quantization_config", "tie_word_embeddings", "attention_bias", "_name_or_path", *TOKEN_ID_FIELDS)
# Fields whose other values stepper does not build: the value it honours (transformers' behaviour)
HONOURED = {"zero_expert_type": "identity", "router_bias": False, "mla_scale_q_lora": True, "mla_scale_kv_lora": True,
            "attention_method": "MLA"}
DEFAULTS = {"rope_theta": 10000000.0, "rms_norm_eps": 1e-5}


@dataclasses.dataclass(frozen=True)
class LongcatFlashConfig(Config):
    """MLA's config with LongCat-Flash's fields set; written back as LongCat-Flash's config.json."""

    def to_hf(self) -> dict[str, Any]:
        return to_hf(self)


def from_hf(raw: dict[str, Any], source: str) -> LongcatFlashConfig:
    """Read a LongCat-Flash config.json; each field stepper does not honour refused by name."""
    f = Fields(raw, source)
    for field, honoured in HONOURED.items():
        if raw.get(field, honoured) not in (honoured, None):
            raise f.fail(field, f"must be {honoured!r}: stepper builds LongCat-Flash as transformers does, "
                         f"got {said(raw[field])}")
    if raw.get("qk_head_dim") not in (None, f.int("qk_nope_head_dim") + f.int("qk_rope_head_dim")):
        raise f.fail("qk_head_dim", "must be qk_nope_head_dim + qk_rope_head_dim (or absent)")
    if f.int("head_dim", default=64) != f.int("qk_rope_head_dim"):  # transformers' rotary tables are head_dim wide
        raise f.fail("head_dim", f"must equal qk_rope_head_dim ({raw['qk_rope_head_dim']}): the rotary tables are "
                     f"head_dim wide (64 when absent), got {raw.get('head_dim', 64)}")
    zero = f.int("zero_expert_num", default=0, minimum=0)  # the router's top-k may choose them: _parse bounds it
    shared = {k: raw[k] for k in SHARED if k in raw}
    shared.update({new: f.int(old, default=12) if old == "moe_topk" else f.int(old) for old, new in RENAMED.items()})
    for field, value in DEFAULTS.items():
        shared.setdefault(field, value)
    cfg = _parse({**shared, "model_type": "deepseek_v3", "first_k_dense_replace": 0, "n_shared_experts": 0,
                  "norm_topk_prob": False}, source, spelled=SPELLED, zero_experts=zero)
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    return LongcatFlashConfig(**{**fields, "name": model_name(raw, source), "model_type": MODEL_TYPE,
                                 "scoring_func": "softmax", "mla_lora_scales": True,
                                 "shortcut_moe": True})


def to_hf(cfg: Config) -> dict[str, Any]:
    """The config.json of a LongCat-Flash checkpoint of this config (the published field names)."""
    base = Config.to_hf(dataclasses.replace(cfg, model_type="deepseek_v3", scoring_func="sigmoid"))
    out = {"architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, **{k: base[k] for k in SHARED if k in base}}
    out.update({old: base[new] for old, new in RENAMED.items()}, zero_expert_num=cfg.zero_experts, **HONOURED,
               head_dim=cfg.qk_rope_head_dim)
    return out


def miniature(cfg: LongcatFlashConfig, layer: int) -> LongcatFlashConfig:
    """DeepSeek's miniature with LongCat's layer: its MoE (two experts, one zero expert) beside the sublayers."""
    return dataclasses.replace(deepseek.miniature(cfg, layer), zero_experts=min(cfg.zero_experts, 1))


def no_seeded_cache(cfg: LongcatFlashConfig, layer: int) -> str:
    """Why cache_len cannot fill a layer: a synthetic cache is one attention's."""
    return ("has two attention sublayers, each with a cache of its own, and a synthetic cache is drawn for one; "
            "run the layer on a prompt instead (--prompt-len)")


FAMILY = Family(name="longcat_flash", model_types=(MODEL_TYPE,), read_config=from_hf, decoder_layer=longcat_layer,
                parts=deepseek.part_files(deepseek.PARTS + ("longcat",)), miniature=miniature,
                no_seeded_cache=no_seeded_cache)
