"""DeepSeek-V4's hyper-parameters (V4-Flash, V4-Pro): a frozen config read from the PUBLISHED
config.json, each field refused on its own line naming the file, the field and what was expected.

The published file names things as DeepSeek's own code does (`compress_ratios`, `num_hash_layers`,
`qk_rope_head_dim`, `rope_scaling`); transformers folds them into `layer_types`, `mlp_layer_types`,
`partial_rotary_factor` and a nested `rope_parameters` (configuration_deepseek_v4.py,
`__post_init__`), and a config.json transformers saved has only those: it is read as the published one
(stepper.weights.deepseek_v4_saved.published_fields), each message naming the field as the file
spells it. This class keeps the published names, so a reader of the file finds every value under
the name they know, and says what each layer is:

- `compress_ratios` has one entry per layer plus one per multi-token-prediction block
  (`num_nextn_predict_layers`, the `mtp.*` tensors, which a run does not use): 0 a sliding-window
  layer, 4 compressed sparse attention (CSA, with the Lightning Indexer), 128 heavily compressed
  attention (HCA).
- the first `num_hash_layers` layers choose their experts by `tid2eid[token_id]`; the others by
  the top-k of sqrt(softplus(logits)) + bias.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from stepper.config import (
    EPS_BELOW,
    MAX_SIZE,
    Fields,
    Yarn,
    checked_yarn,
    model_name,
    rope_base,
    rope_kind,
)
from stepper.errors import StepperError
from stepper.model.compressed_attention import AttentionDims
from stepper.model.v4_attention_cache import bounded_values, mla_values_per_position, values_per_position
from stepper.untrusted import said
from stepper.untrusted.jsonfile import read_json
from stepper.weights.deepseek_v4_saved import published_fields

MODEL_TYPE = "deepseek_v4"
ARCHITECTURE = "DeepseekV4ForCausalLM"
SLIDING, CSA = 0, 4  # compress ratios: sliding window only, CSA; any other is HCA (128 published)
MAX_HC_MULT = 16  # streams: V4 ships 4; more would make the comb matrix's Sinkhorn rounds the cost
MAX_SINKHORN_ITERS = 1000  # V4 ships 20: a run's every hyper-connection does this many rounds


@dataclass(frozen=True)
class V4Fp8:
    """The published quantization_config: FP8 e4m3 weights, one E8M0 (power of two) scale per block,
    stored beside the weight as `<name>.scale`."""

    weight_block_size: tuple[int, int] = (128, 128)
    fmt: ClassVar[str] = "e4m3"  # what parse accepts alone, stated as MLA's Fp8 holds it
    per_tensor: ClassVar[bool] = False  # a scale per block

    def to_hf(self) -> dict[str, Any]:
        return {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": self.fmt, "scale_fmt": "ue8m0",
                "weight_block_size": list(self.weight_block_size)}


@dataclass(frozen=True)
class V4Config:
    name: str
    vocab_size: int
    hidden_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    head_dim: int
    q_lora_rank: int
    qk_rope_head_dim: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    routed_scaling_factor: float
    rms_norm_eps: float
    rope_theta: float
    compress_rope_theta: float
    rope_scaling: Yarn | None  # YaRN of the compressed layers (sliding layers: plain RoPE)
    max_position_embeddings: int
    sliding_window: int
    o_groups: int
    o_lora_rank: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    num_hash_layers: int
    swiglu_limit: float
    compress_ratios: tuple[int, ...]  # one per layer, then one per MTP block
    num_nextn_predict_layers: int
    quantization: V4Fp8 | None
    expert_dtype: str | None  # "fp4": routed experts e2m1 (absent in the checkpoint's first revision)
    model_type: str = MODEL_TYPE
    scoring_func: str = "sqrtsoftplus"
    tie_word_embeddings: bool = False  # V4 keeps head.weight apart from embed.weight (a tied config is refused)
    # the router's settings V4 fixes (parse refuses other values), stated as the MLA configs hold them
    topk_method: ClassVar[str] = "noaux_tc"  # the top k of scores plus a learned bias
    router_bias: ClassVar[bool] = True
    norm_topk_prob: ClassVar[bool] = True
    n_group: ClassVar[int] = 1
    topk_group: ClassVar[int] = 1

    def compress_ratio(self, layer: int) -> int:
        """0 (sliding window only), 4 (CSA) or 128 (HCA)."""
        return self.compress_ratios[layer]

    def layer_kind(self, layer: int) -> str:
        """"sliding", "csa" (ratio 4: overlapping windows and the indexer) or "hca" (any other
        ratio, as DeepSeek's code takes it; the published checkpoints use 128)."""
        ratio = self.compress_ratio(layer)
        return "sliding" if ratio == SLIDING else "csa" if ratio == CSA else "hca"

    def layer_sizes(self, layer: int) -> dict[str, int]:
        """The catalogue's dims whose size the layer's compress ratio sets (runtime for the model as
        a whole): m, a window's slots and the compressor's channels, CSA's doubled by its overlap."""
        ratio = self.compress_ratio(layer)
        if ratio == SLIDING:
            return {}
        doubled = 2 if self.layer_kind(layer) == "csa" else 1
        return {"m": ratio, "slots": doubled * ratio, "c": doubled * self.head_dim}

    def axis_notes(self, layer: int | None) -> dict[str, str]:
        """What sets those sizes, for their axes' labels: CSA's 8 window slots are 2m at m = 4, an
        HCA layer's m; None: every compressed layer's, each kind's named (`stepper explain` of no layer)."""
        if layer is None:
            firsts = {self.compress_ratio(i): i for i in reversed(range(self.num_hidden_layers))}  # one of each ratio
            notes = [(self.axis_notes(i), self.layer_kind(i).upper()) for ratio, i in sorted(firsts.items())
                     if ratio != SLIDING]
            if len(notes) <= 1:
                return notes[0][0] if notes else {}
            return {symbol: "; ".join(f"{own[symbol]} in {kind} layers" for own, kind in notes)
                    for symbol in notes[0][0]}
        ratio = self.compress_ratio(layer)
        if ratio == SLIDING:
            return {}
        if self.layer_kind(layer) == "csa":  # its windows overlap: the previous window's slots too
            return {"slots": f"2m, m = {ratio}", "c": f"2 x {self.head_dim} entry dims, m = {ratio}"}
        return {"slots": f"m = {ratio}", "c": f"{self.head_dim} entry dims, m = {ratio}"}

    def is_hash_layer(self, layer: int) -> bool:
        """Whether the layer takes its experts from tid2eid[token_id] rather than from its scores."""
        return layer < self.num_hash_layers

    def dims(self, layer: int) -> AttentionDims:
        """What layer `layer`'s attention needs (stepper.model.compressed_attention's contract):
        sliding layers turn by rope_theta, the compressed ones (their compressor and indexer too) by
        compress_rope_theta with YaRN."""
        ratio = self.compress_ratio(layer)
        return AttentionDims(
            hidden_size=self.hidden_size, num_heads=self.num_attention_heads, head_dim=self.head_dim,
            rope_dim=self.qk_rope_head_dim, q_lora_rank=self.q_lora_rank, o_groups=self.o_groups,
            o_lora_rank=self.o_lora_rank, sliding_window=self.sliding_window, compress_ratio=ratio,
            index_n_heads=self.index_n_heads, index_head_dim=self.index_head_dim, index_topk=self.index_topk,
            eps=self.rms_norm_eps, rope_theta=self.rope_theta if ratio == SLIDING else self.compress_rope_theta,
            yarn=None if ratio == SLIDING else self.rope_scaling,
        )

    def summary(self) -> str:
        """A run header's words for the model: its layer kinds, routing, heads, experts and streams."""
        kinds = [self.layer_kind(i) for i in range(self.num_hidden_layers)]
        count = ", ".join(f"{kinds.count(k)} {k.upper() if k != 'sliding' else k}" for k in ("sliding", "csa", "hca"))
        return (f"{self.num_hidden_layers} layers ({count}; the first {self.num_hash_layers} hash-routed), "
                f"{self.num_attention_heads} heads sharing one key-value head, {self.n_routed_experts} experts "
                f"top-{self.num_experts_per_tok}, {self.hc_mult} residual streams")

    def layer_label(self, layer: int) -> str:
        """The layer's attention kind and routing, which set its tensors apart (stepper tree)."""
        kind = {"sliding": "sliding window", "csa": "CSA: compressed, indexer", "hca": "HCA: heavily compressed"}
        return f"{kind[self.layer_kind(layer)]}, {'hash' if self.is_hash_layer(layer) else 'score'}-routed"

    def cache_line(self, layers: range) -> str:
        """What a position costs the cache of each kind of layer among `layers`, beside V3's MLA."""
        firsts = {self.compress_ratio(i): i for i in reversed(layers)}  # a layer of each ratio
        return "\n".join(cost_line(self.dims(i)) for i in sorted(firsts.values()))

    def layer_shapes(self, layer: int) -> dict[str, tuple[int, ...]]:
        """Every tensor of layer `layer` by its full name (weights.names.layer_shapes asks a config's class)."""
        from stepper.families.deepseek_v4_weights import layer_prefix, layer_shapes  # it reads this class's fields

        return {layer_prefix(layer) + name: shape for name, shape in layer_shapes(self, layer).items()}

    def is_moe_layer(self, layer: int) -> bool:
        return True  # every V4 layer's FFN is a mixture of experts

    @property
    def router_experts(self) -> int:
        """The experts the router scores (the catalogue's E): the routed ones, V4 having no zero experts."""
        return self.n_routed_experts

    @property
    def hc_mixes(self) -> int:
        """pre (hc_mult) + post (hc_mult) + comb (hc_mult x hc_mult) mixing weights per position."""
        return (2 + self.hc_mult) * self.hc_mult

    @classmethod
    def from_hf(cls, raw: dict[str, Any], source: str = "config.json") -> V4Config:
        return parse(raw, source)

    def to_hf(self) -> dict[str, Any]:
        """The config.json a published V4 checkpoint of this model carries."""
        skip = ("name", "rope_scaling", "quantization", "expert_dtype", "compress_ratios")
        out: dict[str, Any] = {"architectures": [ARCHITECTURE], "model_type": self.model_type,
                               "_name_or_path": self.name,
                               "num_key_value_heads": 1, "hidden_act": "silu", "norm_topk_prob": True,
                               "topk_method": "noaux_tc", "tie_word_embeddings": False, "attention_bias": False}
        out.update({f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in skip})
        out["compress_ratios"] = list(self.compress_ratios)
        if self.rope_scaling is not None:
            yarn = self.rope_scaling
            out["rope_scaling"] = {"type": "yarn", "factor": yarn.factor,
                                   "original_max_position_embeddings": yarn.original_max_position_embeddings,
                                   "beta_fast": yarn.beta_fast, "beta_slow": yarn.beta_slow}
        if self.quantization is not None:
            out["quantization_config"] = self.quantization.to_hf()
        if self.expert_dtype is not None:
            out["expert_dtype"] = self.expert_dtype
        return out


def load_v4_config(path: str | Path) -> V4Config:
    path = Path(path)
    raw = read_json(path, "a config.json")
    if not isinstance(raw, dict):
        raise StepperError(f"{path}: expected a JSON object, found {type(raw).__name__}")
    return parse(raw, str(path))


# ---------------------------------------------------------------------------------------------
# Parsing: each field checked alone, then the relations between fields


def parse(raw: dict[str, Any], source: str) -> V4Config:
    raw, spelled = published_fields(raw, source)  # transformers' form (a config it saved) as the published one
    f = Fields(raw, source, spelled)
    f.equal("model_type", MODEL_TYPE, "a DeepSeek-V4 config")
    f.equal("hidden_act", "silu", "the experts' SwiGLU")
    f.equal("num_key_value_heads", 1, "V4 has one shared key-value head")
    f.equal("scoring_func", "sqrtsoftplus", "V4's router scores sqrt(softplus(logits))")
    f.equal("norm_topk_prob", True, "V4 divides the chosen experts' scores by their sum")
    f.equal("tie_word_embeddings", False, "V4 keeps head.weight apart from embed.weight")
    f.equal("attention_bias", False, "V4's projections have no bias")
    f.equal("mlp_bias", False, "V4's experts have no bias")
    f.equal("topk_method", "noaux_tc", "V4 chooses by scores plus a learned bias")
    for field in ("n_group", "topk_group"):
        f.equal(field, 1, "V4 routes over all experts, in one group")
    layers = f.int("num_hidden_layers")
    mtp = f.int("num_nextn_predict_layers", default=1, minimum=0)
    cfg = V4Config(
        name=model_name(raw, source),
        vocab_size=f.int("vocab_size"),
        hidden_size=f.int("hidden_size"),
        moe_intermediate_size=f.int("moe_intermediate_size"),
        num_hidden_layers=layers,
        num_attention_heads=f.int("num_attention_heads"),
        head_dim=f.int("head_dim"),
        q_lora_rank=f.int("q_lora_rank"),
        qk_rope_head_dim=f.int("qk_rope_head_dim"),
        n_routed_experts=f.int("n_routed_experts"),
        n_shared_experts=f.int("n_shared_experts", default=1, minimum=0),
        num_experts_per_tok=f.int("num_experts_per_tok"),
        routed_scaling_factor=f.float("routed_scaling_factor", default=1.0),
        rms_norm_eps=f.float("rms_norm_eps", default=1e-6, below=EPS_BELOW),
        rope_theta=rope_base(f, "rope_theta"),
        compress_rope_theta=rope_base(f, "compress_rope_theta", default=...),
        rope_scaling=_yarn(f),
        max_position_embeddings=f.int("max_position_embeddings"),
        sliding_window=f.int("sliding_window"),
        o_groups=f.int("o_groups"),
        o_lora_rank=f.int("o_lora_rank"),
        index_n_heads=f.int("index_n_heads"),
        index_head_dim=f.int("index_head_dim"),
        index_topk=f.int("index_topk"),
        hc_mult=f.int("hc_mult"),
        hc_sinkhorn_iters=f.int("hc_sinkhorn_iters"),
        hc_eps=f.float("hc_eps"),
        num_hash_layers=f.int("num_hash_layers", default=0, minimum=0),
        swiglu_limit=f.float("swiglu_limit"),
        compress_ratios=_compress_ratios(f, layers, mtp),
        num_nextn_predict_layers=mtp,
        quantization=_quantization(f),
        expert_dtype=_expert_dtype(f),
    )
    _check_relations(cfg, f)
    return cfg


def _compress_ratios(f: Fields, layers: int, mtp: int) -> tuple[int, ...]:
    ratios = f.get("compress_ratios")
    expected = f"{layers + mtp} entries (num_hidden_layers {layers} + num_nextn_predict_layers {mtp})"
    if not isinstance(ratios, list):
        raise f.fail("compress_ratios", f"must be a list of {expected}, got {said(ratios)}")
    if len(ratios) != layers + mtp:
        raise f.fail("compress_ratios", f"must have {expected}, got {len(ratios)}")
    for i, ratio in enumerate(ratios):
        if isinstance(ratio, bool) or not isinstance(ratio, int) or ratio < 0 or ratio == 1:
            raise f.fail(f"compress_ratios[{i}]", f"must be 0 (sliding), 4 (CSA) or another ratio >= 2 (HCA; "
                         f"published: 128), got {said(ratio)}")
        if ratio > MAX_SIZE:  # a window's positions: its ape has a row each
            raise f.fail(f"compress_ratios[{i}]", f"must be <= {MAX_SIZE:,}, got {ratio:,}")
    return tuple(ratios)


def _yarn(f: Fields) -> Yarn | None:
    """The compressed layers' YaRN (`rope_scaling`); its mscale is not used (V4 scales no cos/sin)."""
    block = f.raw.get("rope_scaling")
    if block is None:
        return None
    if not isinstance(block, dict):
        raise f.fail("rope_scaling", f"must be an object or null, got {said(block)}")
    name = f.spelled.get("rope_scaling", "rope_scaling")  # transformers' form: rope_parameters.compress
    kind = rope_kind(f, block, name)
    if kind == "default":
        return None
    if kind != "yarn":
        raise f.fail(f"{name}.{'rope_type' if 'rope_type' in block else 'type'}",
                     f"must be 'yarn' (or absent), got {said(kind)}")
    inner = Fields(block, f.source, within=f"{name}.")
    yarn = Yarn(factor=inner.float("factor"),
                original_max_position_embeddings=inner.int("original_max_position_embeddings"),
                beta_fast=inner.float("beta_fast", default=32.0), beta_slow=inner.float("beta_slow", default=1.0))
    return checked_yarn(f, yarn, name)


def _quantization(f: Fields) -> V4Fp8 | None:
    block = f.raw.get("quantization_config")
    if block is None:
        return None
    if not isinstance(block, dict):
        raise f.fail("quantization_config", f"must be an object, got {said(block)}")
    inner = Fields(block, f.source, within="quantization_config.")
    inner.equal("quant_method", "fp8", "V4's weights are FP8 with E8M0 scales")
    inner.equal("fmt", "e4m3", "V4's FP8 weights")
    inner.equal("scale_fmt", "ue8m0", "V4's block scales are powers of two stored as E8M0 `.scale`")
    size = block.get("weight_block_size", [128, 128])
    if not (isinstance(size, list) and len(size) == 2
            and all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in size)):
        raise f.fail("quantization_config.weight_block_size", f"must be two positive integers, got {said(size)}")
    return V4Fp8((size[0], size[1]))


