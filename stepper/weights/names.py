"""The tensors a config needs, by HF checkpoint name, with their shapes and storage dtypes.

`weight_shapes` lists every tensor of a model, `storage_dtype` how a Kimi K2 / DeepSeek-V3
checkpoint stores it: linear weights as FP8 e4m3 codes with float32 block scales
(`weight_scale_inv`), norms, embeddings, lm_head and the router's gate in BF16, the router's
bias in float32.
"""

from __future__ import annotations

import re

from stepper.config import Config
from stepper.errors import StepperError

INDEXER_FP8 = ("self_attn.indexer.wq_b.weight", "self_attn.indexer.wk.weight")
INDEXER_BF16 = "self_attn.indexer.weights_proj.weight"  # stored BF16 in DeepSeek-V3.2's checkpoint


def text_name(cfg: Config, stored: str) -> str | None:
    """The name stepper knows a stored tensor by: in a wrapped checkpoint (kimi_k25) the text
    model's tensor without its prefix (`language_model.model.norm.weight` is `model.norm.weight`),
    None for a tensor of the wrapper's other parts (vision tower, projector), which no run reads;
    in a family whose files name its tensors otherwise than its transformers modules (Hy4), the
    module's name (the config class's `read_name`)."""
    wrapper = cfg.wrapper
    if wrapper is None:
        own = getattr(cfg, "read_name", None)
        return stored if own is None else own(stored)
    if stored.startswith(wrapper.unused_prefixes):
        return None
    return stored.removeprefix(wrapper.text_prefix)


def stored_name(cfg: Config, name: str) -> str:
    """The name a checkpoint of this config stores a tensor under (text_name's inverse): with the
    wrapper's prefix, or as the family's files name it (the config class's `write_name`: Ling 3's)."""
    if cfg.wrapper is not None:
        return cfg.wrapper.text_prefix + name
    return getattr(cfg, "write_name", lambda same: same)(name)


QUOTED_TEXT_NAME = re.compile(r"'((?:model|lm_head)\.[^'\s]*)'")  # a text model's tensor, as messages quote it


def named_on_disk(cfg: Config | dict, message: str) -> str:
    """A message naming each tensor as the checkpoint's files do: in a wrapped checkpoint, the text
    model's tensors it quotes ('model.norm.weight') with their prefix ('language_model.model.norm.weight').
    A DeepSeek-V4 checkpoint's config (a dict: stepper.weights.published) has no wrapper."""
    if getattr(cfg, "wrapper", None) is None:
        return message
    return QUOTED_TEXT_NAME.sub(lambda m: f"'{stored_name(cfg, m[1])}'", message)


def is_linear(name: str) -> bool:
    """The projection weights a DeepSeek-V3 / Kimi K2 / V3.2 checkpoint quantizes to FP8."""
    if not name.startswith("model.layers.") or name.endswith(INDEXER_BF16):
        return False
    return name.endswith(("_proj.weight", "_proj_with_mqa.weight", *INDEXER_FP8))


def storage_dtype(cfg: Config, name: str) -> str:
    """F32, F8_E4M3, BF16, or INT4 for a module a compressed-tensors config quantizes (its weight
    stored as weight_packed, weight_scale and weight_shape)."""
    if name.endswith(("e_score_correction_bias", "A_log", "dt_bias")):  # the router's bias, KDA's decay (Kimi Linear)
        return "F32"
    if cfg.quantization is not None and is_linear(name):
        return "F8_E4M3"
    linear = is_linear(name) or name == "lm_head.weight"  # the embedding is no linear module
    if cfg.int4 is not None and linear and cfg.int4.quantizes(name.removesuffix(".weight"), linear):
        return "INT4"
    return "BF16"


EMBED = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"
ROTARY_ALPHA = "model.rotary_emb.alpha"  # Mistral Large 4's learned exponents of the rotary frequencies [rope/2]


def layer_prefix(layer: int) -> str:
    return f"model.layers.{layer}."


