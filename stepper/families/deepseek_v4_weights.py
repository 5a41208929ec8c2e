"""DeepSeek-V4's tensors by the names the model reads (transformers' module names,
`model.layers.3.attn_hc.fn`) with their shapes, and the name a published checkpoint stores each
under (`layers.3.hc_attn_fn`, DeepSeek's own, without `model.`). How each is stored there (FP8,
FP4, BF16, F32, I64) is stepper.weights.deepseek_v4_names' and published_store's.
"""

from __future__ import annotations

import re
from typing import Any

from stepper.model import compressed_attention as attention

V4Config = Any  # a deepseek_v4_config.V4Config, which asks this module for its layers' shapes (layer_shapes)
EMBED, HEAD, NORM = "model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"
HC_HEAD = ("model.hc_head.hc_fn", "model.hc_head.hc_base", "model.hc_head.hc_scale")
EXPERT = re.compile(r"mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")


def head_weights(get) -> dict[str, Any]:
    """The head's weights as v4_layer.v4_final takes them (hc_fn, hc_base, hc_scale, the final norm's),
    by `get` of a weight source."""
    return {"hc_fn": get(HC_HEAD[0]), "hc_base": get(HC_HEAD[1]), "hc_scale": get(HC_HEAD[2]), "norm": get(NORM)}


def layer_prefix(layer: int) -> str:
    return f"model.layers.{layer}."


def hc_shapes(n: int, d: int, mixes: int, scales: int) -> dict[str, tuple[int, ...]]:
    """The two hyper-connections' weights of a layer (V4's: (2 + n) n mixes, 3 scales; Hy4's: 2n, 2)."""
    return {f"{site}.{name}": shape for site in ("attn_hc", "ffn_hc")
            for name, shape in (("fn", (mixes, n * d)), ("base", (mixes,)), ("scale", (scales,)))}


def global_shapes(cfg: V4Config) -> dict[str, tuple[int, ...]]:
    n, d = cfg.hc_mult, cfg.hidden_size
    return {EMBED: (cfg.vocab_size, d), HEAD: (cfg.vocab_size, d), NORM: (d,),
            HC_HEAD[0]: (n, n * d), HC_HEAD[1]: (n,), HC_HEAD[2]: (1,)}


def layer_shapes(cfg: V4Config, layer: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of layer `layer`, by its name relative to the layer."""
    n, d = cfg.hc_mult, cfg.hidden_size
    shapes: dict[str, tuple[int, ...]] = {"input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,)}
    shapes.update(hc_shapes(n, d, cfg.hc_mixes, 3))
    shapes.update(attention.weight_shapes(cfg.dims(layer)))  # the attention's own list
    shapes.update(moe_shapes(cfg, layer))
    return shapes


def moe_shapes(cfg: V4Config, layer: int) -> dict[str, tuple[int, ...]]:
    d, inter, e = cfg.hidden_size, cfg.moe_intermediate_size, cfg.n_routed_experts
    shapes: dict[str, tuple[int, ...]] = {"mlp.gate.weight": (e, d)}
    if cfg.is_hash_layer(layer):
        shapes["mlp.gate.tid2eid"] = (cfg.vocab_size, cfg.num_experts_per_tok)
    else:
        shapes["mlp.gate.e_score_correction_bias"] = (e,)
    experts = [f"mlp.experts.{i}." for i in range(e)] + ["mlp.shared_experts."] * (cfg.n_shared_experts > 0)
    for prefix in experts:
        shapes.update({prefix + "gate_proj.weight": (inter, d), prefix + "up_proj.weight": (inter, d),
                       prefix + "down_proj.weight": (d, inter)})
    return shapes


def weight_shapes(cfg: V4Config) -> dict[str, tuple[int, ...]]:
    """Every tensor the model reads, by full name."""
    shapes = global_shapes(cfg)
    for layer in range(cfg.num_hidden_layers):
        shapes.update({layer_prefix(layer) + k: v for k, v in layer_shapes(cfg, layer).items()})
    return shapes


# Published names: transformers' name -> DeepSeek's, in the order they are applied
GLOBAL_NAMES = {EMBED: "embed.weight", HEAD: "head.weight", NORM: "norm.weight",
                HC_HEAD[0]: "hc_head_fn", HC_HEAD[1]: "hc_head_base", HC_HEAD[2]: "hc_head_scale"}
LAYER_RENAMES = (
    ("input_layernorm.", "attn_norm."), ("post_attention_layernorm.", "ffn_norm."),
    ("attn_hc.", "hc_attn_"), ("ffn_hc.", "hc_ffn_"),
    ("self_attn.compressor.indexer.scorer.weights_proj.", "attn.indexer.weights_proj."),
    ("self_attn.compressor.indexer.q_b_proj.", "attn.indexer.wq_b."),
    ("self_attn.compressor.indexer.", "attn.indexer.compressor."),
    ("self_attn.", "attn."), ("mlp.", "ffn."),
)
LEAF_RENAMES = (
    ("q_a_proj.", "wq_a."), ("q_b_proj.", "wq_b."), ("kv_proj.", "wkv."), ("q_a_norm.", "q_norm."),
    ("o_a_proj.", "wo_a."),
    ("o_b_proj.", "wo_b."), ("sinks", "attn_sink"), ("gate.e_score_correction_bias", "gate.bias"),
    ("shared_experts.gate_proj.", "shared_experts.w1."), ("shared_experts.up_proj.", "shared_experts.w3."),
    ("shared_experts.down_proj.", "shared_experts.w2."),
)
COMPRESSOR_LEAVES = (("kv_proj.", "wkv."), ("gate_proj.", "wgate."), ("position_bias", "ape"), ("kv_norm.", "norm."))
EXPERT_LEAVES = {"gate": "w1", "up": "w3", "down": "w2"}


def published_name(name: str) -> str:
    """`model.layers.3.self_attn.compressor.kv_proj.weight` -> `layers.3.attn.compressor.wkv.weight`."""
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    found = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name)
    if found is None:
        raise KeyError(name)
    layer, rest = found.groups()
    expert = EXPERT.fullmatch(rest)
    if expert:
        return f"layers.{layer}.ffn.experts.{rest.split('.')[2]}.{EXPERT_LEAVES[expert.group(1)]}.weight"
    old, new = next(((o, n) for o, n in LAYER_RENAMES if rest.startswith(o)), ("", ""))
    rest = new + rest[len(old):]
    leaves = COMPRESSOR_LEAVES if rest.startswith(("attn.compressor.", "attn.indexer.compressor.")) else LEAF_RENAMES
    for old, new in leaves:
        rest = rest.replace(old, new)
    return f"layers.{layer}.{rest}"