def _expert_dtype(f: Fields) -> str | None:
    value = f.raw.get("expert_dtype")
    if value is not None and value not in ("fp4", "fp8"):
        raise f.fail("expert_dtype", f"must be 'fp4' or 'fp8' (or absent), got {said(value)}")
    return value


def _check_relations(cfg: V4Config, f: Fields) -> None:
    if cfg.qk_rope_head_dim % 2 or cfg.qk_rope_head_dim > cfg.head_dim:
        raise f.fail("qk_rope_head_dim", f"must be even and at most head_dim ({cfg.head_dim}), "
                     f"got {cfg.qk_rope_head_dim}")
    if cfg.qk_rope_head_dim > cfg.index_head_dim:
        raise f.fail("index_head_dim", f"({cfg.index_head_dim}) must be at least qk_rope_head_dim "
                     f"({cfg.qk_rope_head_dim}): the indexer rotates its last qk_rope_head_dim dims")
    if cfg.num_attention_heads % cfg.o_groups:
        raise f.fail("o_groups", f"({cfg.o_groups}) must divide num_attention_heads ({cfg.num_attention_heads})")
    if cfg.num_experts_per_tok > cfg.n_routed_experts:
        raise f.fail("num_experts_per_tok", f"({cfg.num_experts_per_tok}) must not exceed n_routed_experts "
                     f"({cfg.n_routed_experts})")
    if cfg.num_hash_layers > cfg.num_hidden_layers:
        raise f.fail("num_hash_layers", f"({cfg.num_hash_layers}) must not exceed num_hidden_layers "
                     f"({cfg.num_hidden_layers})")
    if cfg.sliding_window > cfg.max_position_embeddings:
        raise f.fail("sliding_window", f"({cfg.sliding_window:,}) must not exceed max_position_embeddings "
                     f"({cfg.max_position_embeddings:,}): the window's cache is that many positions")
    for i, ratio in enumerate(cfg.compress_ratios):
        if ratio > cfg.max_position_embeddings:
            raise f.fail(f"compress_ratios[{i}]", f"({ratio:,}) must not exceed max_position_embeddings "
                         f"({cfg.max_position_embeddings:,}): a window that long never closes, and its ape has a row "
                         "per position")
    if cfg.hc_mult > MAX_HC_MULT:
        raise f.fail("hc_mult", f"must be at most {MAX_HC_MULT} streams, got {cfg.hc_mult}")
    if cfg.hc_sinkhorn_iters > MAX_SINKHORN_ITERS:
        raise f.fail("hc_sinkhorn_iters", f"must be at most {MAX_SINKHORN_ITERS}, got {cfg.hc_sinkhorn_iters}")
    if cfg.n_shared_experts > 1:
        raise f.fail("n_shared_experts", f"must be 0 or 1 (V4 has one shared expert), got {cfg.n_shared_experts}")


