"""Ling 3 (`model_type: bailing_hybrid`, inclusionAI/Ling-3.0-Flash; transformers' models/bailing_hybrid):
Kimi Linear's hybrid layer (stepper.model.kimi_linear_layer) with these differences:
- the delta-attention (KDA) layers project their forget gate and their output gate with one
  matrix each (`f_proj`, `g_proj`: no rank-K bottleneck), and the forget gate is bounded
  ("safe gate", `kda_safe_gate`): g = kda_lower_bound * sigmoid(exp(A_log) * (f_proj(x) + dt_bias)),
  in (kda_lower_bound, 0), instead of -exp(A_log) * softplus(...) (stepper.model.kda);
- the MLA layers (every `layer_group_size`-th, or as `layer_types` says) rotate their rope dims
  (DeepSeek-V3's interleaved pairs, YaRN as transformers reads it) and gate each head's output by
  sigmoid(g_proj(x)), one logit per head (stepper.model.attention.per_head_gate);
- the MoE is DeepSeek-V3's (sigmoid scores, a bias to choose by, expert groups), in the layers
  `mlp_layer_types` marks sparse (after `first_k_dense_replace` dense ones).
A field stepper does not honour is refused by name.

On disk (the names transformers' conversion_mapping.py renames from, and its save_pretrained writes
back): `model.word_embeddings`, `model.layers.N.attention.*` (o_proj is `attention.dense`; the three
short convs `{q,k,v}_conv1d`, the forget gate's `f_proj`, `A_log`, `dt_bias`), the router's bias
`mlp.gate.expert_bias`, each expert's `mlp.experts.E.{gate,up,down}_proj`. stepper reads them with
four of that mapping's renames (`read_name`): `model.embed_tokens`, `self_attn.*`, `self_attn.o_proj`,
`mlp.gate.e_score_correction_bias`; the forget gate's tensors keep their names (transformers moves them
under `self_attn.forget_gate.`), and so do the three convs (transformers stacks them into one `conv1d`),
as in Kimi Linear's files. The layers after num_hidden_layers (num_nextn_predict_layers of multi-token
prediction) are not read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from stepper.config import (
    EPS_BELOW,
    TOKEN_ID_FIELDS,
    Fields,
    Yarn,
    model_name,
    rope_settings,
    token_ids,
    written_token_ids,
    yarn_fields,
)
from stepper.families import kimi_linear, mla_fields
from stepper.families.deepseek import part_files
from stepper.families.family import Family, renamed
from stepper.families.kimi_linear import KimiLinearConfig, check_experts
from stepper.kernels import kda_chunked
from stepper.model.kimi_linear_layer import hybrid_layer
from stepper.untrusted import said

MODEL_TYPE = "bailing_hybrid"
ARCHITECTURE = "BailingHybridForCausalLM"
FULL, LINEAR = "full_attention", "linear_attention"  # layer_types' two kinds: MLA, KDA
ROPE_THETA = 6_000_000.0  # BailingHybridConfig's default
ALIASES = {  # BailingHybridConfig's attribute_map: another name transformers reads a field under -> the field
    "num_local_experts": "num_experts", "num_experts_per_tok": "num_experts_per_token", "n_group": "num_expert_group",
    "norm_topk_prob": "moe_renormalize", "n_shared_experts": "num_shared_experts",
    "max_position_embeddings": "model_max_length", "num_mtp_layers": "num_nextn_predict_layers"}
# four of transformers' renames of Ling's files to its modules (conversion_mapping.py), in its order; the
# forget gate's move under forget_gate., the short convs' stacking and the experts' fusing it also does are
# not made: stepper reads those as stored, by the names Kimi Linear's files give them too
RENAMES = ((r"^model\.word_embeddings\.", "model.embed_tokens."), (r"\.attention\.", ".self_attn."),
           (r"\.self_attn\.dense\.", ".self_attn.o_proj."),
           (r"\.mlp\.gate\.expert_bias$", ".mlp.gate.e_score_correction_bias"))
WRITE_RENAMES = ((r"^model\.embed_tokens\.", "model.word_embeddings."), (r"\.self_attn\.o_proj\.", ".attention.dense."),
                 (r"\.self_attn\.", ".attention."), (r"\.mlp\.gate\.e_score_correction_bias$", ".mlp.gate.expert_bias"))


@dataclass(frozen=True)
class BailingHybridConfig(KimiLinearConfig):
    """Kimi Linear's config with Ling 3's rotary MLA and gates; written back as Ling's config.json."""

    rope_theta: float = ROPE_THETA
    rope_scaling: Yarn | None = None
    kda_lower_bound: float | None = -5.0  # the safe forget gate's bound; None: Kimi's softplus gate

    model_type: ClassVar[str] = MODEL_TYPE
    rotary: ClassVar[bool] = True  # the MLA layers rotate (interleaved pairs, MlaVariants.rope_interleave)
    head_gate: ClassVar[bool] = True
    kda_full_gates: ClassVar[bool] = True
    moe_prefix: ClassVar[str] = "mlp."
    expert_names: ClassVar[tuple[str, str, str]] = ("gate_proj", "up_proj", "down_proj")

    @staticmethod
    def read_name(stored: str) -> str:
        """A tensor's name in Ling's files (`model.layers.3.attention.dense.weight`) -> its transformers
        module's (`model.layers.3.self_attn.o_proj.weight`), as transformers renames it."""
        return renamed(stored, RENAMES)

    @staticmethod
    def write_name(name: str) -> str:
        """read_name's inverse: the name Ling's files give a tensor stepper reads by its module's name
        (what `stepper synth` writes)."""
        return renamed(name, WRITE_RENAMES)

    @classmethod
    def from_hf(cls, raw: dict[str, Any], source: str = "config.json") -> BailingHybridConfig:
        return parse(raw, source)

    def to_hf(self) -> dict[str, Any]:
        return published(self)


