"""Mistral Small 4 (`mistral4`, mistralai/Mistral-Small-4-119B-2603): DeepSeek-V3's attention and
MoE with a softmax router and Llama 4's query scale.

transformers (models/mistral4/modular_mistral4.py) changes from DeepSeek-V3:
- the router (Mistral4TopkRouter) scores the experts with a softmax and has no bias; groups are
  judged by their two best scores, a dropped group's scores set to 0.0 before the top-k (the
  softmax's scores are positive, so no dropped expert is ever chosen: stepper drops them with
  -inf, the same choice); the chosen scores are renormalised (norm_topk_prob);
- YaRN's mscale_all_dim enters the softmax scale squared (as DeepSeek-V3's), and the cos/sin
  factor mscale / mscale_all_dim is 1 for the published values (both 1);
- each query is scaled by 1 + beta * ln(1 + floor(p / original_max_position_embeddings)) at its
  position p (`llama_4_scaling_beta` in rope_parameters: stepper/model/query_scale.py);
- the rotary part is head_dim x partial_rotary_factor with head_dim the whole query head
  (qk_nope + qk_rope), which must therefore come to qk_rope_head_dim;
- the first `first_k_dense_replace` layers (0 published) are dense, every later one MoE;
- the checkpoint stores each layer's experts fused (`mlp.experts.gate_up_proj`, `down_proj`:
  stepper/weights/fused_experts.py), as transformers saves Mistral4ForCausalLM (it has no
  conversion for per-expert names);
- published in FP8 with one scale per tensor (quantization_config: quant_method fp8,
  weight_block_size null, activation_scheme static): each linear `X.weight` e4m3 with a scalar
  `X.weight_scale_inv` (value = code x scale_inv) and an `X.activation_scale`; each fused
  experts' tensor with one scale per expert, `gate_up_proj_scale_inv` [E, 1, 1] (the gate and up
  halves brought to one scale) and `down_proj_scale_inv` [E, 1, 1]
  (models/mistral4/convert_mistral4_weight_to_hf.py). stepper applies the weight scales; the
  activation scales (vLLM's static FP8 inputs) are read by no run, as transformers' dequantize=True.
The published config.json is a vision-language wrapper (`mistral3`, Mistral3ForConditionalGeneration)
around this text model, its tensors under `language_model.` (`unwrapped`); stepper runs the text
model.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from stepper.config import Config, Fields, QueryScale, Wrapper, model_name
from stepper.families import mla_fields
from stepper.untrusted import said

MODEL_TYPE = "mistral4"
ROUTER = (("softmax",), ("noaux_tc",))  # softmax scores, groups judged by their best two, no bias
ROPE = {"type": "yarn", "rope_theta": 10000.0, "factor": 128.0, "original_max_position_embeddings": 8192,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1}
DEFAULTS: dict[str, Any] = {  # Mistral4Config's
    "vocab_size": 131072, "hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 2048,
    "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 32, "n_shared_experts": 1,
    "n_routed_experts": 128, "routed_scaling_factor": 1.0, "kv_lora_rank": 256, "q_lora_rank": 1024,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 64, "n_group": 1, "topk_group": 1,
    "num_experts_per_tok": 4, "first_k_dense_replace": 0, "norm_topk_prob": True, "max_position_embeddings": 1048576,
    "rms_norm_eps": 1e-6, "rope_parameters": ROPE,
}


def to_mla(f) -> tuple[dict[str, Any], dict[str, Any]]:
    """Mistral 4's config.json in DeepseekV3's names, with its query scale and bias-free router."""
    raw = mla_fields.with_defaults(dict(f.raw), DEFAULTS)
    mla_fields.check_interleaved(f, raw)
    fields = mla_fields.typed(f, raw)
    rope = fields.int("qk_rope_head_dim")
    mla_fields.check_rotary_fraction(f, raw, rope / (fields.int("qk_nope_head_dim") + rope))
    if raw.get("moe_layer_freq", 1) != 1:
        raise f.fail("moe_layer_freq", f"must be 1: every Mistral 4 layer from first_k_dense_replace on is MoE, "
                     f"got {said(raw['moe_layer_freq'])}")
    scaling = mla_fields.rope_fields(f, raw)
    beta = scaling.float("llama_4_scaling_beta", positive=False)  # transformers reads both, whatever the rope type
    original = scaling.int("original_max_position_embeddings")
    quant = raw.get("quantization_config")
    if isinstance(quant, dict) and quant.get("quant_method", "fp8") == "fp8" and \
            quant.get("weight_block_size", [128, 128]) is not None:
        raise f.fail("quantization_config.weight_block_size", "must be null (one scale per tensor, as Mistral Small 4 "
                     f"is published): stepper reads its fused experts in FP8 with one scale per expert, got "
                     f"{said(quant.get('weight_block_size', [128, 128]))}")
    scale = QueryScale(beta, original) if beta else None
    return raw, {"router_bias": False, "query_scale": scale, "fused_experts": True}


WRAPPER = "mistral3"  # Mistral Small 4 as published: Mistral3ForConditionalGeneration around this text model
WRAPPER_READ = ("model_type", "text_config", "tie_word_embeddings", "quantization_config", "_name_or_path")
WRAPPER_BOOKKEEPING = ("architectures", "transformers_version", "dtype", "torch_dtype")


def unwrapped(f) -> tuple[dict[str, Any], Wrapper]:
    """The text model's config.json out of the vision-language wrapper (`mistral3`), and the
    wrapper: the text model's tensors under language_model., the vision tower's and projector's
    beside them (never read)."""
    text = f.raw.get("text_config")
    if not isinstance(text, dict) or text.get("model_type") != MODEL_TYPE:
        found = text.get("model_type") if isinstance(text, dict) else text
        raise f.fail("text_config.model_type", f"must be '{MODEL_TYPE}' (the MLA text model stepper runs), "
                     f"got {said(found)}")
    if f.raw.get("tie_word_embeddings"):
        raise f.fail("tie_word_embeddings", "must be false: stepper reads language_model.lm_head.weight as its own "
                     "matrix")
    if f.raw.get("quantization_config") is not None:
        text = {**text, "quantization_config": f.raw["quantization_config"]}  # refused by the text model's reader
    unused = tuple(k for k in f.raw if k not in WRAPPER_READ + WRAPPER_BOOKKEEPING)
    return text, Wrapper(WRAPPER, unused_prefixes=("vision_tower.", "multi_modal_projector."), unused_fields=unused)


def published(cfg) -> dict[str, Any]:
    """The config.json of a Mistral 4 checkpoint: the query scale and rotary fraction in rope_parameters."""
    out = mla_fields.published_fields(cfg, MODEL_TYPE, "Mistral4ForCausalLM", drop=("moe_layer_freq",))
    rope = out.pop("rope_scaling", None) or {"type": "default"}  # YaRN's original length is the scale's too
    original = rope.get("original_max_position_embeddings", cfg.max_position_embeddings)
    scale = cfg.query_scale or QueryScale(0.0, original)
    out["rope_parameters"] = {**rope, "rope_theta": out.pop("rope_theta"), "llama_4_scaling_beta": scale.beta,
                              "original_max_position_embeddings": scale.original_max_position_embeddings,
                              "partial_rotary_factor": cfg.qk_rope_head_dim / cfg.qk_head_dim}
    return out


@dataclasses.dataclass(frozen=True)
class Mistral4Config(Config):
    """MLA's config (the fields Mistral 4 sets among them), written back as Mistral 4's config.json."""

    def to_hf(self) -> dict[str, Any]:
        return published(self)


read_text_config = mla_fields.reader(MODEL_TYPE, ROUTER, to_mla, Mistral4Config)


def read_config(raw: dict[str, Any], source: str) -> Config:
    """Mistral 4's text config.json, or the published vision-language wrapper around it."""
    if raw.get("model_type") != WRAPPER:
        return read_text_config(raw, source)
    text, wrapper = unwrapped(Fields(raw, source))
    cfg = read_text_config(text, f"{source}: text_config")
    return dataclasses.replace(cfg, name=model_name(raw, source), wrapper=wrapper)


FAMILY = mla_fields.family("mistral4", (MODEL_TYPE, WRAPPER), read_config, ("query_scale",))
