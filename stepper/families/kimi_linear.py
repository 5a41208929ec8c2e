"""Kimi Linear (`model_type: kimi_linear`, Kimi-Linear-48B-A3B): most layers' attention is Kimi
Delta Attention (stepper.model.kda, a fixed-size state per head), the others MLA without RoPE
(stepper.model.mla_nope); the FFN is a dense SwiGLU in the first `first_k_dense_replace` layers
and a MoE with Kimi's router (sigmoid scores, a bias to choose by, renormalised, times
routed_scaling_factor) after.

This module is the family: its config (read from the published config.json, refused one line
naming the field), the tensors of its published checkpoint layout, the weights' names as the
parts ask for them, and the decoder layer composed of the parts.

On disk (published): `model.layers.N.self_attn.{q,k,v}_proj`, `{q,k,v}_conv1d.weight` [H*K, 1, W],
`A_log` [1, 1, H, 1], `dt_bias` [H*K], `f_a_proj`, `f_b_proj`, `b_proj`, `g_a_proj`, `g_b_proj`,
`o_norm`, `o_proj` in KDA layers; MLA's `q_proj` (no q_lora), `kv_a_proj_with_mqa`,
`kv_a_layernorm`, `kv_b_proj`, `o_proj`; `block_sparse_moe.{gate, experts.E.w1/w2/w3,
shared_experts}` (w1 gate, w3 up, w2 down); the dense layers' `mlp.{gate,up,down}_proj`.
Emitted names follow transformers' modules: the MoE's are `mlp.*` as in the other families.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from stepper.config import _Fields, model_name
from stepper.errors import StepperError
from stepper.kernels.linear import linear_in_row_blocks
from stepper.model.cache import LayerCache
from stepper.model.kda import Form, KdaCache, kda_attention
from stepper.model.layer_weights import LayerWeights
from stepper.model.mla_nope import mla_nope_attention
from stepper.model.mlp import dense_mlp
from stepper.model.moe import moe
from stepper.model.ops import rms_norm
from stepper.seams.trace import Emitter
from stepper.untrusted.jsonfile import read_json
from stepper.weights.stored import Stored

MODEL_TYPE = "kimi_linear"
ARCHITECTURE = "KimiLinearForCausalLM"


@dataclass(frozen=True)
class KimiLinearConfig:
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

    model_type: ClassVar[str] = MODEL_TYPE
    q_lora_rank: ClassVar[None] = None  # Kimi Linear's MLA projects its queries directly (q_proj)
    scoring_func: ClassVar[str] = "sigmoid"
    topk_method: ClassVar[str] = "noaux_tc"
    has_indexer: ClassVar[bool] = False
    quantization: ClassVar[None] = None
    int4: ClassVar[None] = None
    wrapper: ClassVar[None] = None
    rope_theta: ClassVar[float] = 10000.0  # the published value; the MLA layers rotate nothing
    rope_scaling: ClassVar[None] = None

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def is_kda_layer(self, layer: int) -> bool:
        return layer in self.kda_layers

    def is_moe_layer(self, layer: int) -> bool:
        """The published rule (and transformers'): dense before first_k_dense_replace, MoE after."""
        return self.n_routed_experts > 0 and layer >= self.first_k_dense_replace

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
                "kda_layers": [i + 1 for i in self.kda_layers], "full_attn_layers": [i + 1 for i in self.full_attn_layers],
                "num_heads": self.linear_num_heads, "head_dim": self.linear_head_dim,
                "short_conv_kernel_size": self.short_conv_kernel_size,
            },
        }


def load_config(path: str | Path) -> KimiLinearConfig:
    """Read and check a Kimi Linear config.json."""
    raw = read_json(Path(path), "a config.json")
    if not isinstance(raw, dict):
        raise StepperError(f"{path}: expected a JSON object, found {type(raw).__name__}")
    return parse(raw, str(path))


