"""The model's hyper-parameters: a frozen dataclass read from an HF config.json or a named preset.

Field names are those of DeepSeek-V3's and Kimi K2's config.json, so a reader of either file
finds every value under the name they know. `Config.from_hf` accepts the four model types (V3,
K2, V2 with its softmax router, V3.2 with its indexer: `_family` reads what tells them apart), the
older `rope_scaling` block and the newer `rope_parameters` block, and rejects inconsistent values
with a `StepperError` that names the field.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepper.errors import StepperError
from stepper.untrusted import cut, said, shown
from stepper.untrusted import regex_subset as patterns
from stepper.untrusted.jsonfile import read_json
from stepper.untrusted.paths import found

EPS_BELOW = 1.0  # rms_norm_eps: added to a mean square, it must be small beside one (published: 1e-6, 1e-5)
MODEL_TYPES = ("deepseek_v3", "kimi_k2", "deepseek_v2", "deepseek_v32")
WRAPPER_TYPES = ("kimi_k25",)
ARCHITECTURES = {"deepseek_v3": "DeepseekV3ForCausalLM", "kimi_k2": "DeepseekV3ForCausalLM",
                 "deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v32": "DeepseekV32ForCausalLM"}


@dataclass(frozen=True)
class Yarn:
    """YaRN rope scaling: positions past `original_max_position_embeddings` stretched by `factor`."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    attention_factor: float | None = None  # cos and sin's scale, as transformers' YaRN gives it; None: mscale's ratio
    truncate: bool = True  # the correction range's ends rounded out to whole dims (transformers' `truncate`)


@dataclass(frozen=True)
class QueryScale:
    """Llama 4's position-dependent query scale (Mistral 4): queries at position p are multiplied
    by 1 + beta * ln(1 + floor(p / original_max_position_embeddings))."""

    beta: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class LongRope:
    """LongRoPE (MiniCPM3): each rotary frequency divided by its own factor, `short_factor` while
    every position is below `original_max_position_embeddings`, `long_factor` past it; cos and sin
    times `attention_factor`."""

    short_factor: tuple[float, ...]
    long_factor: tuple[float, ...]
    original_max_position_embeddings: int
    attention_factor: float = 1.0


@dataclass(frozen=True)
class Fp8:
    """The checkpoint's weight quantization: e4m3 codes with one float32 scale per block, or one per
    tensor (`per_tensor`: weight_block_size null, as Mistral Small 4 is published; each fused
    experts' tensor then has one scale per expert)."""

    fmt: str = "e4m3"
    weight_block_size: tuple[int, int] = (128, 128)
    per_tensor: bool = False


KIMI_INT4_IGNORE = ("lm_head", r"re:.*self_attn.*", r"re:.*shared_experts.*",
                    r"re:.*mlp\.(gate|up|gate_up|down)_proj.*")


@dataclass(frozen=True)
class Int4Groups:
    """compressed-tensors' `pack-quantized` weights, as Kimi-K2-Thinking / K2.5 ship their experts:
    symmetric INT4 codes with one scale per `group_size` inputs. A linear module matched by one of
    `targets` and by no entry of `ignore` is stored that way; the rest stay BF16. Entries are
    module names ("lm_head") or, after "re:", regular expressions matched from the name's start;
    the target "Linear" matches every linear module."""

    group_size: int = 32
    targets: tuple[str, ...] = ("Linear",)
    ignore: tuple[str, ...] = KIMI_INT4_IGNORE

    def quantizes(self, module: str, linear: bool) -> bool:
        """Whether the module (a weight's name without ".weight") is stored in INT4."""
        def matches(entry: str) -> bool:
            if entry.startswith("re:"):
                return patterns.matches(entry[3:], module)
            return entry == module or (entry == "Linear" and linear)
        return any(matches(t) for t in self.targets) and not any(matches(i) for i in self.ignore)

    def to_hf(self) -> dict[str, Any]:
        """The quantization_config block of config.json."""
        weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": self.group_size,
                   "dynamic": False, "actorder": None, "block_structure": None, "observer": "minmax"}
        group = {"targets": list(self.targets), "weights": weights, "input_activations": None,
                 "output_activations": None, "format": "pack-quantized"}
        return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
                "config_groups": {"group_0": group}, "ignore": list(self.ignore), "kv_cache_scheme": None}


@dataclass(frozen=True)
class Wrapper:
    """A vision-language wrapper around the text model (Kimi K2.5's `kimi_k25`): the text model's
    tensors are stored under `text_prefix`, the vision tower's and projector's under
    `unused_prefixes`, and `unused_fields` are the wrapper's config fields a text run does not use."""

    model_type: str
    text_prefix: str = "language_model."
    unused_prefixes: tuple[str, ...] = ("vision_tower.", "mm_projector.")
    unused_fields: tuple[str, ...] = ()

    def describe(self) -> str:
        fields = f" · not used: {', '.join(self.unused_fields)}" if self.unused_fields else ""
        prefixes = ", ".join(p + "*" for p in self.unused_prefixes)
        return (f"{self.model_type} wrapper: the text model of its text_config, tensors under "
                f"{self.text_prefix}* ({prefixes} never read){fields}")


