"""MiniCPM3 (`minicpm3`, openbmb/MiniCPM3-4B): DeepSeek-V2's MLA in a Llama-shaped model.

What its config.json says, in stepper's MLA config (transformers' models/minicpm3):
- every layer a dense SwiGLU MLP (no experts), lm_head tied to the embedding;
- RoPE turns dim i with dim i + rope/2 (Llama's rotate_half, not DeepSeek's interleaved pairs),
  with LongRoPE's per-frequency factors (`rope_scaling.type` "longrope"; transformers' save_pretrained
  writes the block as `rope_parameters`, rope_theta inside, and either is read);
- the muP scalings: the embedding times `scale_emb`, each residual branch times
  `scale_depth / sqrt(num_hidden_layers)`, the final norm divided by `hidden_size / dim_model_base`;
- `v_head_dim` absent means hidden_size / num_attention_heads.
Published: BF16 weights under DeepSeek's names, no `lm_head.weight`. A field whose value stepper
would not honour is refused by name.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from stepper.config import (
    TOKEN_ID_FIELDS,
    Config,
    Fields,
    LongRope,
    _parse,
    model_name,
    rope_base,
    rope_kind,
    written_token_ids,
)
from stepper.families import deepseek
from stepper.families.family import Family, around
from stepper.families.mla_fields import named_rope_block
from stepper.model.layer import decoder_layer
from stepper.model.scalings import scaled_embedding, scaled_for_logits
from stepper.model.transformer import Transformer
from stepper.seams.trace import Emitter
from stepper.untrusted import said

MODEL_TYPE = "minicpm3"
ARCHITECTURE = "MiniCPM3ForCausalLM"
# Fields read as DeepSeek-V3 reads them (same names, same meaning)
SHARED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
          "rms_norm_eps", "rope_theta", "max_position_embeddings", "hidden_act", "quantization_config", "_name_or_path")
# Fields whose other values change the math in a way stepper does not build: the value it honours
HONOURED = {"attention_bias": False, "mlp_bias": False, "pretraining_tp": 1}
DEFAULTS = {"scale_emb": 12, "scale_depth": 1.4, "dim_model_base": 256, "tie_word_embeddings": True,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0}


@dataclasses.dataclass(frozen=True)
class MiniCPM3Config(Config):
    """MLA's config with MiniCPM3's fields set (stepper.config.Config's family fields); written
    back as MiniCPM3's config.json."""

    def to_hf(self) -> dict[str, Any]:
        return to_hf(self)


def from_hf(raw: dict[str, Any], source: str) -> MiniCPM3Config:
    """Read a MiniCPM3 config.json; each field stepper does not honour refused by name."""
    f = Fields(raw, source)
    for field, honoured in HONOURED.items():
        if raw.get(field, honoured) not in (honoured, None):
            raise f.fail(field, f"must be {honoured!r}: stepper builds MiniCPM3 as published, got {said(raw[field])}")
    hidden, heads = f.int("hidden_size"), f.int("num_attention_heads")
    if raw.get("v_head_dim") is None and hidden < heads:
        raise f.fail("hidden_size", f"({hidden}) must be at least num_attention_heads ({heads}): without v_head_dim "
                     "each head's value is hidden_size / num_attention_heads wide")
    shared = {k: raw[k] for k in (*SHARED, *TOKEN_ID_FIELDS) if k in raw}
    for field in ("rms_norm_eps", "rope_theta"):
        shared.setdefault(field, DEFAULTS[field])
    block_name, block = named_rope_block(f, f.raw)
    if block_name == "rope_parameters" and "rope_theta" in block:  # as transformers reads it: inside
        shared["rope_theta"] = rope_base(Fields(block, f"{source}: {block_name}"), "rope_theta")
    cfg = _parse({**shared, "model_type": "deepseek_v3", "moe_intermediate_size": f.int("intermediate_size"),
                  "v_head_dim": f.int("v_head_dim", default=hidden // heads)}, source)
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    return dataclasses.replace(
        MiniCPM3Config(**fields), name=model_name(raw, source), model_type=MODEL_TYPE, rope_interleave=False,
        longrope=longrope(f, cfg, block_name, block),
        scale_emb=f.float("scale_emb", default=DEFAULTS["scale_emb"]),
        scale_depth=f.float("scale_depth", default=DEFAULTS["scale_depth"]),
        dim_model_base=f.int("dim_model_base", default=DEFAULTS["dim_model_base"]),
        tie_word_embeddings=f.bool("tie_word_embeddings", default=DEFAULTS["tie_word_embeddings"]),
    )


def longrope(f: Fields, cfg: Config, block_name: str, block: dict[str, Any] | None) -> LongRope | None:
    """The rope block {type: longrope, short_factor, long_factor, original_max_position_embeddings}:
    one factor per rotary frequency (rope/2 of each); absent or "default": plain RoPE."""
    if block is None:
        return None
    kind = rope_kind(f, block, block_name)
    if kind == "default":
        return None
    if kind != "longrope":
        given = "rope_type" if block.get("rope_type") is not None else "type"
        raise f.fail(f"{block_name}.{given}", f"must be 'longrope' (or absent) for minicpm3, got {said(kind)}")
    inner = Fields(block, f"{f.source}: {block_name}")
    pairs = cfg.qk_rope_head_dim // 2
    factors = {}
    for field in ("short_factor", "long_factor"):
        value = block.get(field)
        if (not isinstance(value, list) or len(value) != pairs
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
                           for v in value)):
            raise f.fail(f"{block_name}.{field}", f"must be {pairs} positive numbers (qk_rope_head_dim / 2), "
                         f"got {str(value)[:80]}")
        factors[field] = tuple(float(v) for v in value)
    original = inner.int("original_max_position_embeddings")
    factor = inner.float("factor", default=cfg.max_position_embeddings / original)
    default_attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    attention = inner.float("attention_factor", default=default_attention)
    return LongRope(factors["short_factor"], factors["long_factor"], original, attention)


def to_hf(cfg: Config) -> dict[str, Any]:
    """The config.json of a MiniCPM3 checkpoint of this config (the published field names)."""
    out: dict[str, Any] = {
        "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, "hidden_act": "silu", "attention_bias": False,
        "num_key_value_heads": cfg.num_attention_heads,
    }
    out.update({k: getattr(cfg, k) for k in SHARED if hasattr(cfg, k)})
    out.update(v_head_dim=cfg.v_head_dim, scale_emb=cfg.scale_emb, scale_depth=cfg.scale_depth,
               dim_model_base=cfg.dim_model_base, tie_word_embeddings=cfg.tie_word_embeddings, **written_token_ids(cfg))
    quantized = Config.to_hf(dataclasses.replace(cfg, model_type="deepseek_v3")).get("quantization_config")
    if quantized is not None:
        out["quantization_config"] = quantized
    if cfg.longrope is not None:
        out["rope_scaling"] = {"type": "longrope", "short_factor": list(cfg.longrope.short_factor),
                               "long_factor": list(cfg.longrope.long_factor),
                               "original_max_position_embeddings": cfg.longrope.original_max_position_embeddings,
                               "attention_factor": cfg.longrope.attention_factor}
    return out


def miniature(cfg: MiniCPM3Config, layer: int) -> MiniCPM3Config:
    """DeepSeek's miniature (families.deepseek) with MiniCPM3's branches kept: its LongRoPE factors
    cut to the miniature's rotary pairs."""
    mini = deepseek.miniature(cfg, layer)
    pairs = mini.qk_rope_head_dim // 2
    longrope = None if cfg.longrope is None else dataclasses.replace(
        cfg.longrope, short_factor=cfg.longrope.short_factor[:pairs], long_factor=cfg.longrope.long_factor[:pairs])
    return dataclasses.replace(mini, longrope=longrope, dim_model_base=None if cfg.dim_model_base is None else 4)


class MiniCPM3Model(Transformer):
    """MLA's model with MiniCPM3's muP scalings around the layers (stepper.model.scalings): the
    embedding times scale_emb, the final norm divided by hidden_size / dim_model_base. The
    residual branches' scaling is inside each layer (model.layer)."""

    def embedded(self, ids: np.ndarray, emit: Emitter) -> np.ndarray:
        """embed * scale_emb.  ids [B, T] -> [B, T, d]"""
        return scaled_embedding(super().embedded(ids, emit), self.config, emit)

    def final_norm(self, hidden: np.ndarray, emit: Emitter) -> np.ndarray:
        """norm / (hidden_size / dim_model_base).  [B, T, d] -> [B, T, d]"""
        return scaled_for_logits(super().final_norm(hidden, emit), self.config, emit)


FAMILY = Family(name="minicpm3", model_types=(MODEL_TYPE,), read_config=from_hf, decoder_layer=decoder_layer,
                parts=deepseek.part_files(deepseek.PARTS + ("mup_scalings",)), miniature=miniature,
                model=around(MiniCPM3Model, decoder_layer))
