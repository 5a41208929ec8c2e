"""An independent PyTorch reference: transformers' `DeepseekV3ForCausalLM`, traced by name.

This module runs the Hugging Face implementation (float32, eager attention, eager expert loop) on
given weights and returns every tensor of `docs/names.md` (naive attention path) under its
canonical name and documented shape. It shares no code with `stepper`: the config is built from the
HF config.json dict, the weights are copied into the model's parameters by hand, and the tensors
are captured from transformers' own modules and functions:

* forward hooks / pre-hooks on modules (their inputs and outputs are the tensors transformers
  really materialises),
* temporary wrappers around the module-level functions `apply_rotary_pos_emb_interleave` and
  `eager_attention_forward` of `transformers.models.deepseek_v3.modeling_deepseek_v3` (restored in
  a `finally`),
* and, for values transformers only keeps in local variables (head views, the router's
  intermediates, the masked scores), a few documented torch derivations from captured tensors.

Public interface::

    hf_trace(config, weights, ids, start_pos=0, decode_ids=None, inv_freq=None) -> {name: array}
    hf_inv_freq(config) -> np.ndarray        # transformers' own YaRN inverse frequencies
    hf_softmax_scale(config) -> float        # DeepseekV3Attention.scaling
    hf_attention_scaling(config) -> float    # the YaRN cos/sin mscale (rotary attention_scaling)

plus the lower-level pieces `build_hf_config`, `build_hf_model` and `run_hf_trace` (which also
returns the model's own logits per phase, for self-checks).

Quirks of transformers 5.x handled here (see also the report in the self-check test):

* `rope_scaling` is a deprecated alias: `PreTrainedConfig.__init__` pops it (and `rope_theta`) into
  `rope_parameters`, adds `rope_type` from the legacy `type` key and mutates the dict in place, so
  the caller's dict is deep-copied first. The result is checked against the DeepSeek reference
  formulas (`_check_yarn`), so a silently dropped YaRN parameter cannot pass unnoticed.
* The routed experts are stored fused: `experts.gate_up_proj` [E, 2*moe_inter, d] with rows
  `cat(gate_proj.weight, up_proj.weight)` per expert, `experts.down_proj` [E, d, moe_inter].
* `experts_implementation` must be forced to "eager" (otherwise a batched/grouped-mm kernel may be
  chosen), as must `attn_implementation` (the sdpa path never materialises the weights).
* `num_key_value_heads` is meaningless for MLA (kv_b_proj always produces all heads), but
  transformers uses it in `repeat_kv`; it is forced to `num_attention_heads`.
* The eager causal mask is additive (0 or finfo.min), built from cache offsets (not from
  position_ids), so a prefill at start_pos > 0 with an empty cache gets the ordinary T x T mask.
"""

from __future__ import annotations

import copy
import inspect
import math
import re
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import transformers.models.deepseek_v2.modeling_deepseek_v2 as hf_ds2
import transformers.models.deepseek_v3.modeling_deepseek_v3 as hf_ds3
import transformers.models.deepseek_v32.modeling_deepseek_v32 as hf_ds32
from transformers import (
    DeepseekV2Config,
    DeepseekV2ForCausalLM,
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    DeepseekV32Config,
    DeepseekV32ForCausalLM,
)
from transformers.cache_utils import DynamicCache

# one thread: these models are tiny, and a second OpenMP thread on a busy 2-core machine makes
# each small op wait tens of milliseconds for it (a trace took 2.4 s instead of 0.02 s)
torch.set_num_threads(1)

__all__ = [
    "LAYER_NAMES_ATTN",
    "LAYER_NAMES_DENSE",
    "LAYER_NAMES_MOE",
    "build_hf_config",
    "build_hf_model",
    "hf_attention_scaling",
    "hf_inv_freq",
    "hf_softmax_scale",
    "hf_trace",
    "run_hf_trace",
]

# ---------------------------------------------------------------------------------------------
# Canonical names, in the emission order of docs/names.md (naive path; the two absorbed-only
# names `self_attn.q_nope_absorbed` / `self_attn.attn_output_latent` are never produced here).
# ---------------------------------------------------------------------------------------------

LAYER_NAMES_ATTN = [
    "hidden_states",
    "input_layernorm",
    "self_attn.q_a",  # only when q_lora_rank is set
    "self_attn.q_a_norm",  # only when q_lora_rank is set
    "self_attn.q",
    "self_attn.q_nope",
    "self_attn.q_pe",
    "self_attn.kv_a",
    "self_attn.compressed_kv",
    "self_attn.k_pe",
    "self_attn.compressed_kv_norm",
    "self_attn.kv",
    "self_attn.k_nope",
    "self_attn.q_pe_rope",
    "self_attn.k_pe_rope",
    "self_attn.query_states",
    "self_attn.key_states",
    "self_attn.value_states",
    "self_attn.attn_scores",
    "self_attn.attn_weights",
    "self_attn.attn_output",
    "self_attn.o_proj",
    "attn_residual",
    "post_attention_layernorm",
]
LAYER_NAMES_DENSE = ["mlp.gate_proj", "mlp.up_proj", "mlp.act"]
LAYER_NAMES_MOE = [
    "mlp.gate.logits",
    "mlp.gate.scores",
    "mlp.gate.scores_for_choice",
    "mlp.gate.group_scores",
    "mlp.gate.group_mask",
    "mlp.gate.topk_idx",
    "mlp.gate.topk_weight",
    "mlp.routed_output",
    "mlp.shared_output",
]
LAYER_NAMES_TAIL = ["mlp_output", "output"]
# The other families' own names (docs/names.md, last section), each after the name it follows.
LAYER_NAMES_FAMILIES = [
    ("mlp.gate.softmax_scores", "mlp.gate.scores"),  # V2
    ("mlp.gate.group_max", "mlp.gate.group_scores"),  # V2 group_limited_greedy
    ("self_attn.indexer.q", "input_layernorm"),  # V3.2
    ("self_attn.indexer.k", "self_attn.indexer.q"),
    ("self_attn.indexer.k_norm", "self_attn.indexer.k"),
    ("self_attn.indexer.q_rope", "self_attn.indexer.k_norm"),
    ("self_attn.indexer.k_rope", "self_attn.indexer.q_rope"),
    ("self_attn.indexer.keys", "self_attn.indexer.k_rope"),
    ("self_attn.indexer.head_weights", "self_attn.indexer.keys"),
    ("self_attn.indexer.index_scores", "self_attn.indexer.head_weights"),
    ("self_attn.indexer.topk_idx", "self_attn.indexer.index_scores"),
    ("self_attn.indexer.mask", "self_attn.indexer.topk_idx"),
]