class MlaVariants:
    """What the MLA families of stepper/families differ in, at DeepSeek-V3's values: the shared parts
    (model.layer, attention, moe, transformer) read these from any config. `Config` keeps each as a
    field its families set; a config class of another family (Kimi Linear's) inherits the values."""

    tie_word_embeddings = False
    zeroed_pad_row = None
    router_bias = True
    moe_output_norm = False
    query_scale = None
    fused_experts = False
    rope_interleave = True
    longrope = None
    scale_emb = 1.0
    scale_depth = None
    dim_model_base = None
    indexer_rope_interleave = False
    index_reused_layers: tuple[int, ...] = ()
    q_gate = False
    gated_norm_rank = None
    masked_groups_zero = False
    zero_experts = 0
    mla_lora_scales = False
    shortcut_moe = False
    gate_proj = False
    attention_sinks = False
    indexer_rope_last = False
    indexer_norm_eps = 1e-6
    swiglu_limit = None
    head_gate = False  # Ling 3's MLA: sigmoid(g_proj(x)), one gate per head
    kda_full_gates = False  # Ling 3's KDA: f_proj and g_proj, not Kimi's rank-K f_a/f_b, g_a/g_b
    kda_lower_bound = None  # Ling 3's safe forget gate: lower_bound * sigmoid(...)
    rotary = True  # the model makes rotary tables (Kimi Linear: none, no layer rotates)
    latent_norm_eps = 1e-6  # kv_a_layernorm's eps: DeepSeek's norm default (Mistral Large 4's: rms_norm_eps)
    lerope = False  # Mistral Large 4: the rotary frequencies times exp(model.rotary_emb.alpha), learned
    learned_query_scale = False  # Mistral Large 4: queries times scale_h ln(p + 1) + bias_h, learned per head
    indexer_query_from_hidden = False  # Mistral Large 4's indexer: its query from LayerNorm(x), not q_a_norm
    final_logit_softcapping = None  # Mistral Large 4: logits = c tanh(logits / c)
    nope_layers: tuple[int, ...] = ()  # layers whose attention rotates nothing (Mistral Large 4's NoPE layers)
    kv_sources: tuple[int, ...] = ()  # per layer, the layer whose latent it reads (Mistral Large 4); (): its own

    def kv_source(self, layer: int) -> int:
        """The layer whose latent and rotary key `layer` attends over: itself, or an earlier one's."""
        return self.kv_sources[layer] if self.kv_sources else layer

    def kv_shared(self, layer: int) -> bool:
        """Whether the layer reads an earlier layer's latent (and has no kv_a_proj_with_mqa of its own)."""
        return self.kv_source(layer) != layer

    def rope_dims(self, layer: int) -> int:
        """The rotary dims of a layer's query and key heads: qk_rope_head_dim, or 0 in a NoPE layer."""
        return 0 if layer in self.nope_layers else self.qk_rope_head_dim

    def nope_dims(self, layer: int) -> int:
        """The dims of a layer's heads that carry no position: qk_nope_head_dim, or the whole head in a NoPE layer."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim - self.rope_dims(layer)

    @property
    def has_mup_scalings(self) -> bool:
        """MiniCPM3's embedding, residual and logit scalings (model.scalings)."""
        return self.scale_depth is not None

    def index_reused(self, layer: int) -> bool:
        """Whether the layer runs no indexer and attends where the layer before it chose (GLM-5)."""
        return layer in self.index_reused_layers

    @property
    def has_gated_norms(self) -> bool:
        """A.X-K2's gated input_layernorm (every layer) and post_attention_layernorm (MoE layers)."""
        return self.gated_norm_rank is not None

    @property
    def router_experts(self) -> int:
        """The experts the router scores: the routed ones and (LongCat) the zero experts after them."""
        return self.n_routed_experts + self.zero_experts

    def axis_notes(self, layer: int | None) -> dict[str, str]:
        """What sets an axis's size, for its label (catalog.label): LongCat's router scores its zero
        experts beside the routed ones, so its 12 'routed experts' are 8 + 4 zero experts."""
        return {"E": f"{self.n_routed_experts} + {self.zero_experts} zero experts"} if self.zero_experts else {}

    @property
    def residual_scale(self) -> float:
        return 1.0 if self.scale_depth is None else self.scale_depth / math.sqrt(self.num_hidden_layers)

    @property
    def logits_scaling(self) -> float:
        return 1.0 if self.dim_model_base is None else self.hidden_size / self.dim_model_base


