"""Hy4 (`hy_v4`, tencent/Hy4-preview): DeepSeek-V3.2's layer on DeepSeek-V4's residual streams
(transformers' models/hy_v4), with these differences from the families it is made of:
- the residual is `hc_mult` streams, mixed into each block and written back by "independent"
  hyper-connections: pre and post weights only, post = hc_magnitude sigmoid(...) + hc_eps, no
  comb (model.hyper_connections); the model's head collapses them (hc_head) before the final norm;
- attention is MLA with RoPE on two halves of the rotary dims, an output gate from a projection
  of its own (sigmoid(gate_proj(x)) times each head's output) and a sink logit per head in the
  softmax (gpt-oss's);
- the Lightning Indexer turns the LAST qk_rope_head_dim dims of its heads (two halves) and its
  k_norm takes rms_norm_eps; a layer marked "shared" in `indexer_types` attends where the last
  "full" one chose (GLM-5's);
- the routed experts clamp their gate (above) and up (both sides) projections at swiglu_limit
  before SwiGLU (DeepSeek-V4's); the router is DeepSeek-V3's (sigmoid, a bias, one group);
- which layers are dense is `mlp_layer_types` (the first only by default), and the experts are
  stored fused (`mlp.experts.gate_up_proj`, `down_proj`), as transformers saves them.
A field stepper does not honour is refused by name.
"""

from __future__ import annotations

import dataclasses
from importlib import resources
from typing import Any

import numpy as np

from stepper.config import Config, rope_settings
from stepper.families import deepseek, glm_moe_dsa, mla_fields
from stepper.families.deepseek_v4 import lone_streams
from stepper.families.deepseek_v4_weights import global_shapes as v4_global_shapes
from stepper.families.deepseek_v4_weights import hc_shapes, head_weights
from stepper.families.family import Family, around, renamed
from stepper.model.cache import LayerCache
from stepper.model.hyper_connections import HcDims
from stepper.model.layer import mla_step
from stepper.model.layer_weights import LayerWeights
from stepper.model.mlp import dense_mlp
from stepper.model.moe import moe
from stepper.model.options import LayerOptions
from stepper.model.transformer import Transformer
from stepper.model.v4_layer import V4LayerDims, v4_decoder_layer, v4_final, v4_streams
from stepper.seams.trace import Emitter
from stepper.weights.names import layer_prefix, mla_layer_shapes

MODEL_TYPE = "hy_v4"
ARCHITECTURE = "HYV4ForCausalLM"
ROUTER = (("sigmoid",), ("noaux_tc",))  # Glm4MoeLiteTopkRouter: sigmoid scores, a bias, one group
DEFAULTS: dict[str, Any] = {  # HYV4Config's
    "vocab_size": 120832, "hidden_size": 2816, "intermediate_size": 6912, "moe_intermediate_size": 768,
    "num_hidden_layers": 34, "num_attention_heads": 32, "max_position_embeddings": 262144, "rms_norm_eps": 1e-5,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "routed_scaling_factor": 2.827,
    "norm_topk_prob": True, "n_group": 1, "topk_group": 1, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "v_head_dim": 256, "index_topk": 2048, "index_head_dim": 128,
    "index_n_heads": 16,
}
HC_DEFAULTS = {"hc_mult": 4, "hc_magnitude": 2.0, "hc_eps": 1e-6, "swiglu_limit": 10.0}
# HYV4Config's own fields, read here and not by the MLA reader (which must not see them); `head_dim` and
# `num_key_value_heads` transformers sets itself (to qk_rope_head_dim and num_attention_heads)
OWN = ("layer_types", "mlp_layer_types", "indexer_types", "learnable_sink_init", "head_dim", "num_key_value_heads",
       *HC_DEFAULTS)
ATTENTION = "indexed_attention"  # the one kind of layer in layer_types
# transformers' renames of Hy4's files to its modules (conversion_mapping.py), in its order; the files
# transformers saves name them back another way (`hc_pre.hc_attn_layer.hc_fn`, `mlp.linear_gate`), which
# the same renames read too
RENAMES = ((r"\.hc_pre\.hc_", ".hc_"), (r"\.learnable_sink_param$", ".sinks"), (r"\.linear_gate\.", ".gate_proj."),
           (r"\.hc_attn_layer\.hc_(fn|base|scale)$", r".attn_hc.\1"),
           (r"\.hc_mlp_layer\.hc_(fn|base|scale)$", r".ffn_hc.\1"), (r"\.hc_head_(fn|base|scale)$", r".hc_\1"))


