"""GLM-5 (`glm_moe_dsa`, zai-org/GLM-5): DeepSeek-V3.2's layer, Lightning Indexer included, with
two differences (transformers' models/glm_moe_dsa):
- the indexer's RoPE turns interleaved pairs of its first qk_rope_head_dim dims (V3.2: two halves);
- a layer marked "shared" in `indexer_types` runs no indexer: it attends where the layer before
  it chose (that layer's choice, or the one it reused in turn). Without `indexer_types` the
  pattern comes from `index_topk_pattern` ("F"/"S" per layer) or from `index_topk_freq` and
  `index_skip_topk_offset` (every layer "full" by default).
Its config.json is DeepSeek-V3.2's otherwise (index_n_heads 32 by default), the weights are
stored under the same names (FP8 in GLM-5-FP8), and the multi-token-prediction layer after the
last (`num_nextn_predict_layers`) is never read. A field stepper does not honour is refused by name.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from stepper.config import Config, Fields, _parse
from stepper.families import deepseek
from stepper.families.family import Family
from stepper.model.layer import decoder_layer
from stepper.untrusted import said

MODEL_TYPE = "glm_moe_dsa"
ARCHITECTURE = "GlmMoeDsaForCausalLM"
DEFAULTS = {"index_n_heads": 32, "index_head_dim": 128, "index_topk": 2048, "first_k_dense_replace": 3,
            "rms_norm_eps": 1e-5}
PATTERN_FIELDS = ("indexer_types", "index_topk_pattern", "index_topk_freq", "index_skip_topk_offset", "mlp_layer_types")
HONOURED = {"attention_bias": False, "mlp_bias": False}
MAX_LAYERS = 100_000  # GLM-5 has 78; the per-layer list of indexer kinds stays small


@dataclasses.dataclass(frozen=True)
class GlmMoeDsaConfig(Config):
    """MLA's config with GLM-5's fields set; written back as GLM-5's config.json."""

    def to_hf(self) -> dict[str, Any]:
        return to_hf(self)


def from_hf(raw: dict[str, Any], source: str) -> GlmMoeDsaConfig:
    """Read a GLM-5 config.json; each field stepper does not honour refused by name."""
    f = Fields(raw, source)
    for field, honoured in HONOURED.items():
        if raw.get(field, honoured) not in (honoured, None):
            raise f.fail(field, f"must be {honoured!r}: stepper builds GLM-5 as published, got {said(raw[field])}")
    shared = {k: v for k, v in raw.items() if k not in PATTERN_FIELDS}
    for field, value in DEFAULTS.items():
        shared.setdefault(field, value)
    cfg = _parse({**shared, "model_type": "deepseek_v32"}, source)
    types = indexer_types(f, cfg.num_hidden_layers)
    check_mlp_layer_types(f, cfg)
    reused = tuple(i for i, kind in enumerate(types) if kind == "shared")
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    return GlmMoeDsaConfig(**{**fields, "model_type": MODEL_TYPE, "indexer_rope_interleave": True,
                              "index_reused_layers": reused})


def indexer_types(f: Fields, layers: int) -> list[str]:
    """Per layer "full" (its own indexer) or "shared" (the previous layer's choice), as transformers
    derives it; the first layer must be "full"."""
    given = f.raw.get("indexer_types")
    field = "indexer_types"
    if given is None and f.raw.get("index_topk_pattern") is not None:
        field, pattern = "index_topk_pattern", f.raw["index_topk_pattern"]
        if isinstance(pattern, str) and set(pattern) <= {"F", "S"}:
            given = [{"F": "full", "S": "shared"}[c] for c in pattern]
        else:
            given = pattern
    if given is None:
        if layers > MAX_LAYERS:
            raise f.fail("num_hidden_layers", f"must be at most {MAX_LAYERS} without indexer_types: stepper lists "
                         f"each layer's indexer ('full' or 'shared'), got {layers}")
        freq = max(f.int("index_topk_freq", default=1), 1)
        offset = f.int("index_skip_topk_offset", default=2, minimum=0)
        return ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(layers)]
    if not isinstance(given, list) or len(given) != layers or not set(given) <= {"full", "shared"}:
        kinds = "'F' or 'S'" if field == "index_topk_pattern" else "'full' or 'shared'"
        raise f.fail(field, f"must give {kinds} for each of the {layers} layers, got {str(given)[:80]}")
    if given[0] != "full":
        raise f.fail(field, "must start with a 'full' layer: a 'shared' layer reuses the choice of the layer before it")
    return list(given)


def check_mlp_layer_types(f: Fields, cfg: Config) -> None:
    """`mlp_layer_types`, when given, must say what first_k_dense_replace says: dense, then sparse."""
    given = f.raw.get("mlp_layer_types")
    if given is None:
        return
    if (not isinstance(given, list) or len(given) != cfg.num_hidden_layers
            or given != ["sparse" if cfg.is_moe_layer(i) else "dense" for i in range(len(given))]):
        raise f.fail("mlp_layer_types", f"must be the first {cfg.first_k_dense_replace} layers 'dense' and the rest "
                     f"'sparse' (stepper follows first_k_dense_replace), got {str(given)[:80]}")


def to_hf(cfg: Config) -> dict[str, Any]:
    """The config.json of a GLM-5 checkpoint of this config: V3.2's fields plus indexer_types."""
    out = Config.to_hf(dataclasses.replace(cfg, model_type="deepseek_v32", index_reused_layers=()))
    out.update(architectures=[ARCHITECTURE], model_type=MODEL_TYPE)
    out["indexer_types"] = ["shared" if cfg.index_reused(i) else "full" for i in range(cfg.num_hidden_layers)]
    return out


def miniature(cfg: GlmMoeDsaConfig, layer: int) -> GlmMoeDsaConfig:
    """DeepSeek's miniature whose layer 0 is "shared" when `layer` is (run alone, it reuses every
    earlier position: model.indexer.reused_index_mask)."""
    shared = (0,) if cfg.index_reused(layer) else ()
    return dataclasses.replace(deepseek.miniature(cfg, layer), index_reused_layers=shared)


FAMILY = Family(name="glm_moe_dsa", model_types=(MODEL_TYPE,), read_config=from_hf, decoder_layer=decoder_layer,
                parts=deepseek.part_files(deepseek.PARTS + ("index_reuse",)), miniature=miniature)