@dataclass(frozen=True)
class Config(MlaVariants):
    name: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    q_lora_rank: int | None
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
    moe_layer_freq: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    rope_scaling: Yarn | None
    quantization: Fp8 | None
    wrapper: Wrapper | None = None  # set when config.json wraps this text model (kimi_k25)
    int4: Int4Groups | None = None  # compressed-tensors pack-quantized (then quantization is None)
    scoring_func: str = "sigmoid"  # the router's scores: sigmoid (V3, K2) or softmax (V2)
    topk_method: str = "noaux_tc"  # the router's choice: noaux_tc, greedy or group_limited_greedy
    # DeepSeek-V3.2's Lightning Indexer: index_n_heads heads of index_head_dim score the earlier
    # positions, each query attends only to the index_topk best (None without an indexer)
    index_n_heads: int | None = None
    index_head_dim: int | None = None
    index_topk: int | None = None
    # the MLA families' differences (stepper/families): lm_head is the embedding (Youtu); the router
    # adds no learned bias to choose (A.X-K1, Mistral 4); an RMSNorm on the MoE's output (A.X-K1);
    # queries scaled by position (Mistral 4); the embedding row of the pad token zeroed on load (Youtu)
    tie_word_embeddings: bool = False
    zeroed_pad_row: int | None = None
    router_bias: bool = True
    moe_output_norm: bool = False
    query_scale: QueryScale | None = None
    fused_experts: bool = False  # the checkpoint stores each layer's experts in two tensors (weights.fused_experts)
    # Fields of the other MLA families (stepper/families/<model_type>.py); the defaults are DeepSeek's
    rope_interleave: bool = True  # RoPE turns interleaved pairs (DeepSeek) or dim i with i + rope/2 (MiniCPM3)
    longrope: LongRope | None = None  # LongRoPE's per-frequency factors (MiniCPM3), instead of YaRN
    scale_emb: float = 1.0  # the embedding times this (MiniCPM3)
    scale_depth: float | None = None  # each residual branch times scale_depth / sqrt(layers) (MiniCPM3)
    dim_model_base: int | None = None  # the final norm divided by hidden_size / dim_model_base (MiniCPM3)
    indexer_rope_interleave: bool = False  # the indexer's RoPE on interleaved pairs (GLM-5), not two halves (V3.2)
    index_reused_layers: tuple[int, ...] = ()  # layers reusing the previous layer's index choice (GLM-5 "shared")
    q_gate: bool = False  # q_b_proj also makes a per-head sigmoid gate on attention's output (A.X-K2)
    gated_norm_rank: int | None = None  # RMSNorms times a low-rank sigmoid gate of their output (A.X-K2)
    masked_groups_zero: bool = False  # experts of dropped groups score 0.0 in the choice, not -inf (A.X-K2)
    zero_experts: int = 0  # the router's extra identity experts, after the routed ones (LongCat-Flash)
    mla_lora_scales: bool = False  # q times sqrt(d / q_lora_rank), the kv latent times sqrt(d / kv_lora_rank) (LongCat)
    shortcut_moe: bool = False  # two attention + dense-MLP sublayers per layer, the MoE beside them (LongCat)
    gate_proj: bool = False  # a projection of its own (gate_proj) makes the per-head output gate (Hy4)
    attention_sinks: bool = False  # one more logit per head in each attention softmax, its weight dropped (Hy4)
    indexer_rope_last: bool = False  # the indexer's RoPE on the last qk_rope_head_dim dims of a head (Hy4)
    indexer_norm_eps: float = 1e-6  # the indexer's k_norm eps (DeepSeek's LayerNorm default; Hy4: rms_norm_eps)
    swiglu_limit: float | None = None  # the routed experts clamp gate (above) and up (both sides) at this (Hy4)
    # the special tokens' ids, read to be written back (synth's config.json): the model uses none but
    # Youtu's pad row, and transformers warns of an id outside the vocabulary (its defaults, the published
    # model's, lie outside a tiny one's)
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None

    @property
    def has_indexer(self) -> bool:
        return self.index_topk is not None

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def is_moe_layer(self, layer: int) -> bool:
        """DeepSeek's rule: MoE from `first_k_dense_replace` on, every `moe_layer_freq`-th layer."""
        return (
            self.n_routed_experts > 0
            and layer >= self.first_k_dense_replace
            and layer % self.moe_layer_freq == 0
        )

    @classmethod
    def from_hf(cls, raw: dict[str, Any], name: str = "config.json") -> Config:
        """Read an HF config.json dict of the MLA family (MODEL_TYPES or its wrapper) and validate
        it. A config.json of any registered family: stepper.families.read_config."""
        return _parse(raw, name)

    def to_hf(self) -> dict[str, Any]:
        """The config.json dict an HF checkpoint of this model carries (DeepseekV3 field names, or
        the family's own: stepper/families)."""
        out: dict[str, Any] = {
            "architectures": [ARCHITECTURES[self.model_type]],
            "model_type": self.model_type,
            "num_key_value_heads": self.num_attention_heads,
            "hidden_act": "silu",
            "scoring_func": self.scoring_func,
            "topk_method": self.topk_method,
            "attention_bias": False,
        }
        for f in dataclasses.fields(self):
            if f.name in ("name", "model_type", "rope_scaling", "quantization", "wrapper", "int4", "scoring_func",
                          "topk_method", *FAMILY_FIELDS, *TOKEN_ID_FIELDS):
                continue
            if f.name.startswith("index_") and not self.has_indexer:
                continue
            out[f.name] = getattr(self, f.name)
        out["tie_word_embeddings"] = False  # lm_head is its own matrix (_parse refuses true)
        out.update(written_token_ids(self))
        if self.rope_scaling is not None:
            out["rope_scaling"] = {"type": "yarn", **yarn_fields(self.rope_scaling)}
        if self.quantization is not None:
            out["quantization_config"] = {
                "quant_method": "fp8",
                "activation_scheme": "dynamic",
                "fmt": self.quantization.fmt,
                "weight_block_size": (None if self.quantization.per_tensor
                                      else list(self.quantization.weight_block_size)),
            }
        if self.int4 is not None:
            out["quantization_config"] = self.int4.to_hf()
        return out


def read_mla_config(raw: dict[str, Any], source: str, spelled: dict[str, str] | None = None) -> Config:
    """The MLA family's reader (families.deepseek): a config.json of MODEL_TYPES or its wrapper
    (a family's translated config with `spelled`: see Fields)."""
    return _parse(raw, source, spelled)