def parse(raw: dict[str, Any], source: str) -> KimiLinearConfig:
    """The published config.json -> KimiLinearConfig; anything stepper cannot run is one line
    naming the file and the field."""
    f = _Fields(raw, source)
    if f.str("model_type") != MODEL_TYPE:
        raise f.fail("model_type", f"must be {MODEL_TYPE!r} here, got {raw['model_type']!r}")
    for field, only in (("hidden_act", "silu"), ("moe_router_activation_func", "sigmoid")):
        if raw.get(field, only) != only:
            raise f.fail(field, f"must be {only!r} (the only kind stepper runs), got {raw[field]!r}")
    if raw.get("mla_use_nope") is False:
        raise f.fail("mla_use_nope", "must be true: Kimi Linear's MLA layers have no RoPE")
    if f.bool("tie_word_embeddings", default=False):
        raise f.fail("tie_word_embeddings", "must be false: stepper reads lm_head.weight as its own matrix")
    if f.int("moe_layer_freq", default=1) != 1:
        raise f.fail("moe_layer_freq", f"must be 1 (every layer from first_k_dense_replace on is MoE), "
                     f"got {raw['moe_layer_freq']}")
    heads = f.int("num_attention_heads")
    if f.int("num_key_value_heads", default=heads) != heads:
        raise f.fail("num_key_value_heads", f"must equal num_attention_heads ({heads}) in MLA, got "
                     f"{raw['num_key_value_heads']}")
    if raw.get("q_lora_rank") is not None:
        raise f.fail("q_lora_rank", f"must be null: Kimi Linear's MLA has one q_proj, got {raw['q_lora_rank']!r}")
    layers = f.int("num_hidden_layers")
    linear = raw.get("linear_attn_config")
    if not isinstance(linear, dict):
        raise f.fail("linear_attn_config", f"must be an object (kda_layers, full_attn_layers, num_heads, head_dim, "
                     f"short_conv_kernel_size), got {linear!r}")
    inner = LinearAttnFields(linear, source)
    kda, full = layer_kinds(linear, layers, f)
    cfg = KimiLinearConfig(
        name=model_name(raw, source),
        vocab_size=f.int("vocab_size"),
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
        rms_norm_eps=f.float("rms_norm_eps", default=1e-5),
        max_position_embeddings=f.int("model_max_length", default=1048576),
        linear_num_heads=inner.int("num_heads"),
        linear_head_dim=inner.int("head_dim"),
        short_conv_kernel_size=inner.int("short_conv_kernel_size"),
        kda_layers=kda,
        full_attn_layers=full,
    )
    check_experts(cfg, f)
    return cfg


class LinearAttnFields(_Fields):
    """linear_attn_config's own fields, named with it in messages."""

    def fail(self, field: str, why: str) -> StepperError:
        return super().fail(f"linear_attn_config.{field}", why)


def layer_kinds(linear: dict[str, Any], layers: int, f: _Fields) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """linear_attn_config's kda_layers and full_attn_layers (1-based) -> 0-based tuples: every
    layer 1..num_hidden_layers in exactly one of them."""
    lists = {}
    for field in ("kda_layers", "full_attn_layers"):
        value = linear.get(field)
        if not isinstance(value, list) or not all(isinstance(n, int) and not isinstance(n, bool) for n in value):
            raise f.fail(f"linear_attn_config.{field}", f"must be a list of 1-based layer numbers, got {value!r}")
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


def check_experts(cfg: KimiLinearConfig, f: _Fields) -> None:
    if cfg.n_routed_experts == 0:
        return
    if cfg.num_experts_per_tok > cfg.n_routed_experts:
        raise f.fail("num_experts_per_token", f"({cfg.num_experts_per_tok}) must not exceed num_experts "
                     f"({cfg.n_routed_experts})")
    if cfg.n_routed_experts % cfg.n_group or cfg.topk_group > cfg.n_group:
        raise f.fail("num_expert_group", f"({cfg.n_group}) must divide num_experts ({cfg.n_routed_experts}) and "
                     f"be at least topk_group ({cfg.topk_group})")


# -- the published checkpoint's tensors --------------------------------------------------------

EXPERT_WEIGHTS = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}  # the parts' name -> published


