"""GLM-4.7-Flash (`glm4_moe_lite`, zai-org/GLM-4.7-Flash): DeepSeek-V3's layer with its own sizes.

transformers (models/glm4_moe_lite/modular_glm4_moe_lite.py) takes DeepseekV3Attention and GLM-4.5's
sigmoid router with a bias and groups; what it reads differently from DeepSeek-V3's config:
- the rotary width is `head_dim` (an alias of qk_rope_head_dim) x `partial_rotary_factor`, which
  must therefore be 1 for the attention's shapes to hold;
- v_head_dim (256) is not qk_nope_head_dim (192): the value heads are wider than the key's nope part;
- which layers are dense is `mlp_layer_types`, one "dense" or "sparse" per layer; without it the
  first layer only is dense, whatever `first_k_dense_replace` says (GLM's own config gives 1).
The published checkpoint stores DeepSeek-V3's tensor names, one tensor per expert, BF16, plus its
multi-token-prediction layer (model.layers.47, which no run reads).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from stepper.config import Config
from stepper.families import mla_fields
from stepper.untrusted import said

MODEL_TYPE = "glm4_moe_lite"
ROUTER = (("sigmoid",), ("noaux_tc",))  # Glm4MoeTopkRouter
DEFAULTS: dict[str, Any] = {  # Glm4MoeLiteConfig's
    "vocab_size": 154880, "hidden_size": 2048, "intermediate_size": 10240, "moe_intermediate_size": 1536,
    "num_hidden_layers": 47, "num_attention_heads": 20, "num_key_value_heads": 20, "n_shared_experts": 1,
    "n_routed_experts": 64, "routed_scaling_factor": 1.8, "kv_lora_rank": 512, "q_lora_rank": 768,
    "qk_rope_head_dim": 64, "v_head_dim": 256, "qk_nope_head_dim": 192, "n_group": 1, "topk_group": 1,
    "num_experts_per_tok": 4, "norm_topk_prob": True, "max_position_embeddings": 202752, "rms_norm_eps": 1e-5,
}


def to_mla(f) -> tuple[dict[str, Any], dict[str, Any]]:
    """GLM-4.7-Flash's config.json in DeepseekV3's names: its dense layers as first_k_dense_replace."""
    raw = mla_fields.with_defaults(dict(f.raw), DEFAULTS)
    mla_fields.check_interleaved(f, raw)
    mla_fields.check_rotary_fraction(f, raw, 1.0)
    raw.pop("partial_rotary_factor", None)
    if raw.get("mlp_layer_types") is not None:
        first, freq = mla_fields.dense_prefix(f, raw)
    else:  # transformers: the first layer dense, the others MoE
        first, freq = 1, 1
    for field, value in (("first_k_dense_replace", first), ("moe_layer_freq", freq)):
        if raw.get(field) not in (None, value):
            raise f.fail(field, f"({said(raw[field])}) must agree with the dense layers transformers builds "
                         f"(mlp_layer_types, else the first layer only: {field} {value}); give mlp_layer_types")
    raw.pop("mlp_layer_types", None)
    return {**raw, "first_k_dense_replace": first, "moe_layer_freq": freq}, {}


def published(cfg) -> dict[str, Any]:
    """The config.json of a GLM-4.7-Flash checkpoint: first_k_dense_replace and mlp_layer_types."""
    out = mla_fields.published_fields(cfg, MODEL_TYPE, "Glm4MoeLiteForCausalLM", drop=("moe_layer_freq",))
    types = ["sparse" if cfg.is_moe_layer(i) else "dense" for i in range(cfg.num_hidden_layers)]
    return {**out, "partial_rotary_factor": 1.0, "topk_method": "noaux_tc", "mlp_layer_types": types}


@dataclasses.dataclass(frozen=True)
class Glm4MoeLiteConfig(Config):
    """MLA's config (the fields GLM-4.7-Flash sets among them), written back as GLM-4.7-Flash's config.json."""

    def to_hf(self) -> dict[str, Any]:
        return published(self)


read_config = mla_fields.reader(MODEL_TYPE, ROUTER, to_mla, Glm4MoeLiteConfig)


FAMILY = mla_fields.family("glm4_moe_lite", (MODEL_TYPE,), read_config)