def _with_family_names(order: list[str]) -> list[str]:
    order = list(order)
    for name, after in LAYER_NAMES_FAMILIES:
        if after in order:
            order.insert(order.index(after) + 1, name)
    return order

# Keys of an HF config.json that are not DeepseekV3Config fields and must not reach it.
_DROP_KEYS = ("model_type", "quantization_config", "auto_map", "torch_dtype", "dtype",
              "transformers_version", "_name_or_path", "architectures")

# The three MLA families transformers has, by model_type. `rope` is the module-level function the
# attention rotates with (wrapped to capture q_pe / k_pe); V2's rotates complex pairs and returns
# them interleaved (`interleaved_out`), which the trace re-lays as [evens | odds] like stepper and
# DeepSeek's V2 code. `checks` are config.json fields transformers ignores: values it would not honour.
_V3 = SimpleNamespace(module=hf_ds3, config=DeepseekV3Config, model=DeepseekV3ForCausalLM, moe=hf_ds3.DeepseekV3MoE,
                      rope="apply_rotary_pos_emb_interleave", interleaved_out=False, extra={"rope_interleave": True},
                      checks={"scoring_func": "sigmoid", "topk_method": "noaux_tc"},
                      drop=("scoring_func", "topk_method"))
FAMILIES = {
    "deepseek_v3": _V3,
    "kimi_k2": _V3,
    "deepseek_v2": SimpleNamespace(module=hf_ds2, config=DeepseekV2Config, model=DeepseekV2ForCausalLM,
                                   moe=hf_ds2.DeepseekV2Moe, rope="apply_rotary_emb", interleaved_out=True, extra={},
                                   checks={"scoring_func": "softmax", "norm_topk_prob": False},
                                   drop=("scoring_func", "norm_topk_prob")),
    "deepseek_v32": SimpleNamespace(module=hf_ds32, config=DeepseekV32Config, model=DeepseekV32ForCausalLM,
                                    moe=hf_ds32.DeepseekV32MoE, rope="apply_rotary_pos_emb_interleave",
                                    interleaved_out=False, extra={},
                                    checks={"scoring_func": "sigmoid", "topk_method": "noaux_tc"},
                                    drop=("scoring_func", "topk_method")),
}


def register(model_type: str, family: SimpleNamespace) -> None:
    """Trace another MLA family's model (helpers.hf_families). `family` has the fields of FAMILIES'
    entries (`moe` None for a family without experts; `config`/`model`/`extra`/`checks`/`drop` only
    where build_hf_model builds it from a config dict) and optionally the steps of what it adds:
      names           (name, after) pairs: where its own layer tensors go in the documented order
      extend(rec)     installs more hooks on rec.model (appending their handles to rec.handles)
      wraps           {function name in its module: make(rec, orig) -> the function that records}
      wrap_rope(rec, orig)   wraps its rope function itself (GLM-5: MLA's and the indexer's in one)
      indexed, index_rope    a V3.2 indexer (default: the module has one) and its rope function's name
                             (None: wrap_rope covers it)
      derive(model, i, raw)  layer i's own tensors from its captured ones
      derive_router(moe, raw, B, T, i)  another router's tensors in place of V3's
      derive_globals(model, glob)       the model's own global tensors
      rename(name)    a published weight name -> transformers' (helpers.hf_families.hf_trace)"""
    FAMILIES[model_type] = family
    LAYER_NAMES_FAMILIES.extend(n for n in getattr(family, "names", ()) if n not in LAYER_NAMES_FAMILIES)


def moe_classes() -> tuple[type, ...]:
    """The MoE block classes of every registered family (helpers.hf_families registers more)."""
    return tuple({f.moe for f in FAMILIES.values() if f.moe is not None})


def _family_step(model, step: str):
    """A registered family's extra step (see register); None when it has none."""
    return getattr(FAMILIES[model.config.model_type], step, None)


def family_of(config: dict[str, Any]) -> SimpleNamespace:
    return FAMILIES[config.get("model_type", "deepseek_v3")]


def _halves(x: torch.Tensor) -> torch.Tensor:
    """Interleaved rotary pairs (x0, x1), (x2, x3), ... re-laid as [evens | odds]."""
    return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)


# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------

def _mscale(scale: float, m: float) -> float:
    """DeepSeek's yarn_get_mscale (reference formula, used only to check transformers)."""
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def build_hf_config(config: dict[str, Any]) -> DeepseekV3Config:
    """A float32, eager `DeepseekV3Config` (interleaved RoPE), `DeepseekV2Config` or
    `DeepseekV32Config`, by the model_type of an HF config.json dict."""
    family = family_of(config)
    d = copy.deepcopy(dict(config))  # transformers mutates rope dicts in place
    for key in _DROP_KEYS:
        d.pop(key, None)
    # Fields transformers ignores silently: refuse values it would not honour.
    checks = {**family.checks, "moe_layer_freq": 1, "attention_bias": False}
    for key, want in checks.items():
        if key in d and d[key] != want:
            raise NotImplementedError(
                f"hf_reference: config {key}={d[key]!r} is not supported by transformers' "
                f"{family.model.__name__} (it always behaves as {key}={want!r})")
    d.pop("moe_layer_freq", None)
    for key in family.drop:
        d.pop(key, None)
    # MLA has no grouped KV heads: kv_b_proj produces all heads; transformers' repeat_kv would
    # otherwise multiply them by num_attention_heads // num_key_value_heads.
    d["num_key_value_heads"] = d["num_attention_heads"]
    cfg = family.config(
        **d,
        **family.extra,
        attn_implementation="eager",
        experts_implementation="eager",
        dtype=torch.float32,
    )
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    _check_yarn(config, cfg)
    return cfg


