"""A.X-K1 (`axk1`, skt/A.X-K1): DeepSeek-V3's layer with an RMSNorm on the MoE's output and a router
without a learned bias.

transformers (models/axk1/modular_axk1.py) inherits DeepSeek-V3 and changes: AXK1MoE ends in
`post_mlp_layernorm` (stepper/model/moe_output_norm.py), stored in the checkpoint at the decoder
layer (`model.layers.N.post_mlp_layernorm.weight`; the published checkpoints store it in the dense
layers too, unused there, transformers' save_pretrained only in the MoE layers); the router has no
`e_score_correction_bias` in the published checkpoint (transformers keeps one of zeros and saves
it), so it chooses by the sigmoid scores themselves within DeepSeek-V3's groups; the query always
has its bottleneck (q_lora_rank); which layers are dense is `mlp_layer_types`, else DeepSeek's
first_k_dense_replace / moe_layer_freq. AXK1Config says which tensors a checkpoint may hold that no
run reads (weights.names: unread_layer_shapes, zero_layer_shapes), so both layouts are read.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from stepper.config import Config
from stepper.families import mla_fields
from stepper.untrusted import said
from stepper.weights.names import layer_prefix

MODEL_TYPE = "axk1"
ROUTER = (("sigmoid",), ("noaux_tc",))  # DeepseekV3TopkRouter, its bias zero
DEFAULTS: dict[str, Any] = {  # AXK1Config's
    "vocab_size": 163840, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_hidden_layers": 61, "num_attention_heads": 64, "num_key_value_heads": 64, "n_shared_experts": 1,
    "n_routed_experts": 192, "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4,
    "num_experts_per_tok": 8, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "norm_topk_prob": True,
    "first_k_dense_replace": 1, "moe_layer_freq": 1,
}


def to_mla(f) -> tuple[dict[str, Any], dict[str, Any]]:
    """A.X-K1's config.json in DeepseekV3's names, with its norm on the MoE output and no router bias."""
    raw = mla_fields.with_defaults(dict(f.raw), DEFAULTS)
    mla_fields.check_interleaved(f, raw)
    if raw.get("q_lora_rank") is None:
        raise f.fail("q_lora_rank", "must be set: A.X-K1's attention always has its query bottleneck (q_a_proj)")
    if raw.get("mlp_layer_types") is not None:
        first, freq = mla_fields.dense_prefix(f, raw)
        for field, value in (("first_k_dense_replace", first), ("moe_layer_freq", freq)):
            if field in f.raw and f.raw[field] not in (None, value):
                raise f.fail(field, f"({said(f.raw[field])}) disagrees with mlp_layer_types ({field} {value})")
        raw.update(first_k_dense_replace=first, moe_layer_freq=freq)
    raw.pop("mlp_layer_types", None)
    return raw, {"router_bias": False, "moe_output_norm": True}


def published(cfg) -> dict[str, Any]:
    """The config.json of an A.X-K1 checkpoint: DeepSeek-V3's fields under A.X-K1's model_type."""
    return mla_fields.published_fields(cfg, MODEL_TYPE, "AXK1ForCausalLM")


@dataclasses.dataclass(frozen=True)
class AXK1Config(Config):
    """MLA's config (the fields A.X-K1 sets among them), written back as A.X-K1's config.json."""

    def to_hf(self) -> dict[str, Any]:
        return published(self)

    def unread_layer_shapes(self, layer: int) -> dict[str, tuple[int, ...]]:
        """A dense layer's post_mlp_layernorm, which the published checkpoints store in every layer
        and no run reads (transformers' save_pretrained writes it only where its MoE has the norm)."""
        if self.is_moe_layer(layer):
            return {}
        return {layer_prefix(layer) + "post_mlp_layernorm.weight": (self.hidden_size,)}

    def zero_layer_shapes(self, layer: int) -> dict[str, tuple[int, ...]]:
        """A MoE layer's router bias: the published checkpoints have none, transformers' router keeps
        one of zeros and save_pretrained writes it."""
        if not self.is_moe_layer(layer):
            return {}
        return {layer_prefix(layer) + "mlp.gate.e_score_correction_bias": (self.n_routed_experts,)}


read_config = mla_fields.reader(MODEL_TYPE, ROUTER, to_mla, AXK1Config)


FAMILY = mla_fields.family("axk1", (MODEL_TYPE,), read_config, ("moe_output_norm",))
