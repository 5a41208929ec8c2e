"""Mistral Large 4 (`mistral_large4`, transformers' models/mistral_large4): GLM-5's layer (MLA with
the Lightning Indexer, interleaved RoPE in both, a "shared" indexer reusing the last full one's
choice) with these differences:
- one query projection (`q_proj`, no q latent), and the latent's norm at rms_norm_eps;
- the rotary frequencies of YaRN (cos and sin times attention_factor, 1 by default) each times
  exp(alpha), alpha learned (LeRoPE: `model.rotary_emb.alpha` [rope/2]);
- each head's queries at position p times scale_h ln(p + 1) + bias_h, learned per layer
  (`self_attn.softmax_scaling`), after RoPE; the indexer's likewise, per index head, before it;
- NoPE layers (every fourth by default, `no_rope_layers` 0): no rotary dims, the whole head of
  qk_nope + qk_rope dims made by kv_b from the latent alone;
- the indexer's query is wq_b(LayerNorm(x)) (its own norm, with a bias), not of q_a_norm;
- Mistral 4's router (softmax scores, groups judged by their best two, dropped groups' scores 0,
  always renormalised, no bias);
- the logits capped: c tanh(logits / c), c = final_logit_softcapping (30).
The config.json is the vision-language wrapper (`mistral_large4`, the text model in text_config);
stepper runs the text model. Its files name the tensors as Mistral's consolidated format does
(`layers.N.attention.wq.weight`, `lerope.alpha`: what save_pretrained writes by default, experts
one by one), or, saved with save_original_format=False, as transformers' modules under
`model.language_model.` with each layer's experts fused; either is read. A layer may read an earlier
layer's latent and turned rotary key (`kv_source_layers`), with kv_b_proj and the rest its own. A field
stepper does not honour is refused by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

from stepper.config import Config, Fields, load_config, model_name, rope_settings
from stepper.families import deepseek, glm_moe_dsa, mla_fields
from stepper.families.family import Family, renamed
from stepper.model.layer import decoder_layer
from stepper.untrusted import said
from stepper.weights import remote
from stepper.weights.checkpoint import Checkpoint
from stepper.weights.names import EMBED, LM_HEAD, ROTARY_ALPHA, layer_prefix, mla_layer_shapes

MODEL_TYPE = "mistral_large4"
TEXT_TYPE = "mistral_large4_text"
ARCHITECTURE = "MistralLarge4ForConditionalGeneration"
ROUTER = (("softmax",), ("noaux_tc",))  # Mistral 4's: softmax scores, groups judged by their best two, no bias
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2048.0, "original_max_position_embeddings": 512,
        "beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": 1.0}
DEFAULTS: dict[str, Any] = {  # MistralLarge4TextConfig's
    "vocab_size": 204800, "hidden_size": 6144, "intermediate_size": 24576, "moe_intermediate_size": 6144,
    "num_hidden_layers": 72, "num_attention_heads": 64, "n_shared_experts": 1, "n_routed_experts": 128,
    "routed_scaling_factor": 1.0, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "qk_nope_head_dim": 64, "n_group": 1, "topk_group": 1, "num_experts_per_tok": 4, "max_position_embeddings": 1048576,
    "rms_norm_eps": 1e-5, "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 32, "first_k_dense_replace": 1,
    "final_logit_softcapping": 30.0, "norm_topk_prob": True,
}
RENAMES = {"num_local_experts": "n_routed_experts", "num_experts": "n_routed_experts"}  # transformers' other names
# MistralLarge4TextConfig's own fields, read here and not by the MLA reader; `head_dim` transformers sets
# itself (to qk_rope_head_dim), `qk_head_dim` it derives (nope + rope)
OWN = ("no_rope_layers", "no_rope_layer_interval", "kv_source_layers", "indexer_types", "index_topk_pattern",
       "index_topk_freq", "index_skip_topk_offset", "mlp_layer_types", "layer_types", "head_dim", "qk_head_dim",
       "final_logit_softcapping", "output_router_logits")
ATTENTION = "indexed_attention"  # the one kind of layer in layer_types
NOPE_INTERVAL = 4  # transformers' default: every fourth layer has no RoPE
# what transformers' conversion mapping renames Mistral's consolidated names to, in its order
READ = ((r"^tok_embeddings\.", "model.embed_tokens."), (r"^norm\.", "model.norm."), (r"^output\.", "lm_head."),
        (r"^lerope\.alpha$", ROTARY_ALPHA), (r"^layers\.", "model.layers."), (r"\.attention\.", ".self_attn."),
        (r"\.wq\.", ".q_proj."), (r"\.wkv_a_with_mqa\.", ".kv_a_proj_with_mqa."), (r"\.wkv_b\.", ".kv_b_proj."),
        (r"\.wo\.", ".o_proj."), (r"\.kv_a_norm\.", ".kv_a_layernorm."),
        (r"\.ssmax_scaling\.s$", ".softmax_scaling.scale"), (r"\.ssmax_scaling\.b$", ".softmax_scaling.bias"),
        (r"\.attention_norm\.", ".input_layernorm."), (r"\.ffn_norm\.", ".post_attention_layernorm."),
        (r"\.feed_forward\.", ".mlp."), (r"\.(gate|experts|shared_experts)\.", r".mlp.\1."),
        (r"\.w1\.weight$", ".gate_proj.weight"), (r"\.w2\.weight$", ".down_proj.weight"),
        (r"\.w3\.weight$", ".up_proj.weight"))
WRITE = ((r"^model\.embed_tokens\.", "tok_embeddings."), (r"^model\.norm\.", "norm."), (r"^lm_head\.", "output."),
         (r"^model\.rotary_emb\.alpha$", "lerope.alpha"), (r"^model\.layers\.", "layers."),
         (r"\.self_attn\.", ".attention."), (r"\.q_proj\.", ".wq."), (r"\.kv_a_proj_with_mqa\.", ".wkv_a_with_mqa."),
         (r"\.kv_b_proj\.", ".wkv_b."), (r"\.o_proj\.", ".wo."), (r"\.kv_a_layernorm\.", ".kv_a_norm."),
         (r"\.softmax_scaling\.scale$", ".ssmax_scaling.s"), (r"\.softmax_scaling\.bias$", ".ssmax_scaling.b"),
         (r"\.input_layernorm\.", ".attention_norm."), (r"\.post_attention_layernorm\.", ".ffn_norm."),
         (r"\.mlp\.(gate|experts|shared_experts)\.", r".\1."), (r"\.mlp\.", ".feed_forward."),
         (r"\.gate_proj\.weight$", ".w1.weight"), (r"\.down_proj\.weight$", ".w2.weight"),
         (r"\.up_proj\.weight$", ".w3.weight"))
HF_PREFIX = "model.language_model."  # transformers' own layout (save_original_format=False)
UNUSED = ("vision_encoder.", "pre_mm_projector_norm.", "patch_merger.", "vision_language_adapter.", "mtp_dspark.",
          "model.vision_tower.", "model.multi_modal_projector.")  # the vision tower, projector, MTP head: never read
VISION = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
          "head_dim": 8, "patch_size": 4, "image_size": 16}  # the smallest pixtral tower transformers builds


@dataclasses.dataclass(frozen=True)
class MistralLarge4Config(Config):
    """MLA's config with Mistral Large 4's fields set: its NoPE layers, the layer each reads the latent
    of (kv_sources) and the logit cap; written back as its config.json (the wrapper)."""

    nope_layers: tuple[int, ...] = ()
    kv_sources: tuple[int, ...] = ()
    final_logit_softcapping: float | None = 30.0
    lerope = True
    learned_query_scale = True
    indexer_query_from_hidden = True

    @property
    def latent_norm_eps(self) -> float:  # kv_a_layernorm is built with rms_norm_eps
        return self.rms_norm_eps

    def to_hf(self) -> dict[str, Any]:
        return published(self)

    @staticmethod
    def read_name(stored: str) -> str | None:
        """A tensor's name in the files (`layers.0.attention.wq.weight`, or transformers' own
        `model.language_model.layers.0.self_attn.q_proj.weight`) -> its transformers text module's
        (`model.layers.0.self_attn.q_proj.weight`); None for the vision tower's, projector's, MTP head's."""
        if stored.startswith(UNUSED):
            return None
        if stored.startswith(HF_PREFIX):
            return "model." + stored.removeprefix(HF_PREFIX)
        return stored if stored == LM_HEAD else renamed(stored, READ)

    def write_name(self, name: str) -> str:
        """read_name's inverse: the consolidated name, or (experts fused: transformers' layout) the
        module's under model.language_model."""
        if not self.fused_experts:
            return renamed(name, WRITE)
        return name if name == LM_HEAD else HF_PREFIX + name.removeprefix("model.")

    def layer_shapes(self, layer: int) -> dict[str, tuple[int, ...]]:
        """MLA's tensors with one q_proj, the layer's own rotary width (none in a NoPE layer), the
        learned query scales, and the indexer's query from the hidden state (its LayerNorm's weight
        and bias)."""
        d, heads, pre = self.hidden_size, self.num_attention_heads, layer_prefix(layer)
        own = {"self_attn.kv_a_proj_with_mqa.weight": (self.kv_lora_rank + self.rope_dims(layer), d),
               "self_attn.kv_b_proj.weight": (heads * (self.nope_dims(layer) + self.v_head_dim), self.kv_lora_rank),
               "self_attn.softmax_scaling.scale": (heads,), "self_attn.softmax_scaling.bias": (heads,)}
        if not self.index_reused(layer):
            index_heads = self.index_n_heads
            own |= {"self_attn.indexer.wq_b.weight": (index_heads * self.index_head_dim, d),
                    "self_attn.indexer.q_input_norm.weight": (d,), "self_attn.indexer.q_input_norm.bias": (d,),
                    "self_attn.indexer.softmax_scaling.scale": (index_heads,),
                    "self_attn.indexer.softmax_scaling.bias": (index_heads,)}
        shapes = {**mla_layer_shapes(self, layer), **{pre + k: v for k, v in own.items()}}
        if self.kv_shared(layer):  # it reads an earlier layer's latent: no kv_a of its own
            return {k: v for k, v in shapes.items() if not k.startswith(f"{pre}self_attn.kv_a_")}
        return shapes

    def layer_label(self, layer: int) -> str:
        """What sets the layer's tensors apart (stepper tree, the run's headings): dense or MoE, NoPE, the
        latent of another layer, a reused index choice."""
        kinds = ["MoE" if self.is_moe_layer(layer) else "dense", "NoPE" if layer in self.nope_layers else "",
                 f"layer {self.kv_source(layer)}'s latent" if self.kv_shared(layer) else "",
                 "reused index choice" if self.index_reused(layer) else ""]
        return ", ".join(kind for kind in kinds if kind)

    def memory_line(self, positions: int) -> str:
        """The run header's line on the latent caches: a NoPE layer's keeps no rotary key, a layer reading
        an earlier layer's latent keeps none of its own."""
        own = [i for i in range(self.num_hidden_layers) if not self.kv_shared(i)]
        nope = sum(1 for i in own if not self.rope_dims(i))
        per_position = sum(4 * (self.kv_lora_rank + self.rope_dims(i)) for i in own)
        return (f"latents: {len(own)} of {self.num_hidden_layers} layers keep their own ({nope} of them NoPE, "
                f"no rotary key), {self.num_hidden_layers - len(own)} read an earlier layer's: {per_position:,} B "
                f"a position for the model, {per_position * positions:,} B over {positions:,} positions")

    def layer_globals(self) -> dict[str, tuple[int, ...]]:
        """What every layer's RoPE reads beside its own tensors: LeRoPE's alpha."""
        return {ROTARY_ALPHA: (self.qk_rope_head_dim // 2,)}

    def global_shapes(self) -> dict[str, tuple[int, ...]]:
        """The embedding, LeRoPE's alpha, the final norm and lm_head."""
        return {EMBED: (self.vocab_size, self.hidden_size), **self.layer_globals(),
                "model.norm.weight": (self.hidden_size,), LM_HEAD: (self.vocab_size, self.hidden_size)}


def to_mla(f) -> tuple[dict[str, Any], dict[str, Any]]:
    """The text config.json in DeepseekV3's names, and the fields of its own."""
    raw = mla_fields.with_defaults(mla_fields.renamed(f, RENAMES), DEFAULTS)
    if raw.get("rope_scaling") is not None:  # transformers reads the older block, given, before rope_parameters
        raw["rope_parameters"] = None
    elif raw.get("rope_parameters") is None:  # neither: transformers' default YaRN
        raw["rope_parameters"] = YARN
    own = {field: raw.pop(field) for field in OWN if field in raw}
    refuse(f, raw, own)
    fields = mla_fields.typed(f, raw)
    layers = fields.int("num_hidden_layers")
    mla_fields.check_one_kind(f, own.get("layer_types"), layers, ATTENTION, "Mistral Large 4")
    first, freq = (raw.get("first_k_dense_replace"), 1) if own.get("mlp_layer_types") is None else \
        mla_fields.dense_prefix(f, {**raw, **own})
    nope = nope_layers(f, own, layers)
    types = glm_moe_dsa.indexer_types(mla_fields.typed(f, {**f.raw, **own}), layers)
    cap = mla_fields.typed(f, own).float("final_logit_softcapping")
    extra = {"nope_layers": nope, "kv_sources": kv_sources(f, own.get("kv_source_layers"), nope, layers),
             "final_logit_softcapping": cap,
             "index_reused_layers": tuple(i for i, kind in enumerate(types) if kind == "shared"),
             "rope_scaling": mla_fields.transformers_yarn(fields, rope_settings(fields)[1]), "router_bias": False,
             "norm_topk_prob": True, "indexer_rope_interleave": True,
             **{field: fields.int(field) for field in ("index_n_heads", "index_head_dim", "index_topk")}}
    if extra["index_head_dim"] < fields.int("qk_rope_head_dim"):
        raise f.fail("index_head_dim", f"({extra['index_head_dim']}) must be at least qk_rope_head_dim "
                     f"({fields.int('qk_rope_head_dim')}): the indexer turns its first qk_rope_head_dim dims")
    return {**raw, "first_k_dense_replace": first, "moe_layer_freq": freq}, extra


def refuse(f, raw: dict[str, Any], own: dict[str, Any]) -> None:
    """The fields transformers' model does not read, or reads otherwise than they say, refused by name."""
    if raw.get("q_lora_rank") is not None:
        raise f.fail("q_lora_rank", f"must be null: Mistral Large 4's query is one q_proj, "
                     f"got {said(raw['q_lora_rank'])}")
    if raw.get("norm_topk_prob") is not True:
        raise f.fail("norm_topk_prob", f"must be true: Mistral Large 4's router always renormalises the chosen "
                     f"experts' scores, got {said(raw['norm_topk_prob'])}")
    if own.get("final_logit_softcapping", 30.0) is None:
        raise f.fail("final_logit_softcapping", "must be a number: Mistral Large 4 caps its logits, c tanh(x / c)")
    mla_fields.check_interleaved(f, raw)
    mla_fields.check_rotary_fraction(f, raw, 1.0)
    if mla_fields.rope_block(raw).get("llama_4_scaling_beta"):
        raise f.fail("rope_parameters.llama_4_scaling_beta", "is not read by Mistral Large 4 (its query scales are "
                     "learned: softmax_scaling)")
    mla_fields.refuse_present(f, raw, ("quantization_config",), "stepper reads Mistral Large 4 in BF16 or float32")
    mla_fields.refuse_present(f, raw, ("attention_bias",), "kv_a_proj and o_proj have no bias in stepper's MLA")


def nope_layers(f, own: dict[str, Any], layers: int) -> tuple[int, ...]:
    """The layers that rotate nothing: `no_rope_layers` 0 (1: RoPE; entries past the last layer unread),
    or, not given, every no_rope_layer_interval-th (4th)."""
    given = own.get("no_rope_layers")
    if given is None:
        interval = mla_fields.typed(f, own).int("no_rope_layer_interval", default=NOPE_INTERVAL)
        return tuple(i for i in range(layers) if (i + 1) % interval == 0)
    if not isinstance(given, list) or len(given) < layers or \
            not all(type(v) is int and v in (0, 1) for v in given[:layers]):
        raise f.fail("no_rope_layers", f"must give 1 (RoPE) or 0 (none) for each of the {layers} layers, "
                     f"got {said(given)}")
    return tuple(i for i in range(layers) if given[i] == 0)


def kv_sources(f, given: Any, nope: tuple[int, ...], layers: int) -> tuple[int, ...]:
    """Per layer, the layer whose latent it reads (`kv_source_layers`; () when each reads its own). A
    source is the layer itself or an earlier one that reads its own; and it must be the one transformers'
    layer reads: the last earlier source of its kind (RoPE or NoPE), whatever the list names."""
    if given is None or given == list(range(layers)):
        return ()
    if not isinstance(given, list) or len(given) != layers or \
            any(isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= i for i, s in enumerate(given)):
        raise f.fail("kv_source_layers", f"must give, for each of the {layers} layers, itself or an earlier layer, "
                     f"got {said(given)}")
    sources = {s for i, s in enumerate(given) if s != i}
    for i, s in enumerate(given):
        if s != i and given[s] != s:
            raise f.fail("kv_source_layers", f"names layer {s} for layer {i}, which reads layer {given[s]}'s latent "
                         f"in turn: a source keeps its own")
        kind = [j for j in sources if j < i and (j in nope) == (i in nope)]
        if s != i and s != max(kind, default=None):
            what = "RoPE" if i not in nope else "NoPE"
            read = f"layer {max(kind)}" if kind else "there is none (transformers raises a KeyError)"
            raise f.fail("kv_source_layers", f"names layer {s} for layer {i}, but transformers' layer reads the last "
                         f"earlier source of its kind ({what} layers): {read}")
    return tuple(given)


def published(cfg: MistralLarge4Config) -> dict[str, Any]:
    """The config.json of a Mistral Large 4 checkpoint of this config: the wrapper, the text model in
    text_config (MistralLarge4TextConfig's fields), the smallest vision tower beside it (none is written)."""
    out = mla_fields.published_fields(cfg, TEXT_TYPE, ARCHITECTURE, drop=(
        "moe_layer_freq", "first_k_dense_replace", "q_lora_rank", "norm_topk_prob", "architectures",
        "tie_word_embeddings"))
    yarn = {k: v for k, v in out.pop("rope_scaling", {}).items() if k != "type"}  # Config.to_hf's YaRN block
    out["rope_parameters"] = {"rope_type": "yarn" if yarn else "default", "rope_theta": out.pop("rope_theta"), **yarn}
    layers = range(cfg.num_hidden_layers)
    text = {**out, "mlp_layer_types": ["sparse" if cfg.is_moe_layer(i) else "dense" for i in layers],
            "indexer_types": ["shared" if cfg.index_reused(i) else "full" for i in layers],
            "no_rope_layers": [int(cfg.rope_dims(i) > 0) for i in layers],
            "kv_source_layers": [cfg.kv_source(i) for i in layers],
            "layer_types": [ATTENTION] * cfg.num_hidden_layers,
            "final_logit_softcapping": cfg.final_logit_softcapping}
    return {"architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, "text_config": text, "vision_config": VISION,
            "tie_word_embeddings": False}


read_text_config = mla_fields.reader(TEXT_TYPE, ROUTER, to_mla, MistralLarge4Config)


def read_config(raw: dict[str, Any], source: str) -> MistralLarge4Config:
    """The wrapper's config.json: the text model out of text_config (a text model's alone has no
    lm_head and no cap in transformers: refused)."""
    f = Fields(raw, source)
    if raw.get("model_type") != MODEL_TYPE:  # the text model's own (TEXT_TYPE)
        raise f.fail("model_type", f"must be '{MODEL_TYPE}' (the model with lm_head and its logit cap, "
                     f"MistralLarge4ForConditionalGeneration), got {said(raw.get('model_type'))}")
    text = {} if raw.get("text_config") is None else raw["text_config"]  # none: transformers' defaults
    if not isinstance(text, dict):
        raise f.fail("text_config", f"must be an object (the text model's config), got {said(text)}")
    if text.get("model_type", TEXT_TYPE) != TEXT_TYPE:
        raise f.fail("text_config.model_type", f"must be '{TEXT_TYPE}', got {said(text['model_type'])}")
    if raw.get("tie_word_embeddings"):
        raise f.fail("tie_word_embeddings", "must be false: lm_head is its own matrix")
    if raw.get("quantization_config") is not None:
        text = {**text, "quantization_config": raw["quantization_config"]}  # refused by the text model's reader
    cfg = read_text_config({**text, "model_type": TEXT_TYPE}, f"{source}: text_config")
    return dataclasses.replace(cfg, name=model_name(raw, source), model_type=MODEL_TYPE)


def open_checkpoint(where: str | Path, read: Callable[[dict[str, Any], str], Any]) -> Checkpoint:
    """The checkpoint (a folder, or a remote one), its config's fused_experts the layout its names hold:
    transformers' own (model.language_model.*, each layer's experts in two tensors) or Mistral's."""
    read_config = partial(load_config, read=read)
    if isinstance(where, str) and remote.is_remote(where):
        ckpt = remote.open_remote(where, read_config=read_config)
    else:
        ckpt = Checkpoint(where, read_config)
    if any(name.startswith(HF_PREFIX) for name in ckpt.stored_as.values()):
        ckpt.config = dataclasses.replace(ckpt.config, fused_experts=True)
    return ckpt


def miniature(cfg: MistralLarge4Config, layer: int) -> MistralLarge4Config:
    """DeepSeek's miniature whose layer 0 is a NoPE layer, and "shared", when `layer` is; for a layer that
    reads an earlier one's latent, two layers of its kind, the second reading the first's."""
    nope = layer in cfg.nope_layers
    if not cfg.kv_shared(layer):
        return dataclasses.replace(deepseek.miniature(cfg, layer), nope_layers=(0,) if nope else (),
                                   index_reused_layers=(0,) if cfg.index_reused(layer) else (), kv_sources=())
    return dataclasses.replace(deepseek.miniature(cfg, layer), num_hidden_layers=2, nope_layers=(0, 1) if nope else (),
                               index_reused_layers=(1,) if cfg.index_reused(layer) else (), kv_sources=(0, 0))


def cache_bytes(cfg: MistralLarge4Config, layers: Iterable[int], positions: int, attn: str, index_scoring: str) -> int:
    """Each layer's cache: its latent and rotary key (none in a NoPE layer) where it makes its own, its
    indexer's key where it runs its indexer, and on the naive path its per-head keys and values."""
    index_key = cfg.index_head_dim * 4 + (cfg.index_head_dim + 4 if index_scoring == "fp8" else 0)
    per_head = cfg.num_attention_heads * (cfg.qk_head_dim + cfg.v_head_dim) * 4 if attn == "naive" else 0
    return positions * sum(per_head + (0 if cfg.kv_shared(i) else (cfg.kv_lora_rank + cfg.rope_dims(i)) * 4)
                           + (0 if cfg.index_reused(i) else index_key) for i in layers)


PARTS = ("model", "residual", "mla_attention", "mlp", "router", "router_softmax", "router_noaux_tc", "router_groups",
         "moe", "indexer", "index_fp8", "index_reuse", "mistral_large4")


FAMILY = Family(name="mistral_large4", model_types=(MODEL_TYPE, TEXT_TYPE), read_config=read_config,
                decoder_layer=decoder_layer, parts=deepseek.part_files(PARTS), miniature=miniature,
                checkpoint=partial(open_checkpoint, read=read_config), cache_bytes=cache_bytes)
