"""Kimi Linear (`model_type: kimi_linear`, Kimi-Linear-48B-A3B): most layers' attention is Kimi
Delta Attention (stepper.model.kda, a fixed-size state per head), the others MLA without RoPE
(stepper.model.attention; the config's `rotary = False`: no rotary tables, nothing rotated); the
FFN is a dense SwiGLU in the first `first_k_dense_replace` layers and a MoE with Kimi's router
(sigmoid scores, a bias to choose by, renormalised, times routed_scaling_factor) after. The
decoder layer is stepper.model.kimi_linear_layer.

This module is the family: its config (read from the published config.json, refused one line
naming the field), the tensors of its published checkpoint layout, what a layer keeps in memory,
a miniature of a layer for the derivation, and the family record.

On disk (published): `model.layers.N.self_attn.{q,k,v}_proj`, `{q,k,v}_conv1d.weight` [H*K, 1, W],
`A_log` [1, 1, H, 1], `dt_bias` [H*K], `f_a_proj`, `f_b_proj`, `b_proj`, `g_a_proj`, `g_b_proj`,
`o_norm`, `o_proj` in KDA layers; MLA's `q_proj` (no q_lora), `kv_a_proj_with_mqa`,
`kv_a_layernorm`, `kv_b_proj`, `o_proj`; `block_sparse_moe.{gate, experts.E.w1/w2/w3,
shared_experts}` (w1 gate, w3 up, w2 down); the dense layers' `mlp.{gate,up,down}_proj` (in a
checkpoint transformers' save_pretrained writes, `block_sparse_moe.{gate,up,down}_proj`: dense_mlp).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

from stepper.config import (
    EPS_BELOW,
    TOKEN_ID_FIELDS,
    Fields,
    MlaVariants,
    check_router,
    model_name,
    token_ids,
    written_token_ids,
)
from stepper.errors import StepperError
from stepper.families.deepseek import part_files
from stepper.families.family import Family
from stepper.families.kimi_linear_checkpoint import open_checkpoint
from stepper.kernels import kda_chunked
from stepper.model.kimi_linear_layer import decoder_layer
from stepper.sizes import gib
from stepper.untrusted import said

MODEL_TYPE = "kimi_linear"
ARCHITECTURE = "KimiLinearForCausalLM"


@dataclass(frozen=True)
class KimiLinearConfig(MlaVariants):
    """Kimi Linear's hyper-parameters under the names the MLA and MoE parts read (DeepSeek's), with
    KDA's own; `from_hf` maps the published config.json's names onto them."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    n_group: int
    topk_group: int
    routed_scaling_factor: float
    norm_topk_prob: bool
    first_k_dense_replace: int
    rms_norm_eps: float
    max_position_embeddings: int
    linear_num_heads: int  # KDA heads H
    linear_head_dim: int  # KDA key and value dims per head K = V
    short_conv_kernel_size: int  # the short convs' taps W
    kda_layers: tuple[int, ...]  # 0-based (config.json lists them 1-based)
    full_attn_layers: tuple[int, ...]  # 0-based: MLA without RoPE
    # the special tokens' ids, read to be written back (a checkpoint synth writes): the model uses none, but
    # transformers' embedding takes pad_token_id as its padding row, and its defaults are the published model's
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    # where the dense layers' MLP is stored: `mlp.` as published, `block_sparse_moe.` as transformers'
    # save_pretrained writes it (its conversion renames every block_sparse_moe. to mlp. on load, and back
    # on save); said by the checkpoint's own names (kimi_linear_checkpoint), never by config.json
    dense_mlp: str = "mlp."

    model_type: ClassVar[str] = MODEL_TYPE
    q_lora_rank: ClassVar[None] = None  # Kimi Linear's MLA projects its queries directly (q_proj)
    scoring_func: ClassVar[str] = "sigmoid"
    topk_method: ClassVar[str] = "noaux_tc"
    moe_layer_freq: ClassVar[int] = 1  # every layer from first_k_dense_replace on is MoE (from_hf refuses another)
    has_indexer: ClassVar[bool] = False
    quantization: ClassVar[None] = None
    int4: ClassVar[None] = None
    wrapper: ClassVar[None] = None
    rotary: ClassVar[bool] = False  # no layer rotates: the model makes no rotary tables (model.transformer)
    rope_theta: ClassVar[float] = 10000.0  # the published value, unused
    rope_scaling: ClassVar[None] = None
    moe_prefix: ClassVar[str] = "block_sparse_moe."  # the published MoE's tensors (read by kimi_linear_layer.on_disk)
    expert_names: ClassVar[tuple[str, str, str]] = ("w1", "w3", "w2")  # an expert's gate, up and down projections

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def is_kda_layer(self, layer: int) -> bool:
        return layer in self.kda_layers

    def is_moe_layer(self, layer: int) -> bool:
        """The published rule (and transformers'): dense before first_k_dense_replace, MoE after."""
        return self.n_routed_experts > 0 and layer >= self.first_k_dense_replace

    def layer_label(self, layer: int) -> str:
        """The layer's attention and MLP, which set its tensors apart (stepper tree, the run's headings)."""
        return f"{'KDA' if self.is_kda_layer(layer) else 'MLA'}, {'MoE' if self.is_moe_layer(layer) else 'dense'}"

    def memory_line(self, positions: int) -> str:
        """The run header's line on what the layers keep (module function memory_line)."""
        return memory_line(self, positions)

    def layer_shapes(self, layer: int) -> dict[str, tuple[int, ...]]:
        """Every tensor of one layer by its published name (module function layer_shapes)."""
        return layer_shapes(self, layer)

    @classmethod
    def from_hf(cls, raw: dict[str, Any], source: str = "config.json") -> KimiLinearConfig:
        return parse(raw, source)

    def to_hf(self) -> dict[str, Any]:
        """The published config.json's fields for this model."""
        return {
            "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "moe_intermediate_size": self.moe_intermediate_size, "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_attention_heads,
            "q_lora_rank": None, "kv_lora_rank": self.kv_lora_rank, "qk_nope_head_dim": self.qk_nope_head_dim,
            "qk_rope_head_dim": self.qk_rope_head_dim, "v_head_dim": self.v_head_dim, "mla_use_nope": True,
            "num_experts": self.n_routed_experts, "num_shared_experts": self.n_shared_experts,
            "num_experts_per_token": self.num_experts_per_tok, "num_expert_group": self.n_group,
            "topk_group": self.topk_group, "routed_scaling_factor": self.routed_scaling_factor,
            "moe_renormalize": self.norm_topk_prob, "moe_router_activation_func": "sigmoid",
            "first_k_dense_replace": self.first_k_dense_replace, "moe_layer_freq": 1,
            "rms_norm_eps": self.rms_norm_eps, "model_max_length": self.max_position_embeddings,
            "hidden_act": "silu", "tie_word_embeddings": False,
            "linear_attn_config": {
                "kda_layers": [i + 1 for i in self.kda_layers],
                "full_attn_layers": [i + 1 for i in self.full_attn_layers],
                "num_heads": self.linear_num_heads, "head_dim": self.linear_head_dim,
                "short_conv_kernel_size": self.short_conv_kernel_size,
            },
            **written_token_ids(self),
        }