@dataclasses.dataclass(frozen=True)
class HyV4Config(Config):
    """MLA's config with Hy4's fields set, and its residual streams; written back as Hy4's config.json."""

    hc_mult: int = 4  # n residual streams
    hc_magnitude: float = 2.0  # post's sigmoid times this
    hc_eps: float = 1e-6  # added to pre and to post

    def to_hf(self) -> dict[str, Any]:
        return published(self)

    @staticmethod
    def read_name(stored: str) -> str:
        """A tensor's name in Hy4's files (`self_attn.learnable_sink_param`, `hc_attn_layer.hc_pre.hc_fn`)
        -> its transformers module's (`self_attn.sinks`, `attn_hc.fn`), as transformers renames it."""
        return renamed(stored, RENAMES)

    def layer_shapes(self, layer: int) -> dict[str, tuple[int, ...]]:
        """A layer's tensors: MLA's (fused experts listed per expert), the output gate's projection,
        the sinks, and the two hyper-connections' weights (2n mixes, 2 scales)."""
        n, d, heads = self.hc_mult, self.hidden_size, self.num_attention_heads
        own = {"self_attn.gate_proj.weight": (heads * self.v_head_dim, d), "self_attn.sinks": (heads,),
               **hc_shapes(n, d, 2 * n, 2)}
        return {**mla_layer_shapes(self, layer), **{layer_prefix(layer) + k: v for k, v in own.items()}}

    def global_shapes(self) -> dict[str, tuple[int, ...]]:
        """Hy4's tensors outside the layers, DeepSeek-V4's: the embedding, the head's collapse of the
        streams, the final norm, lm_head."""
        return v4_global_shapes(self)


def to_mla(f) -> tuple[dict[str, Any], dict[str, Any]]:
    """Hy4's config.json in DeepseekV3's names, and the fields of its own."""
    raw = mla_fields.with_defaults(dict(f.raw), DEFAULTS)
    own = {field: raw.pop(field) for field in OWN if field in raw}
    mla_fields.check_rotary_fraction(f, raw, 1.0)
    if raw.get("q_lora_rank") is None:
        raise f.fail("q_lora_rank", "is missing: Hy4's indexer reads its query from q_a_norm")
    mla_fields.refuse_present(f, raw, ("quantization_config",), "stepper reads Hy4 in BF16 or float32 (not "
                              "Hy4-preview-FP8's E4M3 with an E8M0 scale per 32 columns)")
    fields = mla_fields.typed(f, raw)
    layers = fields.int("num_hidden_layers")
    mla_fields.check_one_kind(f, own.get("layer_types"), layers, ATTENTION, "Hy4")
    first, freq = (1, 1) if own.get("mlp_layer_types") is None else mla_fields.dense_prefix(f, {**raw, **own})
    types = indexer_types(f, own.get("indexer_types"), layers)
    streams = mla_fields.typed(f, {**HC_DEFAULTS, **own})
    limit = streams.float("swiglu_limit")  # positive: transformers' docstring disables the clamp at <= 0, its code not
    extra = {"hc_mult": streams.int("hc_mult"), "hc_magnitude": streams.float("hc_magnitude", positive=False),
             "hc_eps": streams.float("hc_eps", positive=False), "swiglu_limit": limit,
             "index_reused_layers": tuple(i for i, kind in enumerate(types) if kind == "shared"),
             "rope_scaling": mla_fields.transformers_yarn(f, rope_settings(mla_fields.typed(f, raw))[1]),
             "rope_interleave": False, "gate_proj": True, "attention_sinks": True, "indexer_rope_last": True,
             "indexer_norm_eps": fields.float("rms_norm_eps"), "fused_experts": True,
             **{field: fields.int(field) for field in ("index_n_heads", "index_head_dim", "index_topk")}}
    return {**raw, "first_k_dense_replace": first, "moe_layer_freq": freq}, extra


def indexer_types(f, given: Any, layers: int) -> list[str]:
    """Per layer "full" (its own indexer) or "shared" (the last full layer's choice): as given, or
    transformers' default, layer 0 and every fourth from layer 1 full."""
    if given is None:
        return ["full" if i == 0 or (i - 1) % 4 == 0 else "shared" for i in range(layers)]
    return glm_moe_dsa.indexer_types(mla_fields.typed(f, {"indexer_types": given}), layers)