def _check_yarn(raw: dict[str, Any], cfg: DeepseekV3Config) -> None:
    """Check that transformers kept the YaRN parameters of the config.json (rope_scaling)."""
    rs = raw.get("rope_scaling") or raw.get("rope_parameters")
    rp = cfg.rope_parameters
    if not rs:
        return
    kind = rs.get("rope_type", rs.get("type"))
    if rp.get("rope_type") != kind:
        raise RuntimeError(f"hf_reference: rope type {kind!r} became {rp.get('rope_type')!r}")
    for key in ("factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
                "original_max_position_embeddings"):
        if key in rs and rp.get(key) != rs[key]:
            raise RuntimeError(f"hf_reference: rope parameter {key}={rs[key]!r} became {rp.get(key)!r}")
    theta = raw.get("rope_theta", rs.get("rope_theta"))
    if theta is not None and rp.get("rope_theta") != theta:
        raise RuntimeError(f"hf_reference: rope_theta {theta!r} became {rp.get('rope_theta')!r}")


# ---------------------------------------------------------------------------------------------
# Model and weights
# ---------------------------------------------------------------------------------------------

_EXPERT_RE = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def _expert_slice(targets: dict[str, torch.Tensor], prefix: str, e: int, proj: str) -> torch.Tensor | None:
    """Expert e's gate, up or down weight inside the fused expert parameters; None when there is none."""
    if prefix + "gate_up_proj" not in targets:
        return None
    gate_up = targets[prefix + "gate_up_proj"]  # [E, 2*inter, d] = cat(gate, up)
    down = targets[prefix + "down_proj"]  # [E, d, inter]
    inter = down.shape[2]
    if not 0 <= e < gate_up.shape[0]:
        return None
    if proj == "gate_proj":
        return gate_up[e, :inter]
    if proj == "up_proj":
        return gate_up[e, inter:]
    return down[e]


def build_hf_model(config: dict[str, Any], weights: dict[str, np.ndarray],
                   inv_freq: np.ndarray | None = None) -> DeepseekV3ForCausalLM:
    """Build the model and copy `weights` (HF checkpoint names) into it.

    Every parameter and every `e_score_correction_bias` buffer must be set exactly once (fused
    expert tensors: every expert's gate, up and down slice exactly once); unknown names are errors.
    """
    cfg = build_hf_config(config)
    torch.manual_seed(0)  # irrelevant (everything is overwritten) but keeps any failure reproducible
    model = family_of(config).model(cfg).to(torch.float32).eval()
    _check_constants(model, config)

    targets: dict[str, torch.Tensor] = dict(model.named_parameters())
    for name, buf in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            targets[name] = buf
    counts = {name: 0 for name in targets}
    expert_counts: dict[tuple[str, int, str], int] = {}
    unknown = []

    with torch.no_grad():
        for name, arr in weights.items():
            src = torch.from_numpy(np.array(arr, dtype=np.float32))  # a copy: a kept seeded weight is read-only
            m = _EXPERT_RE.match(name)
            if m:
                prefix, e, proj = f"model.layers.{m.group(1)}.mlp.experts.", int(m.group(2)), m.group(3)
                dst = _expert_slice(targets, prefix, e, proj)
                if dst is None:
                    unknown.append(name)
                    continue
                _copy(dst, src, name)
                key = (prefix, e, proj)
                expert_counts[key] = expert_counts.get(key, 0) + 1
                continue
            if name not in targets:  # also lm_head.weight where the embeddings are tied
                unknown.append(name)
                continue
            _copy(targets[name], src, name)
            counts[name] += 1

    if unknown:
        raise KeyError(f"hf_reference: weights not in the model: {sorted(unknown)[:10]}"
                       f"{' ...' if len(unknown) > 10 else ''}")
    # The fused expert parameters count as set when every slice was set exactly once.
    for name, tensor in targets.items():
        if name.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")):
            prefix = name[: name.rindex("experts.") + len("experts.")]
            projs = ("gate_proj", "up_proj") if name.endswith("gate_up_proj") else ("down_proj",)
            per = [expert_counts.get((prefix, e, p), 0) for e in range(tensor.shape[0]) for p in projs]
            counts[name] = per[0] if len(set(per)) == 1 else -1
    bad = {n: c for n, c in counts.items() if c != 1}
    if bad:
        raise KeyError(f"hf_reference: parameters not set exactly once (name: count): "
                       f"{dict(sorted(bad.items())[:10])}")

    if inv_freq is not None:
        _load_inv_freq(model, inv_freq)
    return model


def _copy(dst: torch.Tensor, src: torch.Tensor, name: str) -> None:
    if tuple(dst.shape) != tuple(src.shape):
        raise ValueError(f"hf_reference: weight {name}: expected shape {tuple(dst.shape)}, "
                         f"got {tuple(src.shape)}")
    dst.copy_(src)


def _load_inv_freq(model: DeepseekV3ForCausalLM, inv_freq: np.ndarray) -> None:
    rot = model.model.rotary_emb
    arr = np.asarray(inv_freq)
    if arr.dtype != np.float32 or arr.shape != tuple(rot.inv_freq.shape):
        raise ValueError(f"hf_reference: inv_freq must be float32 {tuple(rot.inv_freq.shape)}, "
                         f"got {arr.dtype} {arr.shape}")
    with torch.no_grad():
        rot.inv_freq.copy_(torch.from_numpy(arr.copy()))
        rot.original_inv_freq.copy_(torch.from_numpy(arr.copy()))