def parse(raw: dict[str, Any], source: str) -> KimiLinearConfig:
    """The published config.json -> KimiLinearConfig; anything stepper cannot run is one line
    naming the file and the field."""
    f = Fields(raw, source)
    if f.str("model_type") != MODEL_TYPE:
        raise f.fail("model_type", f"must be {MODEL_TYPE!r} here, got {said(raw['model_type'])}")
    for field, only in (("hidden_act", "silu"), ("moe_router_activation_func", "sigmoid")):
        if raw.get(field, only) != only:
            raise f.fail(field, f"must be {only!r} (the only kind stepper runs), got {said(raw[field])}")
    if raw.get("mla_use_nope") is False:
        raise f.fail("mla_use_nope", "must be true: Kimi Linear's MLA layers have no RoPE")
    if f.bool("tie_word_embeddings", default=False):
        raise f.fail("tie_word_embeddings", "must be false: stepper reads lm_head.weight as its own matrix")
    if f.int("moe_layer_freq", default=1) != 1:
        raise f.fail("moe_layer_freq", f"must be 1 (every layer from first_k_dense_replace on is MoE), "
                     f"got {said(raw['moe_layer_freq'])}")
    heads = f.int("num_attention_heads")
    if f.int("num_key_value_heads", default=heads) != heads:
        raise f.fail("num_key_value_heads", f"must equal num_attention_heads ({heads}) in MLA, got "
                     f"{said(raw['num_key_value_heads'])}")
    if raw.get("q_lora_rank") is not None:
        raise f.fail("q_lora_rank", f"must be null: Kimi Linear's MLA has one q_proj, got {said(raw['q_lora_rank'])}")
    layers, vocab = f.int("num_hidden_layers"), f.int("vocab_size")
    linear = raw.get("linear_attn_config")
    if not isinstance(linear, dict):
        raise f.fail("linear_attn_config", f"must be an object (kda_layers, full_attn_layers, num_heads, head_dim, "
                     f"short_conv_kernel_size), got {said(linear)}")
    inner = LinearAttnFields(linear, source)
    kda, full = layer_kinds(linear, layers, f)
    cfg = KimiLinearConfig(
        name=model_name(raw, source),
        vocab_size=vocab,
        hidden_size=f.int("hidden_size"),
        intermediate_size=f.int("intermediate_size"),
        moe_intermediate_size=f.int("moe_intermediate_size"),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        kv_lora_rank=f.int("kv_lora_rank"),
        qk_nope_head_dim=f.int("qk_nope_head_dim"),
        qk_rope_head_dim=f.int("qk_rope_head_dim", minimum=0),
        v_head_dim=f.int("v_head_dim"),
        n_routed_experts=f.int("num_experts", default=0, minimum=0),
        n_shared_experts=f.int("num_shared_experts", default=0, minimum=0),
        num_experts_per_tok=f.int("num_experts_per_token", default=1),
        n_group=f.int("num_expert_group", default=1),
        topk_group=f.int("topk_group", default=1),
        routed_scaling_factor=f.float("routed_scaling_factor", default=1.0),
        norm_topk_prob=f.bool("moe_renormalize", default=True),
        first_k_dense_replace=f.int("first_k_dense_replace", default=1, minimum=0),
        rms_norm_eps=f.float("rms_norm_eps", default=1e-5, below=EPS_BELOW),
        max_position_embeddings=f.int("model_max_length", default=1048576),
        linear_num_heads=inner.int("num_heads"),
        linear_head_dim=inner.int("head_dim"),
        short_conv_kernel_size=inner.int("short_conv_kernel_size"),
        kda_layers=kda,
        full_attn_layers=full,
        **{field: token_ids(f, field, vocab) for field in TOKEN_ID_FIELDS},
    )
    check_experts(cfg, f)
    return cfg