FAMILY_FIELDS = (  # the other MLA families' (stepper/families): their config classes write them
    "tie_word_embeddings", "zeroed_pad_row", "router_bias", "moe_output_norm", "query_scale", "fused_experts",
    "rope_interleave", "longrope", "scale_emb", "scale_depth", "dim_model_base", "indexer_rope_interleave",
    "index_reused_layers", "q_gate", "gated_norm_rank", "masked_groups_zero", "zero_experts", "mla_lora_scales",
    "shortcut_moe", "gate_proj", "attention_sinks", "indexer_rope_last", "indexer_norm_eps", "swiglu_limit")


TOKEN_ID_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def written_token_ids(cfg: Any) -> dict[str, Any]:
    """The special tokens' ids a config.json gives, as it gives them (eos_token_id: one or a list)."""
    return {field: list(v) if isinstance(v, tuple) else v
            for field in TOKEN_ID_FIELDS if (v := getattr(cfg, field)) is not None}


def load_config(path: str | Path, read: Callable[[dict[str, Any], str], Any] = read_mla_config) -> Any:
    """Read and validate a config.json file with a family's reader (the MLA family's unless given:
    stepper.families.load_config reads any registered family's)."""
    path = Path(path)
    if found(path) == "file" and (path.suffix == ".safetensors" or path.name.endswith(".index.json")):
        what = "a .safetensors file" if path.suffix == ".safetensors" else "a checkpoint's index"
        raise StepperError(f"{path}: {what}, not a config.json; give the checkpoint's directory (config.json, its "
                           "index and shards)")
    raw = read_json(path, "a config.json")  # a key given twice, or NaN, is refused naming it
    if not isinstance(raw, dict):
        raise StepperError(f"{path}: expected a JSON object, found {type(raw).__name__}")
    return read(raw, str(path))


# ---------------------------------------------------------------------------------------------
# Parsing and validation


MAX_SIZE = 1 << 24  # a width, a rank or a vocabulary: the largest published are under 2**19
MAX_COUNT = 1 << 16  # layers, experts, heads, groups: the largest published are in the hundreds
MAX_POSITIONS = 1 << 40
LIMITS = {  # what a config.json's integer can be, so an absurd one is refused before it sizes any work
    **dict.fromkeys(("num_hidden_layers", "num_layers", "num_nextn_predict_layers", "num_hash_layers",
                     "n_routed_experts", "num_experts", "n_shared_experts", "num_shared_experts", "zero_expert_num",
                     "num_experts_per_tok", "num_experts_per_token", "moe_topk", "n_group", "num_expert_group",
                     "topk_group", "num_attention_heads", "num_key_value_heads", "num_heads", "index_n_heads",
                     "hc_mult", "o_groups", "moe_layer_freq", "first_k_dense_replace"), MAX_COUNT),
    **dict.fromkeys(("max_position_embeddings", "original_max_position_embeddings", "model_max_length"),
                    MAX_POSITIONS),
}


# Fields whose null in a config.json reads as their absence: those transformers' configs of these
# families take as null (a published config.json may hold them so). Any other field's null is
# refused: rope_theta null running with 10000 would be a silent wrong answer. (A null tie_word_embeddings
# reads as untied, which these models are: a tied one is refused.)
NULL_IS_ABSENT = frozenset((
    "head_dim", "v_head_dim", "num_key_value_heads", "q_lora_rank", "n_group", "topk_group", "num_expert_group",
    "num_experts_per_tok", "num_experts_per_token", "num_experts", "num_shared_experts", "moe_intermediate_size",
    "first_k_dense_replace", "num_nextn_predict_layers", "norm_topk_prob", "moe_renormalize", "topk_method",
    "model_max_length", "dim_model_base", "scale_depth", "tie_word_embeddings",
))


def limit_of(field: str) -> int:
    """The largest value a config.json's integer field can hold."""
    return LIMITS.get(field, MAX_SIZE)


class Fields:
    """Typed access to a raw config dict; every error names the file and the field, and shows the
    value as `untrusted.said` does (a list of 100,000 numbers is not written out). A family that
    renames DeepSeek-V3's fields reads its translated dict with `spelled` (DeepSeek-V3's name ->
    the family's): its errors then name each field, in the field and in the reason, as the
    family's config.json spells it. A nested block's fields are named with `within` before them
    (`rope_scaling.`)."""

    def __init__(self, raw: dict[str, Any], source: str, spelled: dict[str, str] | None = None, within: str = ""):
        self.raw, self.source, self.spelled, self.within = raw, source, spelled or {}, within

    def fail(self, field: str, why: str) -> StepperError:
        for name, family_name in self.spelled.items():
            why = re.sub(rf"\b{name}\b", family_name, why)
        return StepperError(f"{self.source}: field '{self.within}{self.spelled.get(field, field)}' {why}")

    def int(self, field: str, default: Any = ..., minimum: int = 1) -> int:
        """An integer field, at least `minimum` and at most what such a field can be (LIMITS)."""
        value = self.get(field, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(field, f"must be an integer, got {said(value)}")
        if value < minimum:
            raise self.fail(field, f"must be >= {minimum}, got {value}")
        limit = limit_of(field)
        if value > limit:
            raise self.fail(field, f"must be <= {limit:,}, got {f'{value:,}' if value < 10**24 else said(value)}")
        return value

    def optional_int(self, field: str) -> int | None:
        return None if self.raw.get(field) is None else self.int(field)

    def float(self, field: str, default: Any = ..., positive: bool = True, below: float | None = None) -> float:
        """A finite number field, > 0 where `positive`, < `below` where given."""
        value = self.get(field, default)
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                or (positive and value <= 0)):
            raise self.fail(field, f"must be a finite number{' > 0' * positive}, got {said(value)}")
        if below is not None and value >= below:
            raise self.fail(field, f"must be < {below:g}, got {value:g}")
        return float(value)

    def bool(self, field: str, default: Any = ...) -> bool:
        value = self.get(field, default)
        if not isinstance(value, bool):
            raise self.fail(field, f"must be true or false, got {said(value)}")
        return value

    def str(self, field: str, default: Any = ...) -> str:
        value = self.get(field, default)
        if not isinstance(value, str):
            raise self.fail(field, f"must be a string, got {said(value)}")
        return value

    def equal(self, field: str, expected: Any, why: str) -> None:
        """A field stepper honours at one value only (absent counts as that value)."""
        value = self.raw.get(field, expected)
        if value != expected or type(value) is not type(expected):
            raise self.fail(field, f"must be {expected!r} ({why}), got {said(value)}")

    def get(self, field: str, default: Any = ...) -> Any:
        """The field's value; its default where it is absent, or null where null means absent (NULL_IS_ABSENT)."""
        value = self.raw.get(field)
        if value is not None:
            return value
        if default is ...:
            raise self.fail(field, "is null" if field in self.raw else "is missing")
        if field in self.raw and field not in NULL_IS_ABSENT:
            raise self.fail(field, f"is null: leave it out for its default ({default!r}), or give a value")
        return default