def _check_constants(model: DeepseekV3ForCausalLM, raw: dict[str, Any]) -> None:
    """After construction: cos/sin mscale and softmax scale follow the DeepSeek reference."""
    cfg = model.config
    rs = raw.get("rope_scaling") or {}
    qk_head = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    att = model.model.rotary_emb.attention_scaling
    attn = model.model.layers[0].self_attn if len(model.model.layers) else None
    attn = attn[0] if isinstance(attn, torch.nn.ModuleList) else attn  # LongCat: two attention sublayers
    scale = None if attn is None else attn.scaling
    if rs.get("rope_type", rs.get("type")) == "yarn":
        f = rs["factor"]
        want_att = _mscale(f, rs.get("mscale", 1)) / _mscale(f, rs.get("mscale_all_dim", 0))
        want_scale = qk_head ** -0.5
        if rs.get("mscale_all_dim"):
            want_scale *= _mscale(f, rs["mscale_all_dim"]) ** 2
    elif rs.get("rope_type", rs.get("type")) == "longrope":  # MiniCPM3: LongRoPE's attention factor
        original = rs["original_max_position_embeddings"]
        f = rs.get("factor", raw["max_position_embeddings"] / original)
        want_att = rs.get("attention_factor", math.sqrt(1 + math.log(f) / math.log(original)) if f > 1 else 1.0)
        want_scale = qk_head ** -0.5
    else:
        want_att, want_scale = 1.0, qk_head ** -0.5
    if not math.isclose(att, want_att, rel_tol=1e-12):
        raise RuntimeError(f"hf_reference: rotary attention_scaling {att} != reference {want_att}")
    if scale is not None and not math.isclose(scale, want_scale, rel_tol=1e-12):
        raise RuntimeError(f"hf_reference: attention scaling {scale} != reference {want_scale}")


def hf_inv_freq(config: dict[str, Any]) -> np.ndarray:
    """transformers' own inverse frequencies (float32 torch arithmetic), [qk_rope_head_dim // 2]."""
    cfg = build_hf_config(config)
    return _rotary_class(config)(cfg).inv_freq.detach().numpy().astype(np.float32)


def hf_attention_scaling(config: dict[str, Any]) -> float:
    """transformers' cos/sin multiplier (`rotary_emb.attention_scaling`)."""
    cfg = build_hf_config(config)
    return float(_rotary_class(config)(cfg).attention_scaling)


def _rotary_class(config: dict[str, Any]):
    module = family_of(config).module
    return next(getattr(module, n) for n in dir(module) if n.endswith("RotaryEmbedding"))


def hf_softmax_scale(config: dict[str, Any]) -> float:
    """transformers' softmax scale (`DeepseekV3Attention.scaling`), built on the meta device."""
    cfg = build_hf_config(config)
    module = family_of(config).module
    attention = next(getattr(module, n) for n in dir(module) if n.startswith("Deepseek") and n.endswith("Attention"))
    with torch.device("meta"):
        attn = attention(cfg, layer_idx=0)
    return float(attn.scaling)


# ---------------------------------------------------------------------------------------------
# Capture
# ---------------------------------------------------------------------------------------------

def _c(t):
    """A detached copy of a tensor (or of each tensor of a tuple, e.g. the router's output)."""
    if isinstance(t, (tuple, list)):
        return tuple(_c(x) for x in t)
    return t.detach().clone()