def kda_shapes(cfg: KimiLinearConfig) -> dict[str, tuple[int, ...]]:
    d, H, K, W = cfg.hidden_size, cfg.linear_num_heads, cfg.linear_head_dim, cfg.short_conv_kernel_size
    shapes: dict[str, tuple[int, ...]] = {}
    for name in ("q", "k", "v"):
        shapes[f"self_attn.{name}_proj.weight"] = (H * K, d)
        shapes[f"self_attn.{name}_conv1d.weight"] = (H * K, 1, W)
    shapes.update({
        "self_attn.A_log": (1, 1, H, 1), "self_attn.dt_bias": (H * K,),
        "self_attn.f_a_proj.weight": (K, d), "self_attn.f_b_proj.weight": (H * K, K),
        "self_attn.b_proj.weight": (H, d),
        "self_attn.g_a_proj.weight": (K, d), "self_attn.g_b_proj.weight": (H * K, K),
        "self_attn.o_norm.weight": (K,), "self_attn.o_proj.weight": (d, H * K),
    })
    return shapes


def mla_shapes(cfg: KimiLinearConfig) -> dict[str, tuple[int, ...]]:
    d, h = cfg.hidden_size, cfg.num_attention_heads
    return {
        "self_attn.q_proj.weight": (h * cfg.qk_head_dim, d),
        "self_attn.kv_a_proj_with_mqa.weight": (cfg.kv_lora_rank + cfg.qk_rope_head_dim, d),
        "self_attn.kv_a_layernorm.weight": (cfg.kv_lora_rank,),
        "self_attn.kv_b_proj.weight": (h * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank),
        "self_attn.o_proj.weight": (d, h * cfg.v_head_dim),
    }


def ffn_shapes(cfg: KimiLinearConfig, layer: int) -> dict[str, tuple[int, ...]]:
    d = cfg.hidden_size

    def swiglu(prefix: str, inter: int, names=("gate_proj", "up_proj", "down_proj")) -> dict[str, tuple[int, ...]]:
        gate, up, down = names
        return {f"{prefix}{gate}.weight": (inter, d), f"{prefix}{up}.weight": (inter, d),
                f"{prefix}{down}.weight": (d, inter)}

    if not cfg.is_moe_layer(layer):
        return swiglu("mlp.", cfg.intermediate_size)
    shapes = {"block_sparse_moe.gate.weight": (cfg.n_routed_experts, d),
              "block_sparse_moe.gate.e_score_correction_bias": (cfg.n_routed_experts,)}
    for e in range(cfg.n_routed_experts):
        shapes.update(swiglu(f"block_sparse_moe.experts.{e}.", cfg.moe_intermediate_size, ("w1", "w3", "w2")))
    if cfg.n_shared_experts:
        shapes.update(swiglu("block_sparse_moe.shared_experts.", cfg.moe_intermediate_size * cfg.n_shared_experts))
    return shapes