def token_ids(f: Fields, field: str, vocab: int) -> int | tuple[int, ...] | None:
    """A special token's id (eos_token_id: one or a list, as transformers takes it); None where absent
    or null. bos and eos may lie outside the vocabulary, as transformers takes them (with a warning: a
    tiny model its configuration classes save keeps the published model's ids), since the model reads
    neither; pad_token_id is the row transformers' embedding pads, which torch counts from the end
    when negative (configs on the Hub write -1) and refuses past either end."""
    value = f.raw.get(field)
    ids = value if field == "eos_token_id" and isinstance(value, list) and value else [value]
    if value is not None and not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        shape = "a token id or a list of them" if field == "eos_token_id" else "a token id"
        raise f.fail(field, f"must be {shape} (a whole number), got {said(value)}")
    if field == "pad_token_id" and value is not None and not -vocab <= value < vocab:
        raise f.fail(field, f"must be a token id in -{vocab}..{vocab - 1} (vocab_size {vocab}; transformers' "
                     f"embedding takes it as its padding row), got {said(value)}")
    return tuple(value) if isinstance(value, list) else value


def rope_base(f: Any, field: str, default: Any = 10000.0) -> float:
    """A rotary base (rope_theta): a finite number > 1. The frequencies are base^(-2i/rope); at 1 every
    pair turns alike and YaRN's correction range divides by log(base) (zero), below 1 they grow past any
    table (1e-300: NaN). transformers takes any number; no published model is under 10,000."""
    value = f.float(field, default)
    if value <= 1:
        raise f.fail(field, f"must be > 1 (the rotary base: frequencies are base^(-2i/dim)), got {said(value)}")
    return value


def rope_kind(f: Any, block: dict[str, Any], block_name: str) -> Any:
    """A rope block's kind: `rope_type`, else the older `type`, else "default" (transformers 5.24's
    order: modeling_rope_utils' standardize_rope_params). Both given and different is refused: which
    one a tool reads would change the answer."""
    kind, older = block.get("rope_type"), block.get("type")
    if kind is not None and older is not None and kind != older:
        raise f.fail(f"{block_name}.rope_type",
                     f"is {said(kind)} but {block_name}.type is {said(older)}: give one, or both alike")
    return kind if kind is not None else "default" if older is None else older