class _Recorder:
    """Hooks and function wrappers filling `self.raw[layer][key]` for one forward pass."""

    def __init__(self, model: DeepseekV3ForCausalLM):
        self.model = model
        self.cfg = model.config
        self.handles: list[Any] = []
        self.layer: int | None = None  # decoder layer currently running
        self.reset()

    def reset(self) -> None:
        self.glob: dict[str, torch.Tensor] = {}
        self.raw: dict[int, dict[str, Any]] = {}

    def put(self, key: str, value: Any, layer: int | None = None) -> None:
        store = self.raw.setdefault(self.layer if layer is None else layer, {})
        if key in store:
            raise RuntimeError(f"hf_reference: {key} captured twice in layer {self.layer}")
        store[key] = value

    # --- hooks -------------------------------------------------------------------------------
    def _out(self, key: str, glob: bool = False):
        def hook(module, args, output):
            if glob:
                self.glob[key] = _c(output)
            else:
                self.put(key, _c(output))
        return hook

    def _in(self, key: str):
        def hook(module, args):
            self.put(key, _c(args[0]))
        return hook

    def install(self) -> None:
        m = self.model
        reg = self.handles.append
        reg(m.model.embed_tokens.register_forward_hook(self._out("embed", glob=True)))
        reg(m.model.rotary_emb.register_forward_hook(self._rotary_hook))
        reg(m.model.norm.register_forward_hook(self._out("norm", glob=True)))
        reg(m.lm_head.register_forward_hook(self._out("logits", glob=True)))
        for i, layer in enumerate(m.model.layers):
            reg(layer.register_forward_pre_hook(self._layer_pre(i), with_kwargs=True))
            reg(layer.register_forward_hook(self._layer_post(i)))
            reg(layer.input_layernorm.register_forward_hook(self._out("input_layernorm")))
            a = layer.self_attn
            if a.q_lora_rank is not None:
                reg(a.q_a_proj.register_forward_hook(self._out("q_a")))
                reg(a.q_a_layernorm.register_forward_hook(self._out("q_a_norm")))
                q_b = a.q_b_proj if hasattr(a, "q_b_proj") else a.q_gate_proj  # A.X-K2's fused query and gate
                reg(q_b.register_forward_hook(self._out("q_proj_out")))
            else:
                reg(a.q_proj.register_forward_hook(self._out("q_proj_out")))
            reg(a.kv_a_proj_with_mqa.register_forward_hook(self._out("kv_a")))
            reg(a.kv_a_layernorm.register_forward_pre_hook(self._in("compressed_kv")))
            reg(a.kv_a_layernorm.register_forward_hook(self._out("compressed_kv_norm")))
            reg(a.kv_b_proj.register_forward_hook(self._out("kv_b_out")))
            reg(a.o_proj.register_forward_pre_hook(self._in("attn_output")))
            reg(a.o_proj.register_forward_hook(self._out("o_proj")))
            if getattr(a, "indexer", None) is not None:  # V3.2's Lightning Indexer (GLM-5: not in every layer)
                ix = a.indexer
                reg(ix.register_forward_pre_hook(self._indexer_in, with_kwargs=True))
                reg(ix.register_forward_hook(self._out("index_topk")))
                reg(ix.wq_b.register_forward_hook(self._out("index_q")))
                reg(ix.wk.register_forward_hook(self._out("index_k")))
                reg(ix.k_norm.register_forward_hook(self._out("index_k_norm")))
                reg(ix.weights_proj.register_forward_hook(self._out("index_weights_proj")))
            ln2 = layer.post_attention_layernorm
            reg(ln2.register_forward_pre_hook(self._in("attn_residual")))
            reg(ln2.register_forward_hook(self._out("post_attention_layernorm")))
            mlp = layer.mlp
            reg(mlp.register_forward_hook(self._out("mlp_output")))
            if isinstance(mlp, moe_classes()):
                reg(mlp.gate.register_forward_hook(self._out("gate_out")))
                reg(mlp.experts.register_forward_hook(self._out("experts_out")))
                reg(mlp.shared_experts.register_forward_hook(self._out("shared_output")))
            else:
                reg(mlp.gate_proj.register_forward_hook(self._out("gate_proj")))
                reg(mlp.up_proj.register_forward_hook(self._out("up_proj")))
                # The input of down_proj is act_fn(gate_proj(x)) * up_proj(x), materialised.
                reg(mlp.down_proj.register_forward_pre_hook(self._in("act")))
        if extend := _family_step(m, "extend"):
            extend(self)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def _rotary_hook(self, module, args, output):
        if isinstance(output, torch.Tensor):  # V2: freqs_cis, complex [B, T, rope/2], times the mscale
            output = tuple(torch.cat([part, part], dim=-1) for part in (output.real, output.imag))
        cos, sin = output
        self.glob["rope_cos"] = _c(cos)
        self.glob["rope_sin"] = _c(sin)

    def _layer_pre(self, i: int):
        def hook(module, args, kwargs):
            self.layer = i
            x = args[0] if args else kwargs["hidden_states"]
            self.put("hidden_states", _c(x))
        return hook

    def _layer_post(self, i: int):
        def hook(module, args, output):  # GLM-5's layer also returns the top-k it used
            self.put("output", _c(output[0] if isinstance(output, tuple) else output))
            self.layer = None
        return hook

    def _indexer_in(self, module, args, kwargs):
        bound = inspect.signature(module.forward).bind(*args, **kwargs)
        self.put("index_mask_in", _c(bound.arguments["attention_mask"]))  # the causal mask it is given

    # --- function wrappers -------------------------------------------------------------------
    def wrap_index_rope(self, orig):
        """V3.2's module-level apply_rotary_pos_emb: the indexer's half-split RoPE (its only caller)."""
        def wrapped(q, k, *args, **kwargs):
            q_embed, k_embed = orig(q, k, *args, **kwargs)
            self.put("index_q_rot", _c(q_embed))
            self.put("index_k_rot", _c(k_embed))
            return q_embed, k_embed
        return wrapped

    def wrap_update_indexer(self, orig):
        """The cache's update_indexer: every attended position's indexer keys [B, S, Di]."""
        def wrapped(k, layer_idx, *args, **kwargs):
            keys = orig(k, layer_idx, *args, **kwargs)
            self.put("index_keys", _c(keys))
            return keys
        return wrapped

    def wrap_rope(self, orig):
        def wrapped(q, k, *args, **kwargs):
            self.put("q_pe", _c(q))
            self.put("k_pe", _c(k))
            q_embed, k_embed = orig(q, k, *args, **kwargs)
            self.put("q_pe_rope", _c(q_embed))
            self.put("k_pe_rope", _c(k_embed))
            return q_embed, k_embed
        return wrapped

    def wrap_attention(self, orig):
        sig = inspect.signature(orig)

        def wrapped(*args, **kwargs):
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            ba = bound.arguments
            module = ba["module"]
            if module.layer_idx != self.layer:
                raise RuntimeError("hf_reference: attention called outside its decoder layer")
            # The key/value heads that enter the matmuls are repeat_kv of the arguments
            # (a no-op here since num_key_value_heads == num_attention_heads).
            self.put("query_states", _c(ba["query"]))
            self.put("key_states", _c(hf_ds3.repeat_kv(ba["key"], module.num_key_value_groups)))
            self.put("value_states", _c(hf_ds3.repeat_kv(ba["value"], module.num_key_value_groups)))
            mask = ba["attention_mask"]
            self.put("attention_mask", None if mask is None else _c(mask))
            if ba["scaling"] != module.scaling:
                raise RuntimeError("hf_reference: attention called with a scale other than module.scaling")
            self.put("scaling", ba["scaling"])
            attn_output, attn_weights = orig(*args, **kwargs)
            self.put("attn_weights", _c(attn_weights))
            return attn_output, attn_weights
        return wrapped


# ---------------------------------------------------------------------------------------------
# Derivations (for what transformers keeps only in local variables)
# ---------------------------------------------------------------------------------------------

