"""DeepSeek-V4's tensors as its published checkpoint names and stores them (the on-disk names a
family module reads its weights by; the weights room knows them, as weights.names knows V3's).

Names have no `model.` prefix: `embed.weight`, `layers.N.attn.wq_a.weight`,
`layers.N.ffn.experts.E.w1.weight`, `head.weight`, and a multi-token-prediction block `mtp.0.*`
that no run reads. `layer_tensors(cfg, N)` lists one layer's tensors (name relative to
`layers.N.` -> shape and kind) and `global_tensors(cfg)` the rest, from the config's fields as
config.json names them; `cfg` is the family's config object or config.json's dict.

Kinds, as stored (the reader decides the format from the stored dtype, since the checkpoint's
first revision says nothing of its experts' FP4 in config.json):
- LINEAR: F8_E4M3 with an F8_E8M0 `.scale` [ceil(out/128), ceil(in/128)] (or a float weight, no scale);
- EXPERT: a routed expert's weight, FP4 e2m1 as I8 [out, in/2] with an F8_E8M0 `.scale`
  [out, in/32], or stored as a LINEAR;
- FLOAT: BF16, F16 or F32 (norms, the embedding and head, the compressors' projections, the
  router's gate, attn_sink, ape, hc_*);
- INDEX: I64 or I32 (a hash layer's `ffn.gate.tid2eid` [vocab, top-k]).

A model reads a layer's weights by these relative names (`attn.wq_a.weight`, `ffn.gate.tid2eid`);
stepper.weights.published pairs each quantized weight with its scale.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stepper.errors import StepperError

LINEAR, EXPERT, FLOAT, INDEX = "linear", "expert", "float", "index"
SCALE = ".scale"  # X.weight's scale is X.scale
UNUSED_PREFIX = "mtp."  # the multi-token-prediction block: no run reads it
LAYER = re.compile(r"layers\.(\d+)\.")
SHARD = re.compile(r"model-(\d{5})-of-(\d{5})\.safetensors")
SLIDING, CSA = 0, 4  # compress_ratios entries: sliding window only, compressed sparse attention (any other: HCA)


@dataclass(frozen=True)
class Tensor:
    """One tensor a config says the checkpoint holds: its logical shape [out, in] (an FP4 weight's
    bytes are [out, in/2]) and its kind."""

    shape: tuple[int, ...]
    kind: str


def field(cfg: Any, name: str) -> int:
    """A whole-number field of the config (config.json's dict, or an object with that attribute)."""
    value = cfg.get(name) if isinstance(cfg, Mapping) else getattr(cfg, name, None)
    if value is None:
        raise StepperError(f"config.json: field '{name}' is missing (V4's tensor shapes need it)")
    if type(value) is not int or value < 0:
        raise StepperError(f"config.json: field '{name}' is {value!r}, expected a whole number (V4's tensor shapes "
                           "need it)")
    return value


def compress_ratio(cfg: Any, layer: int) -> int:
    """The layer's entry of compress_ratios: 0 sliding window, 4 CSA, 128 HCA."""
    ratios = cfg.get("compress_ratios") if isinstance(cfg, Mapping) else getattr(cfg, "compress_ratios", None)
    if isinstance(ratios, (list, tuple)) and layer >= len(ratios):
        raise StepperError(f"config.json: field 'compress_ratios' has {len(ratios)} entries, none for layer {layer} "
                           "(expected one per layer, then one per multi-token-prediction block)")
    if ratios is None:
        raise StepperError("config.json: field 'compress_ratios' is missing (V4's tensor shapes need it)")
    if not isinstance(ratios, (list, tuple)) or type(ratios[layer]) is not int:
        raise StepperError(f"config.json: field 'compress_ratios' is {ratios!r}, expected a whole number for "
                           f"layer {layer}")
    return ratios[layer]


def layer_tensors(cfg: Any, layer: int) -> dict[str, Tensor]:
    """Every tensor of layer `layer`, by name relative to `layers.N.`."""
    d, hc = field(cfg, "hidden_size"), field(cfg, "hc_mult")
    tensors = {"attn_norm.weight": Tensor((d,), FLOAT), "ffn_norm.weight": Tensor((d,), FLOAT)}
    for block in ("attn", "ffn"):
        tensors.update(hyper_connection(f"hc_{block}_", d, hc, (2 + hc) * hc, 3))
    tensors.update({f"attn.{k}": v for k, v in attention_tensors(cfg, compress_ratio(cfg, layer)).items()})
    tensors.update({f"ffn.{k}": v for k, v in moe_tensors(cfg, layer).items()})
    return tensors


def hyper_connection(prefix: str, d: int, hc: int, mixes: int, scales: int) -> dict[str, Tensor]:
    """mHC's weights: fn [mixes, hc*d] (the mixes from the flattened streams), base [mixes], scale [scales]."""
    return {f"{prefix}fn": Tensor((mixes, hc * d), FLOAT), f"{prefix}base": Tensor((mixes,), FLOAT),
            f"{prefix}scale": Tensor((scales,), FLOAT)}


def attention_tensors(cfg: Any, ratio: int) -> dict[str, Tensor]:
    """The attention's tensors (relative to `attn.`) for a layer of this compress ratio."""
    d, heads, head_dim = field(cfg, "hidden_size"), field(cfg, "num_attention_heads"), field(cfg, "head_dim")
    q_rank, groups, o_rank = field(cfg, "q_lora_rank"), field(cfg, "o_groups"), field(cfg, "o_lora_rank")
    tensors = {
        "wq_a.weight": Tensor((q_rank, d), LINEAR),
        "q_norm.weight": Tensor((q_rank,), FLOAT),
        "wq_b.weight": Tensor((heads * head_dim, q_rank), LINEAR),
        "wkv.weight": Tensor((head_dim, d), LINEAR),
        "kv_norm.weight": Tensor((head_dim,), FLOAT),
        "wo_a.weight": Tensor((groups * o_rank, heads * head_dim // max(groups, 1)), LINEAR),
        "wo_b.weight": Tensor((d, groups * o_rank), LINEAR),
        "attn_sink": Tensor((heads,), FLOAT),
    }
    if ratio != SLIDING:
        tensors.update({f"compressor.{k}": v for k, v in compressor_tensors(d, head_dim, ratio).items()})
    if ratio == CSA:
        index_heads, index_dim = field(cfg, "index_n_heads"), field(cfg, "index_head_dim")
        tensors["indexer.wq_b.weight"] = Tensor((index_heads * index_dim, q_rank), LINEAR)
        tensors["indexer.weights_proj.weight"] = Tensor((index_heads, d), FLOAT)
        tensors.update({f"indexer.compressor.{k}": v for k, v in compressor_tensors(d, index_dim, ratio).items()})
    return tensors


def compressor_tensors(d: int, head_dim: int, ratio: int) -> dict[str, Tensor]:
    """A compressor pooling `ratio` tokens into one entry of head_dim; at ratio 4 the windows
    overlap, and its projections are twice as wide (the previous window's half and this one's)."""
    width = (2 if ratio == CSA else 1) * head_dim
    return {"ape": Tensor((ratio, width), FLOAT), "wkv.weight": Tensor((width, d), FLOAT),
            "wgate.weight": Tensor((width, d), FLOAT), "norm.weight": Tensor((head_dim,), FLOAT)}


def moe_tensors(cfg: Any, layer: int) -> dict[str, Tensor]:
    """The MoE's tensors (relative to `ffn.`): the router (tid2eid in hash layers, a bias in the
    others), the routed experts (w1 gate, w3 up, w2 down) and the shared expert."""
    d, experts, inter = field(cfg, "hidden_size"), field(cfg, "n_routed_experts"), field(cfg, "moe_intermediate_size")
    tensors = {"gate.weight": Tensor((experts, d), FLOAT)}
    if layer < field(cfg, "num_hash_layers"):
        tensors["gate.tid2eid"] = Tensor((field(cfg, "vocab_size"), field(cfg, "num_experts_per_tok")), INDEX)
    else:
        tensors["gate.bias"] = Tensor((experts,), FLOAT)
    for e in range(experts):
        tensors.update(swiglu(f"experts.{e}.", d, inter, EXPERT))
    shared = inter * field(cfg, "n_shared_experts")
    if shared:
        tensors.update(swiglu("shared_experts.", d, shared, LINEAR))
    return tensors


def swiglu(prefix: str, d: int, inter: int, kind: str) -> dict[str, Tensor]:
    return {f"{prefix}w1.weight": Tensor((inter, d), kind), f"{prefix}w3.weight": Tensor((inter, d), kind),
            f"{prefix}w2.weight": Tensor((d, inter), kind)}


def global_tensors(cfg: Any) -> dict[str, Tensor]:
    """The tensors outside the layers: embedding, the head's stream collapse, final norm, head."""
    d, hc, vocab = field(cfg, "hidden_size"), field(cfg, "hc_mult"), field(cfg, "vocab_size")
    return {"embed.weight": Tensor((vocab, d), FLOAT), **hyper_connection("hc_head_", d, hc, hc, 1),
            "norm.weight": Tensor((d,), FLOAT), "head.weight": Tensor((vocab, d), FLOAT)}


def layer_kind(cfg: Any, layer: int) -> str:
    """How a layer attends and routes, in words: 'sliding window; hash-routed', 'CSA: 4 tokens an
    entry, indexer; score-routed', 'HCA: 128 tokens an entry; score-routed'."""
    ratio = compress_ratio(cfg, layer)
    attention = ("sliding window" if ratio == SLIDING else f"CSA: {ratio} tokens an entry, indexer" if ratio == CSA
                 else f"HCA: {ratio} tokens an entry")
    return f"{attention}; {'hash' if layer < field(cfg, 'num_hash_layers') else 'score'}-routed"


def layer_prefix(layer: int) -> str:
    return f"layers.{layer}."


def layer_of(name: str) -> int | None:
    """The layer a stored name belongs to (`layers.3.attn.wkv.weight` -> 3), None outside the layers."""
    m = LAYER.match(name)
    return int(m[1]) if m else None


def is_unused(name: str) -> bool:
    """A tensor of the multi-token-prediction block, which no run reads."""
    return name.startswith(UNUSED_PREFIX)
