"""The tensors a config needs, by HF checkpoint name, with their shapes and storage dtypes.

`weight_shapes` lists every tensor of a model, `storage_dtype` how a Kimi K2 / DeepSeek-V3
checkpoint stores it: linear weights as FP8 e4m3 codes with float32 block scales
(`weight_scale_inv`), norms, embeddings, lm_head and the router's gate in BF16, the router's
bias in float32.
"""

from __future__ import annotations

from stepper.config import Config
from stepper.errors import StepperError

INDEXER_FP8 = ("self_attn.indexer.wq_b.weight", "self_attn.indexer.wk.weight")
INDEXER_BF16 = "self_attn.indexer.weights_proj.weight"  # stored BF16 in DeepSeek-V3.2's checkpoint


def text_name(cfg: Config, stored: str) -> str | None:
    """The name stepper knows a stored tensor by: in a wrapped checkpoint (kimi_k25) the text
    model's tensor without its prefix (`language_model.model.norm.weight` is `model.norm.weight`),
    None for a tensor of the wrapper's other parts (vision tower, projector), which no run reads."""
    wrapper = cfg.wrapper
    if wrapper is None:
        return stored
    if stored.startswith(wrapper.unused_prefixes):
        return None
    return stored.removeprefix(wrapper.text_prefix)


def stored_name(cfg: Config, name: str) -> str:
    """The name a checkpoint of this config stores a tensor under (text_name's inverse)."""
    return name if cfg.wrapper is None else cfg.wrapper.text_prefix + name


def is_linear(name: str) -> bool:
    """The projection weights a DeepSeek-V3 / Kimi K2 / V3.2 checkpoint quantizes to FP8."""
    if not name.startswith("model.layers.") or name.endswith(INDEXER_BF16):
        return False
    return name.endswith(("_proj.weight", "_proj_with_mqa.weight", *INDEXER_FP8))


def storage_dtype(cfg: Config, name: str) -> str:
    """F32, F8_E4M3, BF16, or INT4 for a module a compressed-tensors config quantizes (its weight
    stored as weight_packed, weight_scale and weight_shape)."""
    if name.endswith("e_score_correction_bias"):
        return "F32"
    if cfg.quantization is not None and is_linear(name):
        return "F8_E4M3"
    linear = is_linear(name) or name == "lm_head.weight"  # the embedding is no linear module
    if cfg.int4 is not None and linear and cfg.int4.quantizes(name.removesuffix(".weight"), linear):
        return "INT4"
    return "BF16"


EMBED = "model.embed_tokens.weight"


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
        shapes["self_attn.q_b_proj.weight"] = (h * cfg.qk_head_dim, cfg.q_lora_rank)
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


def layer_shapes(cfg: Config, layer: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of one decoder layer, by full name, with its shape: the MLA family's, or what
    the config's own class says (a family's config class with a `layer_shapes(layer)` method:
    its on-disk names)."""
    own = getattr(cfg, "layer_shapes", None)
    return own(layer) if own is not None else mla_layer_shapes(cfg, layer)


def mla_layer_shapes(cfg: Config, layer: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of one MLA decoder layer, by full HF name, with its shape."""
    d = cfg.hidden_size
    shapes = {"input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,), **attention_shapes(cfg)}
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
    if cfg.moe_output_norm:  # A.X-K1 stores it in every layer; only the MoE layers use it
        shapes["post_mlp_layernorm.weight"] = (d,)
    return {layer_prefix(layer) + k: v for k, v in shapes.items()}


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
            shapes = layer_shapes(cfg, layer)
            if name in shapes:
                return shapes[name]
    elif name in (globals_ := global_shapes(cfg)):
        return globals_[name]
    raise StepperError(f"no tensor named '{name}' in model {cfg.name}")


def global_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """The tensors outside the layers: embedding, final norm, lm_head (none when it is the
    embedding: tied, as in Youtu)."""
    head = {} if cfg.tie_word_embeddings else {"lm_head.weight": (cfg.vocab_size, cfg.hidden_size)}
    return {EMBED: (cfg.vocab_size, cfg.hidden_size), "model.norm.weight": (cfg.hidden_size,), **head}