def _derive_layer(model: DeepseekV3ForCausalLM, i: int, r: dict[str, Any]) -> dict[str, torch.Tensor]:
    layer = model.model.layers[i]
    attn = layer.self_attn
    cfg = model.config
    nope, rope, vdim = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    B, T, _ = r["hidden_states"].shape
    out: dict[str, torch.Tensor] = {}

    out["hidden_states"] = r["hidden_states"]
    out["input_layernorm"] = r["input_layernorm"]
    if attn.q_lora_rank is not None:
        out["self_attn.q_a"] = r["q_a"]
        out["self_attn.q_a_norm"] = r["q_a_norm"]
    # q: q_b_proj (or q_proj) output viewed [B,T,H,qk_head] and transposed to [B,H,T,qk_head],
    # exactly as DeepseekV3Attention.forward does; q_nope/q_pe are its torch.split.
    q = r["q_proj_out"].view(B, T, cfg.num_attention_heads, -1)[..., : attn.qk_head_dim]  # A.X-K2: a gate after
    q = q.transpose(1, 2)
    q_nope, q_pe = torch.split(q, [nope, rope], dim=-1)
    out["self_attn.q"] = q.contiguous()
    out["self_attn.q_nope"] = q_nope.contiguous()
    out["self_attn.q_pe"] = q_pe.contiguous()
    if not torch.equal(q_pe * getattr(attn, "mla_scale_q_lora", 1.0), r["q_pe"]):  # the rope's q (LongCat: scaled)
        raise RuntimeError(f"hf_reference: layer {i}: q_pe split differs from the rope input")
    kv_a = r["kv_a"]
    out["self_attn.kv_a"] = kv_a
    # compressed_kv / k_pe: the torch.split of kv_a_proj_with_mqa's output. compressed_kv is also
    # the input of kv_a_layernorm, k_pe the k argument of the rope function ([B,1,T,rope]).
    out["self_attn.compressed_kv"] = kv_a[..., : cfg.kv_lora_rank].contiguous()
    out["self_attn.k_pe"] = kv_a[..., cfg.kv_lora_rank:].reshape(B, 1, T, rope)
    if not (torch.equal(out["self_attn.compressed_kv"], r["compressed_kv"])
            and torch.equal(out["self_attn.k_pe"], r["k_pe"])):
        raise RuntimeError(f"hf_reference: layer {i}: kv_a split differs from what transformers used")
    out["self_attn.compressed_kv_norm"] = r["compressed_kv_norm"]
    # kv: kv_b_proj runs on the whole (cached + new) latent [B,1,S,kv_lora]; its output viewed
    # [B,S,H,nope+v] -> [B,H,S,nope+v] as in expand_kv, of which the new positions are the last T.
    kvb = r["kv_b_out"]
    S = kvb.shape[2]
    kv = kvb.view(B, S, -1, nope + vdim).transpose(1, 2)[:, :, S - T:]
    out["self_attn.kv"] = kv.contiguous()
    out["self_attn.k_nope"] = kv[..., :nope].contiguous()
    out["self_attn.value_states"] = r["value_states"]
    out["self_attn.q_pe_rope"] = r["q_pe_rope"]
    out["self_attn.k_pe_rope"] = r["k_pe_rope"]
    out["self_attn.query_states"] = r["query_states"]
    out["self_attn.key_states"] = r["key_states"]
    if FAMILIES[cfg.model_type].interleaved_out:  # V2: rotated pairs stay interleaved; re-laid as [evens | odds]
        for name in ("q_pe_rope", "k_pe_rope"):
            out[f"self_attn.{name}"] = _halves(r[name])
        for name in ("query_states", "key_states"):
            x = r[name]
            out[f"self_attn.{name}"] = torch.cat([x[..., :nope], _halves(x[..., nope:])], dim=-1)
    # attn_scores: eager_attention_forward computes matmul(query, key^T) * scaling and adds the
    # additive mask (0 where allowed, finfo.min where blocked). Recompute that product with the
    # same ops and write -inf where the mask blocks (in decode nothing is blocked / mask is None).
    scores = torch.matmul(r["query_states"], r["key_states"].transpose(2, 3)) * r["scaling"]
    mask = r["attention_mask"]
    if mask is not None:
        blocked = ~mask if mask.dtype == torch.bool else mask < 0
        if mask.dtype != torch.bool and not torch.all(mask[~blocked] == 0):
            raise RuntimeError(f"hf_reference: layer {i}: unexpected non-zero additive mask bias")
        scores = scores.masked_fill(blocked.expand_as(scores), float("-inf"))
    out["self_attn.attn_scores"] = scores
    out["self_attn.attn_weights"] = r["attn_weights"]
    out["self_attn.attn_output"] = r["attn_output"]
    out["self_attn.o_proj"] = r["o_proj"]
    # attn_residual = hidden_states + o_proj, materialised as post_attention_layernorm's input.
    out["attn_residual"] = r["attn_residual"]
    out["post_attention_layernorm"] = r["post_attention_layernorm"]

    if getattr(attn, "indexer", None) is not None:
        out.update(_derive_indexer(attn.indexer, r, B, T))
    family = FAMILIES[cfg.model_type]
    out.update(_derive_mlp(layer, family, r, B, T, i))
    out["mlp_output"] = r["mlp_output"]
    out["output"] = r["output"]
    if derive := getattr(family, "derive", None):
        out.update(derive(model, i, r))
    return out


def _derive_mlp(layer, family: SimpleNamespace, r: dict[str, Any], B: int, T: int, i: int) -> dict[str, torch.Tensor]:
    """The MoE's tensors (V2's router, the family's own, or V3's), or the dense MLP's."""
    if isinstance(layer.mlp, hf_ds2.DeepseekV2Moe):
        return _derive_router_v2(layer.mlp, r, B, T, i)
    if isinstance(layer.mlp, moe_classes()):
        return getattr(family, "derive_router", _derive_router)(layer.mlp, r, B, T, i)
    return {"mlp.gate_proj": r["gate_proj"], "mlp.up_proj": r["up_proj"], "mlp.act": r["act"]}