def _parse(raw: dict[str, Any], source: str, spelled: dict[str, str] | None = None, zero_experts: int = 0) -> Config:
    """The MLA config of a config.json dict in DeepSeek-V3's names; a family's reader gives how its
    config.json spells the fields it renamed (`spelled`) and the zero experts its router adds."""
    f = Fields(raw, source, spelled)
    model_type = f.str("model_type")
    if model_type in WRAPPER_TYPES:
        return _kimi_k25(f)
    if model_type not in MODEL_TYPES:
        raise f.fail("model_type", f"must be one of {', '.join(MODEL_TYPES)}, got {said(model_type)}")
    f.equal("hidden_act", "silu", "the only kind stepper runs")
    if raw.get("attention_bias"):
        raise f.fail("attention_bias", "must be false: MLA projections have no bias")
    if f.bool("tie_word_embeddings", default=False):
        raise f.fail("tie_word_embeddings", "must be false: Kimi K2 and DeepSeek-V3 keep lm_head apart from the "
                     "embedding, and stepper reads lm_head.weight as its own matrix")

    heads = f.int("num_attention_heads")
    kv_heads = f.int("num_key_value_heads", default=heads)
    if kv_heads != heads:
        raise f.fail(
            "num_key_value_heads",
            f"must equal num_attention_heads ({heads}) in MLA, where every head has its own "
            f"up-projected key and value; got {kv_heads}",
        )
    rope_theta, rope_scaling = rope_settings(f)
    no_experts = {} if raw.get("n_routed_experts") else {"default": 0, "minimum": 0}  # dense only: no expert size
    vocab = f.int("vocab_size")
    cfg = Config(
        name=model_name(raw, source),
        model_type=model_type,
        vocab_size=vocab,
        hidden_size=f.int("hidden_size"),
        intermediate_size=f.int("intermediate_size"),
        moe_intermediate_size=f.int("moe_intermediate_size", **no_experts),
        num_hidden_layers=f.int("num_hidden_layers"),
        num_attention_heads=heads,
        q_lora_rank=f.optional_int("q_lora_rank"),
        kv_lora_rank=f.int("kv_lora_rank"),
        qk_nope_head_dim=f.int("qk_nope_head_dim"),
        qk_rope_head_dim=f.int("qk_rope_head_dim"),
        v_head_dim=f.int("v_head_dim"),
        n_routed_experts=f.int("n_routed_experts", default=0, minimum=0),
        n_shared_experts=f.int("n_shared_experts", default=0, minimum=0),
        num_experts_per_tok=f.int("num_experts_per_tok", default=1),
        n_group=f.int("n_group", default=1),
        topk_group=f.int("topk_group", default=1),
        routed_scaling_factor=f.float("routed_scaling_factor", default=1.0),
        norm_topk_prob=f.bool("norm_topk_prob", default=model_type != "deepseek_v2"),
        first_k_dense_replace=f.int("first_k_dense_replace", default=0, minimum=0),
        moe_layer_freq=f.int("moe_layer_freq", default=1),
        rms_norm_eps=f.float("rms_norm_eps", default=1e-6, below=EPS_BELOW),
        rope_theta=rope_theta,
        max_position_embeddings=f.int("max_position_embeddings"),
        rope_scaling=rope_scaling,
        quantization=_quantization(f),
        int4=_int4_groups(f),
        zero_experts=zero_experts,
        **_family(f, model_type),
        **{field: token_ids(f, field, vocab) for field in TOKEN_ID_FIELDS},
    )
    _check_consistency(cfg, f)
    return cfg


# Fields of a kimi_k25 wrapper that stepper reads or that only record where the file came from
WRAPPER_READ = ("model_type", "text_config", "quantization_config", "tie_word_embeddings", "_name_or_path")
WRAPPER_BOOKKEEPING = ("architectures", "auto_map", "transformers_version", "dtype", "torch_dtype")


def _kimi_k25(f: Fields) -> Config:
    """Kimi K2.5's vision-language wrapper: the model is its `text_config` (a kimi_k2 or
    deepseek_v3 config), with the wrapper's quantization_config when the text config has none;
    every other wrapper field is listed as not used."""
    text = f.raw.get("text_config")
    if not isinstance(text, dict):
        raise f.fail("text_config", f"must be an object (the text model's config), got {said(text)}")
    if f.raw.get("tie_word_embeddings"):
        raise f.fail("tie_word_embeddings",
                     "must be false: stepper reads language_model.lm_head.weight as its own matrix")
    text = {"model_type": "deepseek_v3", **text}  # transformers' default text model
    outer = f.raw.get("quantization_config")
    if outer is not None and text.setdefault("quantization_config", outer) != outer:
        raise f.fail("quantization_config", "differs from text_config.quantization_config; give one of them")
    if text["model_type"] in WRAPPER_TYPES:
        raise f.fail("text_config.model_type",
                     f"must be one of {', '.join(MODEL_TYPES)}, got {said(text['model_type'])}")
    cfg = _parse(text, f"{f.source}: text_config")
    unused = tuple(k for k in f.raw if k not in WRAPPER_READ + WRAPPER_BOOKKEEPING)
    wrapper = Wrapper(f.str("model_type"), unused_fields=unused)
    return dataclasses.replace(cfg, name=model_name(f.raw, f.source), wrapper=wrapper)


def model_name(raw: dict[str, Any], source: str) -> str:
    """The model's name: config.json's _name_or_path, else the file's folder; control characters
    escaped here, so that no screen, message or repr gets them raw."""
    return shown(str(raw.get("_name_or_path") or display_name(source)))


def wrapped_hf(cfg: Config, vision_config: dict[str, Any]) -> dict[str, Any]:
    """The config.json of a kimi_k25 checkpoint around this text model (what `stepper synth
    --layout kimi_k25` writes): the text model in text_config, the vision tower's sizes beside it."""
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": cfg.to_hf(),
        "vision_config": vision_config,
        "media_placeholder_token_id": cfg.vocab_size - 1,
        "tie_word_embeddings": False,
    }


def display_name(source: str) -> str:
    """A model's name from where its config came from: a checkpoint directory's name."""
    path = Path(source)
    return path.parent.name if path.name == "config.json" and path.parent.name else source


ROUTERS = {  # model_type -> the router's scoring functions and selection rules, the default first
    "deepseek_v3": (("sigmoid",), ("noaux_tc",)),
    "kimi_k2": (("sigmoid",), ("noaux_tc",)),
    "deepseek_v32": (("sigmoid",), ("noaux_tc",)),
    "deepseek_v2": (("softmax",), ("greedy", "group_limited_greedy")),
}