def attention_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    d, h = cfg.hidden_size, cfg.num_attention_heads
    shapes: dict[str, tuple[int, ...]] = {}
    if cfg.q_lora_rank is None:
        shapes["self_attn.q_proj.weight"] = (h * cfg.qk_head_dim, d)
    else:
        shapes["self_attn.q_a_proj.weight"] = (cfg.q_lora_rank, d)
        shapes["self_attn.q_a_layernorm.weight"] = (cfg.q_lora_rank,)
        q_b_out = h * (cfg.qk_head_dim + (cfg.v_head_dim if cfg.q_gate else 0))  # A.X-K2: each head's output gate too
        shapes["self_attn.q_b_proj.weight"] = (q_b_out, cfg.q_lora_rank * (2 if cfg.q_gate else 1))
    shapes["self_attn.kv_a_proj_with_mqa.weight"] = (cfg.kv_lora_rank + cfg.qk_rope_head_dim, d)
    shapes["self_attn.kv_a_layernorm.weight"] = (cfg.kv_lora_rank,)
    shapes["self_attn.kv_b_proj.weight"] = (h * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank)
    shapes["self_attn.o_proj.weight"] = (d, h * cfg.v_head_dim)
    if cfg.has_indexer:
        shapes.update(indexer_shapes(cfg))
    return shapes


def indexer_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """DeepSeek-V3.2's Lightning Indexer: its query from q_a_norm, one key per token, per-head weights."""
    heads, dim = cfg.index_n_heads, cfg.index_head_dim
    return {
        "self_attn.indexer.wq_b.weight": (heads * dim, cfg.q_lora_rank),
        "self_attn.indexer.wk.weight": (dim, cfg.hidden_size),
        "self_attn.indexer.k_norm.weight": (dim,),
        "self_attn.indexer.k_norm.bias": (dim,),
        INDEXER_BF16: (heads, cfg.hidden_size),
    }


def swiglu_shapes(prefix: str, hidden: int, inter: int) -> dict[str, tuple[int, ...]]:
    return {
        f"{prefix}gate_proj.weight": (inter, hidden),
        f"{prefix}up_proj.weight": (inter, hidden),
        f"{prefix}down_proj.weight": (hidden, inter),
    }


def router_names(cfg: Config) -> tuple[str, str]:
    """The router's weight and bias: DeepSeek's mlp.gate, or LongCat's mlp.router.classifier."""
    if cfg.zero_experts:
        return "mlp.router.classifier.weight", "mlp.router.e_score_correction_bias"
    return "mlp.gate.weight", "mlp.gate.e_score_correction_bias"


def longcat_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """A LongCat-Flash layer's tensors (layer-relative): two attention and two dense-MLP sublayers,
    each with its norms (`<module>.0.`, `<module>.1.`), and the MoE (its zero experts have none)."""
    d, shapes = cfg.hidden_size, {}
    for j in (0, 1):
        shapes.update({f"input_layernorm.{j}.weight": (d,), f"post_attention_layernorm.{j}.weight": (d,)})
        shapes.update({k.replace("self_attn.", f"self_attn.{j}."): v for k, v in attention_shapes(cfg).items()})
        shapes.update(swiglu_shapes(f"mlps.{j}.", d, cfg.intermediate_size))
    weight, bias = router_names(cfg)
    shapes.update({weight: (cfg.router_experts, d), bias: (cfg.router_experts,)})
    for e in range(cfg.n_routed_experts):
        shapes.update(swiglu_shapes(f"mlp.experts.{e}.", d, cfg.moe_intermediate_size))
    return shapes