def _derive_router(moe, r: dict[str, Any], B: int, T: int, i: int) -> dict[str, torch.Tensor]:
    gate = moe.gate
    E, G, KG = gate.num_experts, gate.num_group, gate.topk_group
    router_logits, topk_weights, topk_indices = r["gate_out"]  # [N,E], [N,k], [N,k]
    out: dict[str, torch.Tensor] = {}
    out["mlp.gate.logits"] = router_logits
    # The same ops as DeepseekV3TopkRouter.forward, applied to its returned router_logits:
    scores = router_logits.sigmoid()  # [N,E]
    sfc = scores + gate.e_score_correction_bias  # [N,E], selection only
    group_scores = sfc.view(-1, G, E // G).topk(2, dim=-1)[0].sum(dim=-1)  # [N,G]
    group_idx = torch.topk(group_scores, k=KG, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)  # [N,G] 1/0
    score_mask = group_mask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
    masked = sfc.masked_fill(~score_mask.bool(), float("-inf"))
    idx, w = _best_first(topk_indices, topk_weights, masked)
    if not torch.isfinite(masked.gather(1, idx)).all():
        raise RuntimeError(f"hf_reference: layer {i}: derived group mask disagrees with the gate's choice")
    out["mlp.gate.scores"] = scores
    out["mlp.gate.scores_for_choice"] = sfc
    out["mlp.gate.group_scores"] = group_scores
    out["mlp.gate.group_mask"] = group_mask
    out["mlp.gate.topk_idx"] = idx
    out["mlp.gate.topk_weight"] = w
    # The experts module returns [N,d]; DeepseekV3MoE views it as [B,T,d].
    out["mlp.routed_output"] = r["experts_out"].view(B, T, -1)
    out["mlp.shared_output"] = r["shared_output"]
    return out


def _derive_indexer(ix, r: dict[str, Any], B: int, T: int) -> dict[str, torch.Tensor]:
    """DeepseekV32Indexer.forward's tensors: captured from its modules, and its score recomputed
    with its own ops from them (it keeps q, k and the scores in local variables)."""
    H, D, rope = ix.n_heads, ix.head_dim, ix.qk_rope_head_dim
    q = r["index_q"].view(B, T, H, D)  # [B, T, Hi, Di], as the indexer views wq_b's output
    q_rope = torch.cat([r["index_q_rot"], q[..., rope:]], dim=-1)  # [B, T, Hi, Di]
    k_rope = torch.cat([r["index_k_rot"], r["index_k_norm"].unsqueeze(2)[..., rope:]], dim=-1).squeeze(2)  # [B, T, Di]
    keys = r.get("index_keys", k_rope)  # without a cache, the new keys are all keys
    scores = F.relu(torch.matmul(q_rope.float(), keys.transpose(-1, -2).float().unsqueeze(1)) * ix.softmax_scale)
    weights = r["index_weights_proj"].float() * (H**-0.5)  # [B, T, Hi]
    mask = r["index_mask_in"]  # [B, T, S] additive: 0 or finfo.min
    blocked = mask < 0
    index_scores = (torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2) + mask).masked_fill(blocked, float("-inf"))
    # topk_idx: the indexer's own returned indices, best first (ties: lower position), positions
    # in the future (which it returns when a query has fewer than index_topk before it) as -1
    idx = r["index_topk"].to(torch.int64)
    idx = torch.sort(idx, dim=-1, stable=True)[0]
    order = torch.sort(index_scores.gather(-1, idx), dim=-1, descending=True, stable=True)[1]
    idx = idx.gather(-1, order)
    idx = idx.masked_fill(blocked.gather(-1, idx), -1)
    chosen = torch.zeros_like(blocked).scatter(-1, idx.clamp(min=0), True) & ~blocked
    return {
        "self_attn.indexer.q": q.transpose(1, 2).contiguous(),
        "self_attn.indexer.k": r["index_k"],
        "self_attn.indexer.k_norm": r["index_k_norm"],
        "self_attn.indexer.q_rope": q_rope.transpose(1, 2).contiguous(),
        "self_attn.indexer.k_rope": k_rope,
        "self_attn.indexer.keys": keys,
        "self_attn.indexer.head_weights": weights,
        "self_attn.indexer.index_scores": index_scores,
        "self_attn.indexer.topk_idx": idx,
        "self_attn.indexer.mask": torch.zeros_like(index_scores).masked_fill(~chosen, float("-inf")),
    }


def _best_first(topk_indices: torch.Tensor, topk_weights: torch.Tensor, masked: torch.Tensor):
    """The gate's own returned topk (unsorted), re-ordered by descending masked choice scores,
    ties broken by lower expert index: a stable sort by index, then a stable descending sort by value."""
    idx = topk_indices.to(torch.int64)
    by_index = torch.sort(idx, dim=-1, stable=True)[1]
    idx = idx.gather(1, by_index)
    w = topk_weights.gather(1, by_index)
    order = torch.sort(masked.gather(1, idx), dim=-1, descending=True, stable=True)[1]
    return idx.gather(1, order), w.gather(1, order)


def _derive_router_v2(moe, r: dict[str, Any], B: int, T: int, i: int) -> dict[str, torch.Tensor]:
    """DeepseekV2TopkRouter: softmax scores; greedy, or group_limited_greedy with a group scored by
    its best expert (the same ops on its returned router_logits); no bias, no normalisation."""
    gate = moe.gate
    E, G, KG = gate.num_experts, gate.num_group, gate.topk_group
    router_logits, topk_weights, topk_indices = r["gate_out"]
    out: dict[str, torch.Tensor] = {"mlp.gate.logits": router_logits}
    scores = router_logits.softmax(dim=-1, dtype=torch.float32)  # [N,E]
    out["mlp.gate.softmax_scores"] = scores
    masked = scores
    if gate.topk_method == "group_limited_greedy":
        group_max = scores.view(-1, G, E // G).max(dim=-1).values  # [N,G]
        group_idx = torch.topk(group_max, k=KG, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_max).scatter_(1, group_idx, 1)
        score_mask = group_mask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
        masked = scores.masked_fill(~score_mask.bool(), 0.0)  # as transformers (softmax scores are > 0)
        out["mlp.gate.group_max"] = group_max
        out["mlp.gate.group_mask"] = group_mask
    idx, w = _best_first(topk_indices, topk_weights, masked)
    if not (masked.gather(1, idx) > 0).all():
        raise RuntimeError(f"hf_reference: layer {i}: derived group mask disagrees with the gate's choice")
    out["mlp.gate.topk_idx"] = idx
    out["mlp.gate.topk_weight"] = w
    out["mlp.routed_output"] = r["experts_out"].view(B, T, -1)
    out["mlp.shared_output"] = r["shared_output"]
    return out


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------

def _to_numpy(name: str, t: torch.Tensor) -> np.ndarray:
    if name.endswith("topk_idx"):
        return t.detach().cpu().numpy().astype(np.int64)
    return t.detach().cpu().numpy().astype(np.float32)


def _check_ids(ids: np.ndarray, what: str, batch: int | None = None, length: int | None = None) -> torch.Tensor:
    a = np.asarray(ids)
    if a.ndim != 2 or not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"hf_reference: {what} must be an int array [B, T], got {a.dtype} {a.shape}")
    if batch is not None and a.shape[0] != batch:
        raise ValueError(f"hf_reference: {what} has batch {a.shape[0]}, expected {batch}")
    if length is not None and a.shape[1] != length:
        raise ValueError(f"hf_reference: {what} must be [B, {length}], got {a.shape}")
    return torch.from_numpy(a.astype(np.int64))


