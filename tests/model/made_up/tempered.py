"""A made-up family, `tempered_moe`, added from the test tree alone: DeepSeek-V3's layer with its
own router, a softmax over the experts at a temperature its config.json gives
(`router_temperature`), emitting one tensor no shipped family emits, `mlp.gate.tempered_scores`,
explained by its own catalogue part file beside this module. Nothing outside this folder and
its test knows of it: the test registers it (`stepper.families.registered`)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np

from stepper.config import Config, read_mla_config
from stepper.errors import StepperError
from stepper.families import deepseek
from stepper.families.family import Family
from stepper.kernels.linear import linear
from stepper.model.attention import mla_attention
from stepper.model.cache import LayerCache
from stepper.model.layer_weights import LayerWeights
from stepper.model.mlp import dense_mlp
from stepper.model.moe import grouped_experts
from stepper.model.ops import rms_norm, softmax
from stepper.model.options import LayerOptions
from stepper.model.router import Routing, top_k
from stepper.seams.trace import Emitter

MODEL_TYPE = "tempered_moe"
PART = Path(__file__).with_name("tempered_router.json")


@dataclasses.dataclass(frozen=True)
class TemperedConfig(Config):
    """MLA's fields (its weights keep HF's names: no `layer_shapes` method), and the temperature."""

    router_temperature: float = 1.0  # the router's softmax runs on logits / router_temperature

    def to_hf(self) -> dict[str, Any]:
        """Its config.json (a checkpoint's): V2's fields, router_temperature, its model_type."""
        return {**Config.to_hf(dataclasses.replace(self, model_type="deepseek_v2")), "model_type": MODEL_TYPE}


def read_config(raw: dict[str, Any], source: str) -> TemperedConfig:
    """The MLA reader for every field it knows, then the family's own."""
    temperature = raw.get("router_temperature", 1.0)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not math.isfinite(temperature) \
            or temperature <= 0:
        raise StepperError(f"{source}: field 'router_temperature' must be a finite number > 0, got {temperature!r}")
    base = read_mla_config({**raw, "model_type": "deepseek_v2", "topk_method": "greedy"}, source)  # V2's fields
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    return TemperedConfig(**{**fields, "model_type": MODEL_TYPE}, router_temperature=float(temperature))


def tempered_route(tokens: np.ndarray, gate: np.ndarray, cfg: TemperedConfig, emit: Emitter) -> Routing:
    """softmax(logits / temperature), the k best, their scores renormalised.  tokens [N, d] -> Routing"""
    logits = emit("mlp.gate.logits", linear(tokens, gate))  # [N, E]
    scores = emit("mlp.gate.tempered_scores", softmax(logits / np.float32(cfg.router_temperature)))  # [N, E]
    topk_idx = emit("mlp.gate.topk_idx", top_k(scores, cfg.num_experts_per_tok))  # [N, k]
    chosen = np.take_along_axis(scores, topk_idx, axis=1)  # [N, k]
    return Routing(topk_idx, emit("mlp.gate.topk_weight", chosen / chosen.sum(axis=1, keepdims=True)))


def tempered_moe(x: np.ndarray, w: LayerWeights, emit: Emitter) -> np.ndarray:
    """The routed experts under the tempered router.  [B, T, d] -> [B, T, d]"""
    B, T, d = x.shape
    tokens = x.reshape(B * T, d)  # [N, d]
    routing = tempered_route(tokens, w("mlp.gate.weight"), w.cfg, emit)
    return emit("mlp.routed_output", grouped_experts(tokens, routing, w, emit).reshape(B, T, d))  # [B, T, d]


def tempered_layer(hidden: np.ndarray, w: LayerWeights, cache: LayerCache | None, options: LayerOptions,
                   emit: Emitter) -> np.ndarray:
    """Pre-norm MLA attention, then the tempered MoE (or the dense MLP), each added to the stream."""
    cfg = w.cfg
    hidden = emit("hidden_states", hidden)  # [B, T, d]
    x = emit("input_layernorm", rms_norm(hidden, w("input_layernorm.weight"), cfg.rms_norm_eps))
    cache = LayerCache() if cache is None else cache
    hidden = emit("attn_residual", hidden + mla_attention(x, w, cache, options, emit))
    x = emit("post_attention_layernorm", rms_norm(hidden, w("post_attention_layernorm.weight"), cfg.rms_norm_eps))
    ffn = tempered_moe(x, w, emit) if cfg.is_moe_layer(w.layer) else dense_mlp(x, w, emit)
    ffn = emit("mlp_output", ffn)
    return emit("output", hidden + ffn)


FAMILY = Family(
    name="tempered",
    model_types=(MODEL_TYPE,),
    read_config=read_config,
    decoder_layer=tempered_layer,
    parts=deepseek.FAMILY.parts + (PART,),
    miniature=deepseek.miniature,
)