class LinearAttnFields(Fields):
    """linear_attn_config's own fields, named with it in messages."""

    def fail(self, field: str, why: str) -> StepperError:
        return super().fail(f"linear_attn_config.{field}", why)


def layer_kinds(linear: dict[str, Any], layers: int, f: Fields) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """linear_attn_config's kda_layers and full_attn_layers (1-based) -> 0-based tuples: every
    layer 1..num_hidden_layers in exactly one of them."""
    lists = {}
    for field in ("kda_layers", "full_attn_layers"):
        value = linear.get(field)
        if not isinstance(value, list) or not all(isinstance(n, int) and not isinstance(n, bool) for n in value):
            raise f.fail(f"linear_attn_config.{field}", f"must be a list of 1-based layer numbers, got {said(value)}")
        outside = [n for n in value if not 1 <= n <= layers]
        if outside:
            raise f.fail(f"linear_attn_config.{field}", f"lists layer {outside[0]}, outside 1..{layers} "
                         f"(1-based, num_hidden_layers {layers})")
        lists[field] = value
    kda, full = lists["kda_layers"], lists["full_attn_layers"]
    twice = sorted(set(kda) & set(full)) or sorted(n for n in set(kda + full) if (kda + full).count(n) > 1)
    if twice:
        raise f.fail("linear_attn_config", f"lists layer {twice[0]} twice (kda_layers, full_attn_layers); "
                     f"each layer 1..{layers} must be in exactly one")
    missing = sorted(set(range(1, layers + 1)) - set(kda) - set(full))
    if missing:
        raise f.fail("linear_attn_config", f"leaves layer {missing[0]} out of kda_layers and full_attn_layers; "
                     f"each layer 1..{layers} must be in exactly one")
    return tuple(sorted(n - 1 for n in kda)), tuple(sorted(n - 1 for n in full))


ROUTER_FIELDS = {"n_routed_experts": "num_experts", "n_group": "num_expert_group",
                 "num_experts_per_tok": "num_experts_per_token"}  # DeepSeek-V3's names -> this config.json's


def check_experts(cfg: KimiLinearConfig, f: Fields) -> None:
    """The router's sizes against each other (config.check_router), named as this config.json names them."""
    spelled = {field: f.spelled.get(name, name) for field, name in ROUTER_FIELDS.items()}  # Ling's aliases too
    check_router(cfg, Fields(f.raw, f.source, {**spelled, **f.spelled}))


# -- the published checkpoint's tensors --------------------------------------------------------