def _family(f: Fields, model_type: str) -> dict[str, Any]:
    """The fields that tell the families apart: the router's scoring and selection, V3.2's indexer."""
    scorings, methods = ROUTERS[model_type]
    chosen = {}
    for field, allowed in (("scoring_func", scorings), ("topk_method", methods)):
        chosen[field] = f.str(field, default=allowed[0])
        if chosen[field] not in allowed:
            raise f.fail(field, f"must be {' or '.join(map(repr, allowed))} for model_type {model_type}, "
                         f"got {said(chosen[field])}")
    if model_type == "deepseek_v2" and f.raw.get("norm_topk_prob"):
        raise f.fail("norm_topk_prob", "must be false for deepseek_v2: its references disagree on true "
                     "(DeepSeek's code normalises and drops routed_scaling_factor, transformers' ignores it)")
    if model_type == "deepseek_v32":
        if f.raw.get("q_lora_rank") is None:
            raise f.fail("q_lora_rank", "is missing: DeepSeek-V3.2's indexer reads its query from q_a_norm")
        chosen.update(index_n_heads=f.int("index_n_heads", default=64),
                      index_head_dim=f.int("index_head_dim", default=128),
                      index_topk=f.int("index_topk", default=2048))
    return chosen


def rope_settings(f: Fields) -> tuple[float, Yarn | None]:
    """rope_theta and the YaRN block, from `rope_scaling` (config.json) or `rope_parameters`."""
    block_name = "rope_parameters" if isinstance(f.raw.get("rope_parameters"), dict) else "rope_scaling"
    block = f.raw.get(block_name)
    theta_source = block if block_name == "rope_parameters" and "rope_theta" in block else f.raw
    theta_at = f"{f.source}: rope_parameters" if theta_source is block else f.source
    theta = rope_base(Fields(theta_source, theta_at), "rope_theta")
    if block is None:
        return theta, None
    if not isinstance(block, dict):
        raise f.fail(block_name, f"must be an object or null, got {said(block)}")
    inner = Fields(block, f"{f.source}: {block_name}")
    kind = rope_kind(f, block, block_name)
    if kind == "default":
        return theta, None
    if kind != "yarn":
        key = "rope_type" if block.get("rope_type") is not None else "type"
        raise f.fail(f"{block_name}.{key}", f"must be 'yarn' or 'default' (or absent), got {said(kind)}")
    yarn = Yarn(
        factor=inner.float("factor"),
        original_max_position_embeddings=inner.int("original_max_position_embeddings"),
        beta_fast=inner.float("beta_fast", default=32.0),
        beta_slow=inner.float("beta_slow", default=1.0),
        mscale=inner.float("mscale", default=1.0, positive=False),
        mscale_all_dim=inner.float("mscale_all_dim", default=0.0, positive=False),
    )
    return theta, checked_yarn(f, yarn, block_name)


def yarn_fields(yarn: Yarn) -> dict[str, Any]:
    """A YaRN block's fields as a config.json gives them: attention_factor and truncate only where
    they are read (transformers' YaRN) and not their defaults."""
    fields = dataclasses.asdict(yarn)
    return {k: v for k, v in fields.items() if (k, v) not in (("attention_factor", None), ("truncate", True))}


def checked_yarn(f: Any, yarn: Yarn, block_name: str) -> Yarn:
    """A YaRN block's fields against each other: a factor of at least 1, and beta_fast at least
    beta_slow (else the pairs it keeps and those it interpolates would swap sides)."""
    if yarn.factor < 1:
        raise f.fail(f"{block_name}.factor", f"must be >= 1, got {yarn.factor}")
    if yarn.beta_fast < yarn.beta_slow:
        raise f.fail(f"{block_name}.beta_fast", f"must be >= beta_slow ({yarn.beta_slow:g}): YaRN keeps the pairs "
                     f"turning more than beta_fast times in the original context, got {yarn.beta_fast:g}")
    return yarn


def _quantization(f: Fields) -> Fp8 | None:
    block = f.raw.get("quantization_config")
    if block is None:
        return None
    if not isinstance(block, dict):
        raise f.fail("quantization_config", f"must be an object, got {said(block)}")
    inner = Fields(block, f"{f.source}: quantization_config")
    method = inner.str("quant_method", default="fp8")
    if method == COMPRESSED_TENSORS:
        return None  # _int4_groups reads it
    if method != "fp8":
        raise f.fail("quantization_config.quant_method", f"must be 'fp8' or '{COMPRESSED_TENSORS}', got {said(method)}")
    fmt = inner.str("fmt", default="e4m3")
    if fmt != "e4m3":
        raise f.fail("quantization_config.fmt", f"must be 'e4m3', got {said(fmt)}")
    size = block.get("weight_block_size", [128, 128])
    if size is None:  # one scale per tensor
        return Fp8(fmt=fmt, per_tensor=True)
    if (
        not isinstance(size, list)
        or len(size) != 2
        or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in size)
    ):
        raise f.fail("quantization_config.weight_block_size", f"must be two positive integers, got {said(size)}")
    return Fp8(fmt=fmt, weight_block_size=(size[0], size[1]))


COMPRESSED_TENSORS = "compressed-tensors"
# Each field of a config group's `weights` stepper reads, and the only value it honours.
INT4_WEIGHTS = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32,
                "dynamic": False, "actorder": None, "block_structure": None}
NOTHING_ELSE = ("input_activations", "output_activations")  # activation quantization: not honoured


