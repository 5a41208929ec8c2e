"""A.X-K2 (`axk2`, skt/A.X-K2): DeepSeek-V3.2's layer, Lightning Indexer included, with three
differences (transformers' models/axk2):
- one projection makes each head's query and an output gate: q_b_proj (transformers' q_gate_proj)
  reads [q_a_norm | q_a] (2 q_lora_rank inputs) and gives qk_head + v_head per head; the heads'
  attention output is multiplied by sigmoid(gate) before o_proj;
- input_layernorm (every layer) and post_attention_layernorm (MoE layers) are gated RMSNorms:
  y = RMSNorm(x) (its weight `norm.weight`), then y * sigmoid(W_up silu(W_down y)), rank `gated_norm_rank`;
- without `n_group` the router chooses among all experts; with it, the experts of dropped groups
  score 0.0 in the choice (not -inf).
The first `first_k_dense_replace` (default 1) layers are dense; index_n_heads defaults to 16.
A field stepper does not honour is refused by name.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from stepper.config import Config, Fields, _parse
from stepper.families import deepseek
from stepper.families.family import Family
from stepper.model.layer import decoder_layer
from stepper.untrusted import said

MODEL_TYPE = "axk2"
ARCHITECTURE = "AXK2ForCausalLM"
DEFAULTS = {"index_n_heads": 16, "index_head_dim": 128, "index_topk": 2048, "first_k_dense_replace": 1,
            "rms_norm_eps": 1e-6}
HONOURED = {"attention_bias": False}


@dataclasses.dataclass(frozen=True)
class AXK2Config(Config):
    """MLA's config with A.X-K2's fields set; written back as A.X-K2's config.json."""

    def to_hf(self) -> dict[str, Any]:
        return to_hf(self)


def from_hf(raw: dict[str, Any], source: str) -> AXK2Config:
    """Read an A.X-K2 config.json; each field stepper does not honour refused by name."""
    f = Fields(raw, source)
    for field, honoured in HONOURED.items():
        if raw.get(field, honoured) not in (honoured, None):
            raise f.fail(field, f"must be {honoured!r}: stepper builds A.X-K2 as published, got {said(raw[field])}")
    if (raw.get("n_group") is None) != (raw.get("topk_group") is None):
        raise f.fail("topk_group", "must be given with n_group (both absent: no expert groups)")
    shared = {k: v for k, v in raw.items() if k not in ("mlp_layer_types", "gated_norm_rank")}
    for field, value in DEFAULTS.items():
        shared.setdefault(field, value)
    cfg = _parse({**shared, "model_type": "deepseek_v32"}, source)
    given = raw.get("mlp_layer_types")
    if given is not None and (not isinstance(given, list) or len(given) != cfg.num_hidden_layers
                              or given != ["sparse" if cfg.is_moe_layer(i) else "dense" for i in range(len(given))]):
        raise f.fail("mlp_layer_types", f"must be 'dense' then 'sparse' as first_k_dense_replace "
                     f"({cfg.first_k_dense_replace}) and moe_layer_freq ({cfg.moe_layer_freq}) say, "
                     f"got {str(given)[:80]}")
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    return AXK2Config(**{**fields, "model_type": MODEL_TYPE, "q_gate": True, "masked_groups_zero": True,
                         "gated_norm_rank": f.int("gated_norm_rank", default=16)})


def to_hf(cfg: Config) -> dict[str, Any]:
    """The config.json of an A.X-K2 checkpoint of this config: V3.2's fields plus gated_norm_rank."""
    out = Config.to_hf(dataclasses.replace(cfg, model_type="deepseek_v32"))
    out.update(architectures=[ARCHITECTURE], model_type=MODEL_TYPE, gated_norm_rank=cfg.gated_norm_rank)
    if cfg.n_group == 1:  # A.X-K2-Light: no expert groups
        del out["n_group"], out["topk_group"]
    return out


def miniature(cfg: AXK2Config, layer: int) -> AXK2Config:
    """DeepSeek's miniature with A.X-K2's gates (a bottleneck of 2)."""
    return dataclasses.replace(deepseek.miniature(cfg, layer), gated_norm_rank=2)


def no_seeded_cache(cfg: AXK2Config, layer: int) -> str:
    """Why cache_len cannot fill a layer: its latents are drawn like those of an RMSNorm'd input."""
    return ("has a gated input norm, and a synthetic cache is drawn from the latents of an RMSNorm'd one; "
            "run the layer on a prompt instead (--prompt-len)")


FAMILY = Family(name="axk2", model_types=(MODEL_TYPE,), read_config=from_hf, decoder_layer=decoder_layer,
                parts=deepseek.part_files(deepseek.PARTS + ("axk2_gates", "output_gate")), miniature=miniature,
                no_seeded_cache=no_seeded_cache)