def layer_shapes(cfg: KimiLinearConfig, layer: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of one decoder layer, by its published name, with its shape."""
    d = cfg.hidden_size
    attention = kda_shapes(cfg) if cfg.is_kda_layer(layer) else mla_shapes(cfg)
    shapes = {"input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,), **attention,
              **ffn_shapes(cfg, layer)}
    return {f"model.layers.{layer}.{k}": v for k, v in shapes.items()}


def global_shapes(cfg: KimiLinearConfig) -> dict[str, tuple[int, ...]]:
    return {"model.embed_tokens.weight": (cfg.vocab_size, cfg.hidden_size), "model.norm.weight": (cfg.hidden_size,),
            "lm_head.weight": (cfg.vocab_size, cfg.hidden_size)}


def weight_shapes(cfg: KimiLinearConfig) -> dict[str, tuple[int, ...]]:
    shapes = dict(global_shapes(cfg))
    for layer in range(cfg.num_hidden_layers):
        shapes.update(layer_shapes(cfg, layer))
    return shapes


def storage_dtype(name: str) -> str:
    """How the published checkpoint stores a tensor: the decay's parameters and the router's bias
    in float32, everything else BF16."""
    return "F32" if name.endswith(("A_log", "dt_bias", "e_score_correction_bias")) else "BF16"


def what(name: str) -> str:
    """A few words on a tensor, for messages about it."""
    for tail, words in (("A_log", "the per-head decay rate's log"), ("conv1d.weight", "a causal short conv's taps"),
                        ("dt_bias", "the forget gate's bias")):
        if name.endswith(tail):
            return f" ({words})"
    return ""


def on_disk(name: str) -> str:
    """The published name of a layer-relative name the parts ask for: the MoE's `mlp.gate.*`,
    `mlp.experts.E.gate_proj.weight`, `mlp.shared_experts.*` live under `block_sparse_moe`, its
    experts' projections as w1 (gate), w3 (up), w2 (down)."""
    if not name.startswith(("mlp.gate.", "mlp.experts.", "mlp.shared_experts.")):
        return name
    name = "block_sparse_moe." + name.removeprefix("mlp.")
    if name.startswith("block_sparse_moe.experts."):
        head, projection, tail = name.rsplit(".", 2)
        name = f"{head}.{EXPERT_WEIGHTS[projection]}.{tail}"
    return name


class PublishedLayerWeights(LayerWeights):
    """A layer's weights asked for by the parts' names, read under the published ones (on_disk)."""

    def __call__(self, name: str) -> np.ndarray:
        return super().__call__(on_disk(name))

    def matrix(self, name: str):
        return super().matrix(on_disk(name))

    def float32(self, name: str) -> np.ndarray:
        return super().float32(on_disk(name))


class KimiLinearWeights:
    """The published tensors, from arrays in memory or a checkpoint folder's safetensors files
    (`open_checkpoint`); each is checked against the config's shape when read."""

    def __init__(self, config: KimiLinearConfig, read, names, source: str):
        self.config = config
        self._read = read  # name -> Stored
        self.names = set(names)
        self.source = source

    @classmethod
    def of_arrays(cls, config: KimiLinearConfig, arrays: dict[str, np.ndarray], source: str = "weights"):
        return cls(config, lambda name: Stored("F32", np.asarray(arrays[name], np.float32)), arrays, source)

    def expected_shape(self, name: str) -> tuple[int, ...]:
        if name.startswith("model.layers."):
            layer = int(name.split(".")[2])
            shapes = layer_shapes(self.config, layer) if 0 <= layer < self.config.num_hidden_layers else {}
        else:
            shapes = global_shapes(self.config)
        if name not in shapes:
            raise StepperError(f"{self.source}: no tensor named '{name}' in a {MODEL_TYPE} model")
        return shapes[name]

    def stored(self, name: str) -> Stored:
        expected = self.expected_shape(name)
        if name not in self.names:
            raise StepperError(f"{self.source}: tensor '{name}'{what(name)} is missing, expected {list(expected)}")
        stored = self._read(name)
        if tuple(stored.data.shape) != expected:
            raise StepperError(f"{self.source}: tensor '{name}'{what(name)} has shape {list(stored.data.shape)}, "
                               f"expected {list(expected)}")
        return stored

    def get(self, name: str) -> np.ndarray:
        return self.stored(name).as_float32(name)

    def matrix(self, name: str):
        return self.stored(name).matrix(name)

    def get_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        return self.get(name)[rows]

    def row_blocks(self, name: str, rows: int):
        return self.stored(name).row_blocks(rows)

    def has(self, name: str) -> bool:
        return name in self.names

    def check(self, layers, with_globals: bool) -> None:
        """Every tensor these layers need is there with its shape: the first problem, one line."""
        needed = {n: s for layer in layers for n, s in layer_shapes(self.config, layer).items()}
        needed.update(global_shapes(self.config) if with_globals else {})
        for name in needed:
            self.stored(name)


def open_checkpoint(path: str | Path) -> KimiLinearWeights:
    """A folder with config.json and *.safetensors in the published layout."""
    from stepper.weights.safetensors_reader import SafetensorsFile

    path = Path(path)
    config = load_config(path / "config.json")
    files = [SafetensorsFile(p) for p in sorted(path.glob("*.safetensors"))]
    where = {name: f for f in files for name in f.names()}

    def read(name: str) -> Stored:
        return Stored(where[name].info(name).dtype, where[name].get(name))

    return KimiLinearWeights(config, read, where, str(path))


# -- the model ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """A run's choices: KDA's form (token by token, or chunked), MLA's path, the experts' dispatch."""

    kda_form: Form = "chunked"
    attn: str = "naive"
    dispatch: str = "grouped"


def miniature(cfg: KimiLinearConfig, layer: int) -> KimiLinearConfig:
    """A one-layer config of tiny sizes whose layer 0 takes the branches `layer` of cfg takes: KDA
    or MLA, MoE (with the router's groups and shared experts) or dense."""
    moe = cfg.is_moe_layer(layer)
    return dataclasses.replace(
        cfg, name=f"miniature of {cfg.name}", vocab_size=16, hidden_size=16, intermediate_size=8,
        moe_intermediate_size=4, num_hidden_layers=1, num_attention_heads=2, kv_lora_rank=8, qk_nope_head_dim=4,
        qk_rope_head_dim=4, v_head_dim=4, n_routed_experts=2 * cfg.n_group if moe else 0,
        n_shared_experts=min(cfg.n_shared_experts, 1), num_experts_per_tok=min(cfg.num_experts_per_tok, 2),
        first_k_dense_replace=0, linear_num_heads=2, linear_head_dim=4,
        kda_layers=(0,) if cfg.is_kda_layer(layer) else (), full_attn_layers=() if cfg.is_kda_layer(layer) else (0,),
    )


def new_cache(cfg: KimiLinearConfig) -> list[KdaCache | LayerCache]:
    """Each layer's memory: a KDA layer's fixed-size conv inputs and state, an MLA layer's latents."""
    return [KdaCache() if cfg.is_kda_layer(i) else LayerCache() for i in range(cfg.num_hidden_layers)]


def decoder_layer(hidden: np.ndarray, w: LayerWeights, cfg: KimiLinearConfig, cache, emit: Emitter,
                  options: Options = Options()) -> np.ndarray:
    """[B, T, d] residual stream in -> [B, T, d] out: KDA or NoPE MLA, then the dense MLP or the MoE."""
    hidden = emit("hidden_states", hidden)
    x = emit("input_layernorm", rms_norm(hidden, w("input_layernorm.weight"), cfg.rms_norm_eps))
    if cfg.is_kda_layer(w.layer):
        attention = kda_attention(x, w, cfg, cache, emit, options.kda_form)
    else:
        attention = mla_nope_attention(x, w, cfg, cache, emit, options.attn)
    hidden = emit("attn_residual", hidden + attention)
    x = emit("post_attention_layernorm", rms_norm(hidden, w("post_attention_layernorm.weight"), cfg.rms_norm_eps))
    ffn = moe(x, w, cfg, emit, options.dispatch) if cfg.is_moe_layer(w.layer) else dense_mlp(x, w, emit)
    ffn = emit("mlp_output", ffn)
    return emit("output", hidden + ffn)


class KimiLinear:
    """The whole model on a weight source: embedding, the layers, final norm, lm_head. A cache
    (new_cache) passed along is extended in place, so a prefill then decode steps equal one pass."""

    def __init__(self, weights, options: Options = Options()):
        self.weights = weights
        self.config: KimiLinearConfig = weights.config
        self.options = options
        self.scratch: dict = {}

    def layer(self, i: int, hidden: np.ndarray, cache, emit: Emitter) -> np.ndarray:
        w = PublishedLayerWeights(self.weights, i, self.scratch)
        return decoder_layer(hidden, w, self.config, None if cache is None else cache[i], emit.layer(i), self.options)

    def forward(self, ids: np.ndarray, emit: Emitter, cache=None) -> np.ndarray:
        """ids [B, T] -> logits [B, T, V]."""
        hidden = emit("embed", np.asarray(self.weights.get_rows("model.embed_tokens.weight", ids), np.float32))
        for i in range(self.config.num_hidden_layers):
            hidden = self.layer(i, hidden, cache, emit)
        hidden = emit("norm", rms_norm(hidden, self.weights.get("model.norm.weight"), self.config.rms_norm_eps))
        blocks = (b.matrix("lm_head.weight") for b in self.weights.row_blocks("lm_head.weight", 4096))
        return emit("logits", linear_in_row_blocks(hidden, blocks, self.config.vocab_size))


# -- presets -----------------------------------------------------------------------------------

KIMI_LINEAR_48B = {  # moonshotai/Kimi-Linear-48B-A3B-Instruct's config.json (the fields stepper reads)
    "_name_or_path": "kimi-linear-48b-a3b",
    "architectures": [ARCHITECTURE],
    "model_type": MODEL_TYPE,
    "vocab_size": 163840,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "moe_intermediate_size": 1024,
    "num_hidden_layers": 27,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "head_dim": 72,  # published, unused (transformers sets head_dim to qk_rope_head_dim)
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "mla_use_nope": True,
    "num_experts": 256,
    "num_experts_per_token": 8,
    "num_shared_experts": 1,
    "num_expert_group": 1,
    "topk_group": 1,
    "moe_renormalize": True,
    "moe_router_activation_func": "sigmoid",
    "routed_scaling_factor": 2.446,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "model_max_length": 1048576,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "linear_attn_config": {
        "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
        "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
        "num_heads": 32,
        "head_dim": 128,
        "short_conv_kernel_size": 4,
    },
}

PRESETS: dict[str, dict[str, Any]] = {
    # Kimi Linear's 3:1 pattern in four layers: KDA, KDA, KDA, MLA; a dense first layer, then MoE
    "tiny-kimi-linear": {
        **KIMI_LINEAR_48B,
        "_name_or_path": "tiny-kimi-linear",
        "vocab_size": 1000,
        "hidden_size": 160,
        "intermediate_size": 272,
        "moe_intermediate_size": 48,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "kv_lora_rank": 64,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "num_experts": 16,
        "num_experts_per_token": 4,
        "model_max_length": 131072,
        "linear_attn_config": {"full_attn_layers": [4], "kda_layers": [1, 2, 3], "num_heads": 4, "head_dim": 32,
                               "short_conv_kernel_size": 4},
    },
    "kimi-linear-48b-a3b": KIMI_LINEAR_48B,
}


def preset(name: str) -> KimiLinearConfig:
    return parse(PRESETS[name], f"preset {name}")


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
    return (f"memory per layer (float32): KDA {kda:,} B in all (state {cfg.linear_num_heads}x{cfg.linear_head_dim}"
            f"x{cfg.linear_head_dim} + conv inputs), 0 B per position · MLA latent + key {mla:,} B per position · "
            f"at {positions:,} positions: {len(cfg.kda_layers)} KDA layers {fmt_bytes(kda_total)}, "
            f"{len(cfg.full_attn_layers)} MLA layers {fmt_bytes(mla_total)}")


def fmt_bytes(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


# -- synth: a checkpoint in the published layout -------------------------------------------------


def synth(cfg: KimiLinearConfig, raw: dict[str, Any], folder: Path, seed: int = 0, layers: range | None = None) -> Path:
    """Write config.json and model.safetensors of random weights in the published layout (BF16, the
    decay's parameters and the router's bias F32); `layers` limits which layers are written."""
    import json

    import ml_dtypes
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    wanted = range(cfg.num_hidden_layers) if layers is None else layers
    arrays = {}
    for name, shape in weight_shapes(cfg).items():
        if name.startswith("model.layers.") and int(name.split(".")[2]) not in wanted:
            continue
        value = synthetic_value(name, shape, rng)
        arrays[name] = value if storage_dtype(name) == "F32" else value.astype(ml_dtypes.bfloat16)
    (folder / "config.json").write_text(json.dumps(raw, indent=1))
    save_file(arrays, str(folder / "model.safetensors"))
    return folder


def synthetic_value(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """A weight at a scale that keeps the layer's activations in range: A_log = log(uniform(1, 16))
    and a small dt_bias as Kimi Linear initialises them, norms near 1, projections ~ 1/sqrt(fan-in)."""
    if name.endswith("A_log"):
        return np.log(rng.uniform(1, 16, shape)).astype(np.float32)
    if name.endswith("dt_bias"):
        return rng.uniform(-6, -2, shape).astype(np.float32)
    if name.endswith("norm.weight"):
        return (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith("e_score_correction_bias"):
        return (0.01 * rng.standard_normal(shape)).astype(np.float32)
    return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