def parse(raw: dict[str, Any], source: str) -> BailingHybridConfig:
    """Ling's config.json (BailingHybridConfig's fields, or the other names transformers takes for
    them) -> BailingHybridConfig; anything stepper cannot run is one line naming the file and the field."""
    raw, spelled = canonical_names(raw, source)
    f = Fields(raw, source, spelled)
    refuse_unbuilt(f, raw)
    heads, layers, vocab = (f.int("num_attention_heads", default=32), f.int("num_hidden_layers", default=42),
                            f.int("vocab_size", default=157184))
    if f.int("num_key_value_heads", default=heads) != heads:
        raise f.fail("num_key_value_heads", f"must equal num_attention_heads ({heads}) in MLA, got "
                     f"{said(raw['num_key_value_heads'])}")
    given = raw.get("rope_theta")
    theta, yarn = rope_settings(Fields({**raw, "rope_theta": ROPE_THETA if given is None else given}, source))
    yarn = mla_fields.transformers_yarn(f, yarn)
    first = dense_prefix(f, raw, layers)
    kda, full = layer_kinds(f, raw, layers)
    cfg = BailingHybridConfig(
        name=model_name(raw, source), vocab_size=vocab, hidden_size=f.int("hidden_size", default=2560),
        intermediate_size=f.int("intermediate_size", default=6144),
        moe_intermediate_size=f.int("moe_intermediate_size", default=768), num_hidden_layers=layers,
        num_attention_heads=heads, kv_lora_rank=f.int("kv_lora_rank", default=512),
        qk_nope_head_dim=f.int("qk_nope_head_dim", default=128),
        qk_rope_head_dim=f.int("qk_rope_head_dim", default=64), v_head_dim=f.int("v_head_dim", default=128),
        n_routed_experts=f.int("num_experts", default=512),
        n_shared_experts=f.int("num_shared_experts", default=1, minimum=0),
        num_experts_per_tok=f.int("num_experts_per_token", default=8), n_group=f.int("num_expert_group", default=8),
        topk_group=f.int("topk_group", default=4), routed_scaling_factor=f.float("routed_scaling_factor", default=2.5),
        norm_topk_prob=f.bool("moe_renormalize", default=True), first_k_dense_replace=first,
        rms_norm_eps=f.float("rms_norm_eps", default=1e-6, below=EPS_BELOW),
        max_position_embeddings=f.int("model_max_length", default=262144),
        # transformers sets these from num_attention_heads, head_dim and short_conv_kernel_size, and
        # a config it saved gives them as its own fields (its head_dim is then qk_rope_head_dim)
        linear_num_heads=f.int("linear_num_heads", default=heads),
        linear_head_dim=f.int("linear_head_dim", default=f.int("head_dim", default=128)),
        short_conv_kernel_size=f.int("linear_conv_kernel_dim", default=f.int("short_conv_kernel_size", default=4)),
        kda_layers=kda, full_attn_layers=full, rope_theta=theta, rope_scaling=yarn,
        kda_lower_bound=lower_bound(f) if f.bool("kda_safe_gate", default=True) else None,
        **{field: token_ids(f, field, vocab) for field in TOKEN_ID_FIELDS},
    )
    check_experts(cfg, f)
    return cfg