def kda_shapes(cfg: KimiLinearConfig) -> dict[str, tuple[int, ...]]:
    d, H, K, W = cfg.hidden_size, cfg.linear_num_heads, cfg.linear_head_dim, cfg.short_conv_kernel_size
    shapes: dict[str, tuple[int, ...]] = {}
    for name in ("q", "k", "v"):
        shapes[f"self_attn.{name}_proj.weight"] = (H * K, d)
        shapes[f"self_attn.{name}_conv1d.weight"] = (H * K, 1, W)
    a_log = (H,) if cfg.kda_full_gates else (1, 1, H, 1)  # Ling 3's files, Kimi Linear's
    return {**shapes, "self_attn.A_log": a_log, "self_attn.dt_bias": (H * K,), **gate_shapes(cfg, "f"),
            "self_attn.b_proj.weight": (H, d), **gate_shapes(cfg, "g"), "self_attn.o_norm.weight": (K,),
            "self_attn.o_proj.weight": (d, H * K)}


def gate_shapes(cfg: KimiLinearConfig, gate: str) -> dict[str, tuple[int, ...]]:
    """The forget ("f") or output ("g") gate's weights: Kimi Linear's rank-K pair, or (kda_full_gates,
    Ling 3's) one matrix (model.kda.gate_projection)."""
    d, HK, K = cfg.hidden_size, cfg.linear_num_heads * cfg.linear_head_dim, cfg.linear_head_dim
    if cfg.kda_full_gates:
        return {f"self_attn.{gate}_proj.weight": (HK, d)}
    return {f"self_attn.{gate}_a_proj.weight": (K, d), f"self_attn.{gate}_b_proj.weight": (HK, K)}


def mla_shapes(cfg: KimiLinearConfig) -> dict[str, tuple[int, ...]]:
    d, h = cfg.hidden_size, cfg.num_attention_heads
    gate = {"self_attn.g_proj.weight": (h, d)} if cfg.head_gate else {}  # Ling 3's gate per head
    return {
        "self_attn.q_proj.weight": (h * cfg.qk_head_dim, d),
        "self_attn.kv_a_proj_with_mqa.weight": (cfg.kv_lora_rank + cfg.qk_rope_head_dim, d),
        "self_attn.kv_a_layernorm.weight": (cfg.kv_lora_rank,),
        "self_attn.kv_b_proj.weight": (h * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank),
        "self_attn.o_proj.weight": (d, h * cfg.v_head_dim),
        **gate,
    }


def ffn_shapes(cfg: KimiLinearConfig, layer: int) -> dict[str, tuple[int, ...]]:
    """The dense MLP's (under dense_mlp) or the MoE's tensors (under moe_prefix, each expert's
    projections named expert_names), as the files name them."""
    d, moe = cfg.hidden_size, cfg.moe_prefix

    def swiglu(prefix: str, inter: int, names=("gate_proj", "up_proj", "down_proj")) -> dict[str, tuple[int, ...]]:
        gate, up, down = names
        return {f"{prefix}{gate}.weight": (inter, d), f"{prefix}{up}.weight": (inter, d),
                f"{prefix}{down}.weight": (d, inter)}

    if not cfg.is_moe_layer(layer):
        return swiglu(cfg.dense_mlp, cfg.intermediate_size)
    shapes = {f"{moe}gate.weight": (cfg.n_routed_experts, d),
              f"{moe}gate.e_score_correction_bias": (cfg.n_routed_experts,)}
    for e in range(cfg.n_routed_experts):
        shapes.update(swiglu(f"{moe}experts.{e}.", cfg.moe_intermediate_size, cfg.expert_names))
    if cfg.n_shared_experts:
        shapes.update(swiglu(f"{moe}shared_experts.", cfg.moe_intermediate_size * cfg.n_shared_experts))
    return shapes