def _int4_groups(f: Fields) -> Int4Groups | None:
    """A compressed-tensors quantization_config stepper can honour: one config group of symmetric
    INT4 weights in groups of 32, packed (pack-quantized), no activation quantization; anything
    else is refused naming the field."""
    block = f.raw.get("quantization_config")
    if not isinstance(block, dict) or block.get("quant_method") != COMPRESSED_TENSORS:
        return None
    where = "quantization_config"
    _require_value(f, block, where, "format", "pack-quantized")
    _require_value(f, block, where, "quantization_status", "compressed", missing_ok=True)
    for field in ("kv_cache_scheme", "sparsity_config", "transform_config"):
        if block.get(field):
            raise f.fail(f"{where}.{field}",
                         f"must be null: stepper honours weight quantization only, got {said(block[field])}")
    groups = block.get("config_groups")
    if not isinstance(groups, dict) or len(groups) != 1 or not isinstance(next(iter(groups.values())), dict):
        raise f.fail(f"{where}.config_groups", f"must hold exactly one config group (an object), got {said(groups)}")
    name, group = next(iter(groups.items()))
    at = f"{where}.config_groups.{name}"
    for field in NOTHING_ELSE:
        if group.get(field) is not None:
            raise f.fail(f"{at}.{field}", f"must be null: stepper quantizes weights only, got {said(group[field])}")
    _require_value(f, group, at, "format", "pack-quantized", missing_ok=True)
    weights = group.get("weights")
    if not isinstance(weights, dict):
        raise f.fail(f"{at}.weights", f"must be an object, got {said(weights)}")
    for field, honoured in INT4_WEIGHTS.items():
        _require_value(f, weights, f"{at}.weights", field, honoured, missing_ok=honoured is None or field == "dynamic")
    return Int4Groups(INT4_WEIGHTS["group_size"], _entries(f, group, f"{at}.targets", "targets"),
                      _entries(f, block, f"{where}.ignore", "ignore", allow_empty=True))


def _require_value(f: Fields, block: dict, at: str, field: str, honoured: Any, missing_ok: bool = False) -> None:
    """block[field] is `honoured` (missing: allowed when missing_ok); else one line naming the field."""
    if field not in block:
        if missing_ok:
            return
        raise f.fail(f"{at}.{field}", f"is missing (stepper honours {json.dumps(honoured)})")
    value = block[field]
    if value != honoured or type(value) is not type(honoured):
        raise f.fail(f"{at}.{field}", f"must be {json.dumps(honoured)} (the only value stepper honours), "
                     f"got {json.dumps(value)}")


def _entries(f: Fields, block: dict, at: str, field: str, allow_empty: bool = False) -> tuple[str, ...]:
    """A list of module names and "re:" patterns, each pattern in the subset whose work is bounded
    (stepper.untrusted.regex_subset)."""
    entries = block.get(field, [] if allow_empty else None)
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries) or not (entries or allow_empty):
        raise f.fail(at, f"must be a list of module names or 're:' patterns, got {said(entries)}")
    for entry in entries:
        why = patterns.refusal(entry[3:]) if entry.startswith("re:") else None
        if why is not None:
            raise f.fail(at, f"holds '{cut(entry, 80)}', which {why}")
    return tuple(entries)


def _check_consistency(cfg: Config, f: Fields) -> None:
    """Relations between fields that a single field's check cannot see."""
    if cfg.qk_rope_head_dim % 2:
        raise f.fail("qk_rope_head_dim", f"must be even (rotary dims come in pairs), got {cfg.qk_rope_head_dim}")
    if cfg.has_indexer and cfg.index_head_dim < cfg.qk_rope_head_dim:
        raise f.fail("index_head_dim", f"({cfg.index_head_dim}) must be at least qk_rope_head_dim "
                     f"({cfg.qk_rope_head_dim}): the indexer rotates its first qk_rope_head_dim dims")
    if cfg.first_k_dense_replace > cfg.num_hidden_layers:
        raise f.fail(
            "first_k_dense_replace",
            f"({cfg.first_k_dense_replace}) must not exceed num_hidden_layers ({cfg.num_hidden_layers})",
        )
    check_router(cfg, f)


def check_router(cfg: Any, f: Fields) -> None:
    """The router's sizes against each other: the experts chosen fit in the kept groups, each group
    two experts or more (it scores by its top 2). A family spelling the fields otherwise (Kimi
    Linear's num_experts) reads its file with `Fields(..., spelled)`, so each message names its field."""
    if cfg.n_routed_experts == 0:
        return
    zero = f" + zero_expert_num ({cfg.zero_experts})" if cfg.zero_experts else ""  # LongCat's router chooses them too
    if cfg.num_experts_per_tok > cfg.n_routed_experts + cfg.zero_experts:
        raise f.fail(
            "num_experts_per_tok",
            f"({cfg.num_experts_per_tok}) must not exceed n_routed_experts ({cfg.n_routed_experts}){zero}",
        )
    if cfg.n_routed_experts % cfg.n_group:
        raise f.fail("n_group", f"({cfg.n_group}) must divide n_routed_experts ({cfg.n_routed_experts})")
    per_group = cfg.n_routed_experts // cfg.n_group
    if cfg.topk_method == "noaux_tc" and cfg.n_group > 1 and per_group < 2:
        raise f.fail("n_group", f"leaves {per_group} expert per group; a group scores by its top 2")
    if cfg.topk_group > cfg.n_group:
        raise f.fail("topk_group", f"({cfg.topk_group}) must not exceed n_group ({cfg.n_group})")
    if cfg.topk_method != "greedy" and cfg.num_experts_per_tok > cfg.topk_group * per_group + cfg.zero_experts:
        raise f.fail(
            "num_experts_per_tok",
            f"({cfg.num_experts_per_tok}) exceeds the experts in the kept groups "
            f"(topk_group {cfg.topk_group} x {per_group} per group){zero}",
        )