def refuse_unbuilt(f: Fields, raw: dict[str, Any]) -> None:
    """One line naming the field for what stepper does not run as transformers does."""
    if f.str("model_type") != MODEL_TYPE:
        raise f.fail("model_type", f"must be {MODEL_TYPE!r} here, got {said(raw['model_type'])}")
    f.equal("hidden_act", "silu", "the only kind stepper runs")
    f.bool("tie_word_embeddings", default=False)  # either way lm_head is a matrix of its own (transformers ties none)
    if f.bool("attention_bias", default=False):
        raise f.fail("attention_bias", "must be false: stepper builds Ling's projections without a bias")
    if raw.get("q_lora_rank") is not None:
        raise f.fail("q_lora_rank", f"must be null: stepper builds Ling's MLA with one q_proj, got "
                     f"{said(raw['q_lora_rank'])}")
    if f.int("qk_rope_head_dim", default=64) % 2:
        raise f.fail("qk_rope_head_dim", f"must be even (rotary dims come in pairs), got {raw['qk_rope_head_dim']}")
    mla_fields.refuse_present(f, raw, ("quantization_config",), "stepper reads Ling's weights in BF16 or float32")


def canonical_names(raw: dict[str, Any], source: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The config.json with each field given under another name transformers takes (its
    attribute_map: `num_experts_per_tok` for `num_experts_per_token`) under its own, and those
    names, for messages (Fields' `spelled`). Both names given, with different values, is refused:
    which one transformers keeps depends on their order in the file."""
    raw, spelled = dict(raw), {}
    for alias, field in ALIASES.items():
        if alias not in raw:
            continue
        if field in raw and raw[field] != raw[alias]:
            raise Fields(raw, source).fail(alias, f"({said(raw[alias])}) and '{field}' ({said(raw[field])}) are one "
                                                  f"field of transformers' under two names; give one")
        raw[field], spelled[field] = raw.pop(alias), alias
    return raw, spelled


def lower_bound(f: Fields) -> float:
    """The safe forget gate's bound: at most 0, since g = bound * sigmoid(...) is the log of what each
    step keeps of the state (a bound above 0 would make the state grow at every token)."""
    bound = f.float("kda_lower_bound", default=-5.0, positive=False)
    if bound > 0:
        raise f.fail("kda_lower_bound", f"must be <= 0 (the forget gate's log decay lies between it and 0), "
                     f"got {bound:g}")
    return bound


def dense_prefix(f: Fields, raw: dict[str, Any], layers: int) -> int:
    """How many layers before the first MoE one: `mlp_layer_types` (dense layers, then sparse ones
    only) or `first_k_dense_replace` (2 by default)."""
    if raw.get("mlp_layer_types") is None:
        return f.int("first_k_dense_replace", default=2, minimum=0)
    types = raw["mlp_layer_types"]
    first = types.index("sparse") if isinstance(types, list) and "sparse" in types else layers
    if not isinstance(types, list) or types != ["dense"] * first + ["sparse"] * (layers - first):
        raise f.fail("mlp_layer_types", f"must be 'dense' for some first layers, then 'sparse' for the rest of the "
                     f"{layers}, got {said(types)}")
    return first


def layer_kinds(f: Fields, raw: dict[str, Any], layers: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The KDA layers and the MLA layers (0-based): `layer_types` ('linear_attention' or
    'full_attention' per layer) or, without it, MLA every `layer_group_size`-th layer (6th)."""
    kinds = raw.get("layer_types")
    if kinds is None:
        group = f.int("layer_group_size", default=6)
        kinds = [FULL if (i + 1) % group == 0 else LINEAR for i in range(layers)]
    elif not isinstance(kinds, list) or len(kinds) != layers or not set(kinds) <= {FULL, LINEAR}:
        raise f.fail("layer_types", f"must list '{LINEAR}' or '{FULL}' for each of the {layers} layers, "
                     f"got {said(kinds)}")
    return (tuple(i for i, kind in enumerate(kinds) if kind == LINEAR),
            tuple(i for i, kind in enumerate(kinds) if kind == FULL))


def published(cfg: BailingHybridConfig) -> dict[str, Any]:
    """The config.json of a Ling checkpoint of this config (BailingHybridConfig's fields)."""
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling is not None:
        rope = {**rope, "rope_type": "yarn", **yarn_fields(cfg.rope_scaling)}
    layers = range(cfg.num_hidden_layers)
    return {
        "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "moe_intermediate_size": cfg.moe_intermediate_size, "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_attention_heads,
        "q_lora_rank": None, "kv_lora_rank": cfg.kv_lora_rank, "qk_nope_head_dim": cfg.qk_nope_head_dim,
        "qk_rope_head_dim": cfg.qk_rope_head_dim, "v_head_dim": cfg.v_head_dim,
        # as transformers' save_pretrained writes them: head_dim is qk_rope_head_dim once its config is made
        "head_dim": cfg.qk_rope_head_dim, "linear_head_dim": cfg.linear_head_dim,
        "linear_num_heads": cfg.linear_num_heads, "linear_conv_kernel_dim": cfg.short_conv_kernel_size,
        "num_experts": cfg.n_routed_experts, "num_shared_experts": cfg.n_shared_experts,
        "num_experts_per_token": cfg.num_experts_per_tok, "num_expert_group": cfg.n_group,
        "topk_group": cfg.topk_group, "routed_scaling_factor": cfg.routed_scaling_factor,
        "moe_renormalize": cfg.norm_topk_prob, "first_k_dense_replace": cfg.first_k_dense_replace,
        "mlp_layer_types": ["sparse" if cfg.is_moe_layer(i) else "dense" for i in layers],
        "layer_types": [LINEAR if cfg.is_kda_layer(i) else FULL for i in layers],
        "rms_norm_eps": cfg.rms_norm_eps, "model_max_length": cfg.max_position_embeddings, "hidden_act": "silu",
        "tie_word_embeddings": False, "attention_bias": False, "rope_parameters": rope,
        "short_conv_kernel_size": cfg.short_conv_kernel_size, "kda_safe_gate": cfg.kda_lower_bound is not None,
        "kda_lower_bound": -5.0 if cfg.kda_lower_bound is None else cfg.kda_lower_bound,
        **written_token_ids(cfg),
    }


# -- the family ------------------------------------------------------------------------------------


PARTS = ("model", "residual", "kda", "mla_attention", "mlp", "router", "router_sigmoid", "router_noaux_tc",
         "router_groups", "moe", "output_gate", "head_gate")

FAMILY = Family(
    name=MODEL_TYPE,
    model_types=(MODEL_TYPE,),
    read_config=parse,
    decoder_layer=hybrid_layer,
    parts=part_files(PARTS),
    miniature=kimi_linear.miniature,  # its layer's branches, with Ling's gates and rotation
    no_seeded_cache=kimi_linear.no_seeded_state,
    runtime_sizes=kimi_linear.runtime_sizes,
    chunk_multiple=kda_chunked.CHUNK,  # as Kimi Linear's: the states after each chunk follow on across prefill chunks
)
