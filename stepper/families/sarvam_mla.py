"""Sarvam (`sarvam_mla`, sarvamai/sarvam-105b): DeepSeek-V3's layer under older config names.

transformers runs it as DeepseekV3ForCausalLM (models/sarvam_mla/configuration_sarvam_mla.py
translates the config): `num_experts` and `num_shared_experts` are n_routed_experts and
n_shared_experts; `q_head_dim` is qk_nope_head_dim + qk_rope_head_dim; `head_dim` is
kv_lora_rank + qk_rope_head_dim (the latent a token caches, written for vLLM), not a size of the
attention, and is not read; a `rope_scaling` of type `deepseek_yarn` is YaRN. The checkpoint stores
DeepSeek-V3's tensor names with one tensor per expert, BF16.

Sarvam-105B's config.json gives no n_group or topk_group. transformers then routes over all the
experts at once (n_group 1, its configuration's default: "the released checkpoints route over all
experts at once"); Sarvam's own modeling code reads the missing fields as num_experts / 8 groups
keeping 2. stepper follows transformers, which its tests compare against; a config.json that gives
the two fields is read as it says.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from stepper.config import Config, rope_kind
from stepper.families import mla_fields
from stepper.untrusted import said

MODEL_TYPE = "sarvam_mla"
ROUTER = (("sigmoid",), ("noaux_tc",))  # DeepseekV3TopkRouter
RENAMED = {"num_experts": "n_routed_experts", "num_shared_experts": "n_shared_experts"}
DEFAULTS: dict[str, Any] = {  # SarvamMLAConfig's
    "vocab_size": 262144, "hidden_size": 4096, "intermediate_size": 16384, "moe_intermediate_size": 2048,
    "num_hidden_layers": 32, "num_attention_heads": 64, "n_shared_experts": 1, "n_routed_experts": 128,
    "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 1, "topk_group": 1, "num_experts_per_tok": 8,
    "first_k_dense_replace": 1, "norm_topk_prob": True, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
}


def to_mla(f) -> tuple[dict[str, Any], dict[str, Any]]:
    """Sarvam's config.json in DeepseekV3's names, and no field of stepper's beyond them."""
    raw = mla_fields.with_defaults(mla_fields.renamed(f, RENAMED), DEFAULTS)
    mla_fields.check_interleaved(f, raw)
    if raw.get("moe_layer_freq") not in (None, 1):  # DeepseekV3Config has no such field
        raise f.fail("moe_layer_freq", "must be 1: transformers runs every layer from first_k_dense_replace on as MoE, "
                     f"got {said(raw['moe_layer_freq'])}")
    raw.pop("head_dim", None)  # kv_lora_rank + qk_rope_head_dim for vLLM: not the attention's
    q_head_dim = raw.pop("q_head_dim", None)
    fields = mla_fields.typed(f, raw)
    head = fields.int("qk_nope_head_dim") + fields.int("qk_rope_head_dim")
    if q_head_dim is not None and q_head_dim != head:
        raise f.fail("q_head_dim", f"must be qk_nope_head_dim + qk_rope_head_dim ({head}), got {said(q_head_dim)}")
    rope = raw.get("rope_scaling")
    if isinstance(rope, dict) and rope_kind(f, rope, "rope_scaling") == "deepseek_yarn":
        raw["rope_scaling"] = {**{k: v for k, v in rope.items() if k not in ("type", "rope_type")}, "type": "yarn"}
    return raw, {}


def published(cfg) -> dict[str, Any]:
    """The config.json of a Sarvam checkpoint: the older names, `head_dim` as Sarvam writes it."""
    out = mla_fields.published_fields(cfg, MODEL_TYPE, "SarvamMLAForCausalLM")
    for old, new in RENAMED.items():
        out[old] = out.pop(new)
    out["q_head_dim"] = cfg.qk_head_dim
    out["head_dim"] = cfg.kv_lora_rank + cfg.qk_rope_head_dim
    if cfg.rope_scaling is not None:
        out["rope_scaling"]["type"] = "deepseek_yarn"
    return out


@dataclasses.dataclass(frozen=True)
class SarvamConfig(Config):
    """MLA's config (the fields Sarvam sets among them), written back as Sarvam's config.json."""

    def to_hf(self) -> dict[str, Any]:
        return published(self)


read_config = mla_fields.reader(MODEL_TYPE, ROUTER, to_mla, SarvamConfig, RENAMED)


FAMILY = mla_fields.family("sarvam_mla", (MODEL_TYPE,), read_config)