def layer_shapes(cfg: KimiLinearConfig, layer: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of one decoder layer, by its published name, with its shape."""
    d = cfg.hidden_size
    attention = kda_shapes(cfg) if cfg.is_kda_layer(layer) else mla_shapes(cfg)
    shapes = {"input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,), **attention,
              **ffn_shapes(cfg, layer)}
    return {f"model.layers.{layer}.{k}": v for k, v in shapes.items()}


# -- the memory a layer keeps --------------------------------------------------------------------


def kda_layer_bytes(cfg: KimiLinearConfig, itemsize: int = 4) -> int:
    """What one KDA layer keeps between steps, whatever the length: S [H, K, V] and the three short
    convs' last W - 1 inputs [W-1, H*K]."""
    H, K, W = cfg.linear_num_heads, cfg.linear_head_dim, cfg.short_conv_kernel_size
    return (H * K * K + 3 * (W - 1) * H * K) * itemsize


def mla_bytes_per_position(cfg: KimiLinearConfig, attn: str = "absorb", itemsize: int = 4) -> int:
    """What one MLA layer keeps per position: the latent and the unrotated key (absorb), or every
    head's key and value (naive)."""
    if attn == "naive":
        return cfg.num_attention_heads * (cfg.qk_head_dim + cfg.v_head_dim) * itemsize
    return (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * itemsize


def memory_line(cfg: KimiLinearConfig, positions: int) -> str:
    """The run header's line on memory: KDA's fixed state beside MLA's growing latent."""
    kda, mla = kda_layer_bytes(cfg), mla_bytes_per_position(cfg)
    kda_total, mla_total = len(cfg.kda_layers) * kda, len(cfg.full_attn_layers) * mla * positions
    return (f"KDA layers keep {kda:,} B each at any length (state {cfg.linear_num_heads}x{cfg.linear_head_dim}"
            f"x{cfg.linear_head_dim} + conv inputs: 0 B per position), "
            f"MLA layers {mla:,} B per position (latent + key) · "
            f"at {positions:,} positions: {layers(len(cfg.kda_layers), 'KDA')} {gib(kda_total)}, "
            f"{layers(len(cfg.full_attn_layers), 'MLA')} {gib(mla_total)}")


def layers(n: int, kind: str) -> str:
    """'1 MLA layer', '3 KDA layers'."""
    return f"{n} {kind} layer" + ("" if n == 1 else "s")


# -- the family ----------------------------------------------------------------------------------


def miniature(cfg: KimiLinearConfig, layer: int) -> KimiLinearConfig:
    """A one-layer config of tiny sizes whose layer 0 takes the branches `layer` of cfg takes: KDA
    or MLA, MoE (with the router's groups and shared experts) or dense."""
    moe, kda = cfg.is_moe_layer(layer), cfg.is_kda_layer(layer)
    return dataclasses.replace(
        cfg, name=f"miniature of {cfg.name}", vocab_size=16, hidden_size=16, intermediate_size=8,
        moe_intermediate_size=4, num_hidden_layers=1, num_attention_heads=2, kv_lora_rank=8, qk_nope_head_dim=4,
        qk_rope_head_dim=4, v_head_dim=4, n_routed_experts=2 * cfg.n_group if moe else 0,
        n_shared_experts=min(cfg.n_shared_experts, 1), num_experts_per_tok=min(cfg.num_experts_per_tok, 2),
        first_k_dense_replace=0, linear_num_heads=2, linear_head_dim=4,
        kda_layers=(0,) if kda else (), full_attn_layers=() if kda else (0,),
        **dict.fromkeys(TOKEN_ID_FIELDS),  # the model's ids may lie outside the miniature's vocabulary
    )


PARTS = ("model", "residual", "kda", "mla_attention", "mlp", "router", "router_sigmoid", "router_noaux_tc",
         "router_groups", "moe")


def no_seeded_state(cfg: KimiLinearConfig, layer: int) -> str:
    """Why a lone layer's cache_len cannot fill this layer: a KDA layer keeps a state, not positions."""
    if not cfg.is_kda_layer(layer):
        return ""
    mla = ", ".join(map(str, cfg.full_attn_layers))
    instead = f", or give an MLA layer ({mla}) its cache" if mla else ""
    return (f"is a delta-attention (KDA) layer, whose state holds no positions to fill; run it on a prompt "
            f"and its decode steps{instead}")


def runtime_sizes(cfg: Any, layer: int | None, t: int, s: int) -> dict[str, int]:
    """The delta rule's chunks in a step of t positions (the last may be shorter: model.kda.chunk_ends)."""
    return {"chunks": -(-t // kda_chunked.CHUNK)}


FAMILY = Family(
    name="kimi_linear",
    model_types=(MODEL_TYPE,),
    read_config=parse,
    decoder_layer=decoder_layer,
    parts=part_files(PARTS),
    miniature=miniature,
    no_seeded_cache=no_seeded_state,
    runtime_sizes=runtime_sizes,
    checkpoint=partial(open_checkpoint, read=parse),
    chunk_multiple=kda_chunked.CHUNK,  # each prefill chunk ends where a chunk of the delta rule does: the states
    # after those (self_attn.state_per_chunk) follow each other as the whole prompt's
)