def miniature(cfg: V4Config, layer: int) -> V4Config:
    """A one-layer config of tiny sizes whose layer 0 takes every branch layer `layer` of cfg
    takes: its kind (sliding, CSA with the indexer, HCA at cfg's ratio), hash- or score-routed,
    a shared expert or none. Unquantized (storage changes no name or order)."""
    ratio = cfg.compress_ratio(layer)
    return dataclasses.replace(
        cfg, name=f"miniature of {cfg.name}", vocab_size=16, hidden_size=32, moe_intermediate_size=32,
        num_hidden_layers=1, num_attention_heads=2, head_dim=16, q_lora_rank=8, qk_rope_head_dim=4,
        n_routed_experts=4, num_experts_per_tok=2, sliding_window=4, o_groups=2, o_lora_rank=4, index_n_heads=2,
        index_head_dim=8, index_topk=2, hc_mult=2, hc_sinkhorn_iters=3, num_hash_layers=int(cfg.is_hash_layer(layer)),
        compress_ratios=(ratio, 0), num_nextn_predict_layers=1, quantization=None, expert_dtype=None,
        max_position_embeddings=64,
    )


def cost_line(dims, bytes_per_value: int = 4) -> str:
    """The header's sentence: bytes a position costs this layer, beside V3's MLA at this model's
    widths (a latent as wide as its head, and its rotary dims: V3's 512 + 64 at full size), both at
    bytes_per_value (stepper holds float32: 4). A tiny model is compared with an MLA as small."""
    ratio = dims.compress_ratio
    kind = "sliding" if ratio == 0 else f"{'CSA' if dims.has_indexer else 'HCA'}, m = {ratio}"
    v4 = values_per_position(dims) * bytes_per_value
    mla = mla_values_per_position(dims.head_dim, dims.rope_dim) * bytes_per_value
    fixed = bounded_values(dims) * bytes_per_value
    return (f"cache per position per layer: {v4:,g} B ({kind}; +{fixed:,} B whatever the length) "
            f"vs {mla:,g} B for V3's MLA at these widths (a latent of {dims.head_dim} + {dims.rope_dim} rotary; "
            f"both at {bytes_per_value} B a value)")