def published(cfg: HyV4Config) -> dict[str, Any]:
    """The config.json of a Hy4 checkpoint of this config (transformers' HYV4Config fields)."""
    out = mla_fields.published_fields(cfg, MODEL_TYPE, ARCHITECTURE, drop=("moe_layer_freq", "first_k_dense_replace"))
    yarn = {k: v for k, v in out.pop("rope_scaling", {}).items() if k != "type"}  # Config.to_hf's YaRN block
    out["rope_parameters"] = {"rope_type": "yarn" if yarn else "default", "rope_theta": out.pop("rope_theta"), **yarn}
    layers = range(cfg.num_hidden_layers)
    return {**out, "mlp_layer_types": ["sparse" if cfg.is_moe_layer(i) else "dense" for i in layers],
            "indexer_types": ["shared" if cfg.index_reused(i) else "full" for i in layers],
            "layer_types": [ATTENTION] * cfg.num_hidden_layers, "hc_mult": cfg.hc_mult,
            "hc_magnitude": cfg.hc_magnitude, "hc_eps": cfg.hc_eps, "swiglu_limit": cfg.swiglu_limit}


read_config = mla_fields.reader(MODEL_TYPE, ROUTER, to_mla, HyV4Config)


def layer_dims(cfg: HyV4Config) -> V4LayerDims:
    """What the streams' layer needs of the config: independent hyper-connections, the norms' eps."""
    hc = HcDims(cfg.hc_mult, 0, cfg.hc_eps, cfg.rms_norm_eps, comb=False, magnitude=cfg.hc_magnitude,
                post_eps=cfg.hc_eps)
    return V4LayerDims(hc, None, cfg.rms_norm_eps, ("attn_hc", "ffn_hc"))


def hy_v4_layer(streams: np.ndarray, w: LayerWeights, cache: LayerCache | None, options: LayerOptions,
                emit: Emitter) -> np.ndarray:
    """streams [B, T, n, d] -> [B, T, n, d]: MLA (its indexer, gate and sinks) and the MoE or dense
    MLP, each between a hyper-connection's collapse of the streams and its write back."""
    cfg = w.cfg
    cache = LayerCache() if cache is None else cache

    def ffn(x: np.ndarray) -> np.ndarray:  # [B, T, d] -> [B, T, d]
        return moe(x, w, options, emit) if cfg.is_moe_layer(w.layer) else dense_mlp(x, w, emit)

    return v4_decoder_layer(streams, w, layer_dims(cfg), mla_step(w, cache, options, emit), ffn, emit)


class HyV4Model(Transformer):
    """MLA's model on Hy4's streams: the embedding copied into each, collapsed by the head's
    hyper-connection before the final norm."""

    def embedded(self, ids: np.ndarray, emit: Emitter) -> np.ndarray:
        """ids [B, T] -> the embedding in each of the n streams [B, T, n, d]"""
        return v4_streams(super().embedded(ids, emit), self.config.hc_mult, emit)

    def final_norm(self, streams: np.ndarray, emit: Emitter) -> np.ndarray:
        """The streams collapsed (hc_head) and normalised.  [B, T, n, d] -> [B, T, d]"""
        return v4_final(streams, head_weights(self.weights.get), layer_dims(self.config), emit)

    def lone_input(self, ids: np.ndarray, seed: int, step: int, first: int = 0) -> np.ndarray:
        """A lone layer's streams [B, T, n, d]: the tokens' embedding in each, or seeded ones."""
        return lone_streams(self, ids, seed, step, first)


def miniature(cfg: HyV4Config, layer: int) -> HyV4Config:
    """DeepSeek's miniature on two streams, its layer 0 "shared" when `layer` is."""
    shared = (0,) if cfg.index_reused(layer) else ()
    return dataclasses.replace(deepseek.miniature(cfg, layer), hc_mult=2, index_reused_layers=shared)


def streams(cfg: HyV4Config) -> tuple[int | None, ...]:
    """What flows between Hy4's layers: the residual streams [B, T, n, d]."""
    return (None, None, cfg.hc_mult, cfg.hidden_size)


def no_seeded_cache(cfg: HyV4Config, layer: int) -> str:
    """Why cache_len cannot fill a layer: its latents are drawn like those of one RMSNorm'd stream."""
    return ("runs on residual streams, and a synthetic cache is drawn from the latents of one RMSNorm'd stream; "
            "run the layer on a prompt instead (--prompt-len)")


PARTS = ("model", "mla_attention", "output_gate", "mlp", "router", "router_sigmoid", "router_noaux_tc", "router_groups",
         "moe", "indexer", "index_reuse", "hy_v4")  # MLA's, without its one residual stream, and Hy4's own


def parts() -> tuple:
    """MLA's parts and Hy4's, and the streams' entries DeepSeek-V4 has too (catalog/v4/hc_streams.json)."""
    return (*deepseek.part_files(PARTS), resources.files("stepper.catalog").joinpath("v4/hc_streams.json"))


FAMILY = Family(name="hy_v4", model_types=(MODEL_TYPE,), read_config=read_config, decoder_layer=hy_v4_layer,
                parts=parts(), miniature=miniature,
                model=around(HyV4Model, hy_v4_layer), stream=streams, no_seeded_cache=no_seeded_cache)