def layer_shapes(cfg: Config, layer: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of one decoder layer, by full name, with its shape: the MLA family's, or what
    the config's own class says (a family's config class with a `layer_shapes(layer)` method:
    its on-disk names)."""
    own = getattr(cfg, "layer_shapes", None)
    return own(layer) if own is not None else mla_layer_shapes(cfg, layer)


def mla_layer_shapes(cfg: Config, layer: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of one MLA decoder layer, by full HF name, with its shape."""
    d = cfg.hidden_size
    if cfg.shortcut_moe:
        return {layer_prefix(layer) + k: v for k, v in longcat_shapes(cfg).items()}
    shapes = {"input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,), **attention_shapes(cfg)}
    if cfg.index_reused(layer):  # GLM-5's shared layer has no indexer
        shapes = {k: v for k, v in shapes.items() if not k.startswith("self_attn.indexer.")}
    for norm in ("input_layernorm", "post_attention_layernorm"):  # A.X-K2's gated norms
        if cfg.has_gated_norms and (norm == "input_layernorm" or cfg.is_moe_layer(layer)):
            del shapes[f"{norm}.weight"]
            shapes.update({f"{norm}.norm.weight": (d,), f"{norm}.W_down.weight": (cfg.gated_norm_rank, d),
                           f"{norm}.W_up.weight": (d, cfg.gated_norm_rank)})
    if cfg.is_moe_layer(layer):
        shapes["mlp.gate.weight"] = (cfg.n_routed_experts, d)
        if cfg.topk_method == "noaux_tc" and cfg.router_bias:  # only the aux-loss-free router has a bias
            shapes["mlp.gate.e_score_correction_bias"] = (cfg.n_routed_experts,)
        for e in range(cfg.n_routed_experts):
            shapes.update(swiglu_shapes(f"mlp.experts.{e}.", d, cfg.moe_intermediate_size))
        shared = cfg.moe_intermediate_size * cfg.n_shared_experts
        if shared:
            shapes.update(swiglu_shapes("mlp.shared_experts.", d, shared))
    else:
        shapes.update(swiglu_shapes("mlp.", d, cfg.intermediate_size))
    if cfg.moe_output_norm and cfg.is_moe_layer(layer):  # A.X-K1's norm on the MoE's output
        shapes["post_mlp_layernorm.weight"] = (d,)
    return {layer_prefix(layer) + k: v for k, v in shapes.items()}


def unread_layer_shapes(cfg: Config, layer: int) -> dict[str, tuple[int, ...]]:
    """Tensors a published checkpoint of this config stores in a layer beyond layer_shapes', which
    no run reads, by full name: what the config's class says (`unread_layer_shapes(layer)`: A.X-K1's)."""
    return own(layer) if (own := getattr(cfg, "unread_layer_shapes", None)) else {}


def zero_layer_shapes(cfg: Config, layer: int) -> dict[str, tuple[int, ...]]:
    """Tensors a checkpoint of this config may hold in a layer, no run reading them, if they hold
    zeros (the config class's `zero_layer_shapes(layer)`: A.X-K1's router bias, which transformers
    keeps at zero and saves): a nonzero one would change what the layer computes."""
    return own(layer) if (own := getattr(cfg, "zero_layer_shapes", None)) else {}


def optional_layer_shapes(cfg: Config, layer: int) -> dict[str, tuple[int, ...]]:
    """What a checkpoint may hold in a layer that no run reads: a checkpoint without them is whole,
    one with them has them checked as the layer's own."""
    return {**unread_layer_shapes(cfg, layer), **zero_layer_shapes(cfg, layer)}


def held_layer_shapes(cfg: Config, layer: int) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint may hold in a layer: what a run reads, and optional_layer_shapes."""
    return {**layer_shapes(cfg, layer), **optional_layer_shapes(cfg, layer)}


def weight_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """Every tensor of the whole model, by full HF name, with its shape."""
    outer = global_shapes(cfg)
    shapes = {EMBED: outer.pop(EMBED)}  # the embedding first, then the layers, then norm and lm_head
    for layer in range(cfg.num_hidden_layers):
        shapes.update(layer_shapes(cfg, layer))
    return {**shapes, **outer}


def shape_of(cfg: Config, name: str) -> tuple[int, ...]:
    """The shape of one named tensor, without listing all of a full-size model's experts."""
    if name.startswith("model.layers."):
        layer = int(name.split(".")[2])
        if 0 <= layer < cfg.num_hidden_layers:
            shapes = held_layer_shapes(cfg, layer)
            if name in shapes:
                return shapes[name]
    elif name in (globals_ := global_shapes(cfg)):
        return globals_[name]
    raise StepperError(f"no tensor named '{name}' in model {cfg.name}")


def global_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """The tensors outside the layers: embedding, final norm, lm_head (none when tied to the
    embedding: Youtu, MiniCPM3), or what the config's own class says (`global_shapes()`: Hy4's)."""
    if (own := getattr(cfg, "global_shapes", None)) is not None:
        return own()
    shapes = {EMBED: (cfg.vocab_size, cfg.hidden_size), "model.norm.weight": (cfg.hidden_size,)}
    if not cfg.tie_word_embeddings:
        shapes[LM_HEAD] = (cfg.vocab_size, cfg.hidden_size)
    return shapes


def layer_globals(cfg: Config) -> dict[str, tuple[int, ...]]:
    """Tensors outside the layers that any layer's run reads (the config class's `layer_globals()`:
    Mistral Large 4's rotary alpha), held and checked with any slice of layers."""
    return own() if (own := getattr(cfg, "layer_globals", None)) else {}


def head_weight(cfg: Config) -> str:
    """The matrix the logits are made with: lm_head.weight, or the embedding when tied (Youtu, MiniCPM3)."""
    return EMBED if cfg.tie_word_embeddings else LM_HEAD