def _one_pass(model, rec: _Recorder, ids: torch.Tensor, pos0: int,
              cache) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    B, T = ids.shape
    position_ids = (torch.arange(T, dtype=torch.int64) + pos0).unsqueeze(0).expand(B, T).contiguous()
    rec.reset()
    with torch.no_grad():
        result = model(input_ids=ids, position_ids=position_ids, cache=cache, use_cache=cache is not None)
    trace: dict[str, torch.Tensor] = {}
    g = rec.glob
    for key in ("embed", "rope_cos", "rope_sin", "norm", "logits"):
        if key not in g:
            raise RuntimeError(f"hf_reference: {key} was not captured")
    trace["embed"] = g["embed"]
    trace["rope_cos"] = g["rope_cos"][0]  # [T, rope], batch 0 (all batch rows share positions)
    trace["rope_sin"] = g["rope_sin"][0]
    n_layers = len(model.model.layers)
    if sorted(k for k in rec.raw if k is not None) != list(range(n_layers)) or None in rec.raw:
        raise RuntimeError(f"hf_reference: captured layers {sorted(map(str, rec.raw))}, expected 0..{n_layers - 1}")
    for i in range(n_layers):
        derived = _derive_layer(model, i, rec.raw[i])
        # emit in the documented order (docs/names.md), whatever order they were derived in
        is_moe = isinstance(model.model.layers[i].mlp, moe_classes())
        mlp_names = LAYER_NAMES_MOE if is_moe else LAYER_NAMES_DENSE
        order = _with_family_names(LAYER_NAMES_ATTN + mlp_names + LAYER_NAMES_TAIL)
        order = [n for n in order if n in derived]
        if set(order) != set(derived):
            raise RuntimeError(f"hf_reference: layer {i}: unlisted names {set(derived) - set(order)}")
        for name in order:
            trace[f"layers.{i}.{name}"] = derived[name]
    trace["norm"] = g["norm"]
    trace["logits"] = g["logits"]
    if derive_globals := _family_step(model, "derive_globals"):
        trace.update(derive_globals(model, g))
    return trace, result.logits.detach().clone()


def run_hf_trace(model: DeepseekV3ForCausalLM, ids: np.ndarray, start_pos: int = 0,
                 decode_ids: list[np.ndarray] | None = None) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """Trace an already built model. Returns (trace, the model's own logits per phase)."""
    if start_pos < 0:
        raise ValueError(f"hf_reference: start_pos must be >= 0, got {start_pos}")
    prefill = _check_ids(ids, "ids")
    B, T = prefill.shape
    steps = [_check_ids(d, f"decode_ids[{k}]", batch=B, length=1) for k, d in enumerate(decode_ids or [])]

    rec = _Recorder(model)
    family = FAMILIES[model.config.model_type]
    module = family.module
    orig_rope = getattr(module, family.rope)
    wraps = {name: getattr(module, name) for name in getattr(family, "wraps", {})}  # a family's own functions
    orig_attn = module.eager_attention_forward
    phases: list[tuple[str, dict[str, torch.Tensor], torch.Tensor]] = []
    indexed = getattr(family, "indexed", hasattr(module, "DeepseekV32Indexer"))
    index_rope = getattr(family, "index_rope", "apply_rotary_pos_emb")  # None: the family wraps both in wrap_rope
    orig_index_rope = getattr(module, index_rope, None) if index_rope else None
    try:
        rec.install()
        for name, orig in wraps.items():
            setattr(module, name, family.wraps[name](rec, orig))
        wrap_rope = getattr(family, "wrap_rope", None)  # a family whose indexer calls the same function (GLM-5)
        setattr(module, family.rope, wrap_rope(rec, orig_rope) if wrap_rope else rec.wrap_rope(orig_rope))
        module.eager_attention_forward = rec.wrap_attention(orig_attn)
        if indexed and index_rope:
            setattr(module, index_rope, rec.wrap_index_rope(orig_index_rope))
        cache = DynamicCache(config=model.config) if steps else None
        if indexed and cache is not None:
            cache.update_indexer = rec.wrap_update_indexer(cache.update_indexer)
        tr, lg = _one_pass(model, rec, prefill, start_pos, cache)
        phases.append(("prefill." if steps else "", tr, lg))
        for k, step in enumerate(steps):
            tr, lg = _one_pass(model, rec, step, start_pos + T + k, cache)
            phases.append((f"decode{k}.", tr, lg))
    finally:
        for name, orig in wraps.items():
            setattr(module, name, orig)
        setattr(module, family.rope, orig_rope)
        module.eager_attention_forward = orig_attn
        if indexed and index_rope:
            setattr(module, index_rope, orig_index_rope)
        rec.remove()

    out: dict[str, np.ndarray] = {}
    logits = []
    for prefix, tr, lg in phases:
        for name, t in tr.items():
            out[prefix + name] = _to_numpy(name, t)
        logits.append(lg.numpy().astype(np.float32))
    return out, logits


def hf_trace(config: dict, weights: dict[str, np.ndarray], ids: np.ndarray, start_pos: int = 0,
             decode_ids: list[np.ndarray] | None = None,
             inv_freq: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Run transformers' DeepseekV3ForCausalLM (float32) and return every named tensor.

    `ids` [B, T] is prefilled at positions start_pos .. start_pos+T-1 with an empty cache; each of
    `decode_ids` ([B, 1]) is one cached decode step after it. Without decode steps the names are
    unprefixed; with them they are prefixed `prefill.` / `decode{k}.`. `inv_freq`, if given
    (float32 [qk_rope_head_dim // 2]), replaces transformers' rotary inverse frequencies.
    """
    model = build_hf_model(config, weights, inv_freq=inv_freq)
    trace, _ = run_hf_trace(model, ids, start_pos=start_pos, decode_ids=decode_ids)
    return trace
