"""What the MLA families built on DeepSeek-V3's layer share: their published config.json read into
DeepseekV3's field names and through the MLA reader (stepper.config), each field stepper does not
build refused by name, the way back for `synth`, and their family record.

A family module (stepper/families/<model_type>.py) holds the family's published defaults (its
transformers configuration's), the fields it renames, `to_mla` / `published`, its config class
(stepper.config.Config with the family's config.json as `to_hf`) and its `FAMILY`: MLA's decoder
layer, whose parts read the family's fields of Config (router_bias, moe_output_norm, query_scale,
tie_word_embeddings, fused_experts), MLA's catalogue parts and its own, and the model around the
layers where the family changes it (Youtu's, which reads zeroed_pad_row).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from stepper.config import Config, Fields, Yarn, read_mla_config
from stepper.families import deepseek
from stepper.families.family import Family, MakeModel, ReadConfig
from stepper.model.layer import decoder_layer
from stepper.model.rope import yarn_mscale
from stepper.untrusted import said

Translate = Callable[[Fields], tuple[dict[str, Any], dict[str, Any]]]  # -> DeepseekV3's raw dict, own fields


def reader(model_type: str, router: tuple[tuple[str, ...], tuple[str, ...]], translate: Translate,
           config_class: type[Config], renames: dict[str, str] | None = None) -> ReadConfig:
    """The family's config.json reader: its fields translated (`translate`, which renames the
    family's fields to DeepSeek-V3's as `renames` says), read by the MLA reader as DeepSeek-V3's
    layer, its refusals naming the family's fields; then the family's class with its model_type,
    its router's scoring and the fields of its own."""
    spelled = {new: old for old, new in (renames or {}).items()}

    def read_config(raw: dict[str, Any], source: str) -> Config:
        f = Fields(raw, source, spelled)
        translated, extra = translate(f)
        scoring = check_router(f, translated, router)
        base = read_mla_config({**translated, "model_type": "deepseek_v3", "scoring_func": "sigmoid",
                                "topk_method": "noaux_tc"}, source, spelled)
        fields = {field.name: getattr(base, field.name) for field in dataclasses.fields(base)}
        return config_class(**{**fields, "model_type": model_type, "scoring_func": scoring, **extra})
    return read_config


def check_router(f, raw: dict[str, Any], router: tuple[tuple[str, ...], tuple[str, ...]]) -> str:
    """The family's router: `scoring_func` and `topk_method`, where the config gives them, must be
    its own (the first of each, the only one it has). -> the scoring function"""
    for field, allowed in zip(("scoring_func", "topk_method"), router):
        if raw.get(field) not in (None, *allowed):
            raise f.fail(field, f"must be {' or '.join(map(repr, allowed))} for model_type {f.raw.get('model_type')}, "
                         f"got {said(raw[field])}")
    return router[0][0]


def family(name: str, model_types: tuple[str, ...], read_config: Callable[[dict[str, Any], str], Config],
           own_parts: tuple[str, ...] = (), model: MakeModel | None = None) -> Family:
    """The family record of an MLA variant: MLA's decoder layer and catalogue parts plus its own,
    and its model around the layers where it has one (None: MLA's Transformer)."""
    return Family(name=name, model_types=model_types, read_config=read_config, decoder_layer=decoder_layer,
                  parts=deepseek.part_files(deepseek.PARTS + own_parts), miniature=miniature, model=model)


def miniature(cfg: Config, layer: int) -> Config:
    """MLA's miniature, with no pad row to zero (its vocabulary is 16 tokens)."""
    return dataclasses.replace(deepseek.miniature(cfg, layer), zeroed_pad_row=None)


def with_defaults(raw: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """The config with the family's published default for each field it does not give."""
    return {**defaults, **raw}


def renamed(f, names: dict[str, str]) -> dict[str, Any]:
    """The raw config with the family's own field names (`num_experts`) under DeepseekV3's
    (`n_routed_experts`); both given with different values is refused naming the old one."""
    raw = dict(f.raw)
    for old, new in names.items():
        if old not in raw:
            continue
        value = raw.pop(old)
        if new in raw and raw[new] != value:
            raise f.fail(old, f"({said(value)}) disagrees with {new} ({said(raw[new])}); give one of them")
        raw[new] = value
    return raw


def typed(f, raw: dict[str, Any]):
    """Typed access to the translated config's fields (errors name the field as the family spells it)."""
    return type(f)(raw, f.source, f.spelled)


def rope_block(raw: dict[str, Any]) -> dict[str, Any]:
    """The rope settings block (`rope_parameters`, or the older `rope_scaling`), {} when none."""
    block = raw.get("rope_parameters") if isinstance(raw.get("rope_parameters"), dict) else raw.get("rope_scaling")
    return block if isinstance(block, dict) else {}


def named_rope_block(f, raw: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """Where the rope settings are, and what they are: `rope_parameters` (what transformers'
    save_pretrained writes, and reads first) unless only the older `rope_scaling` is given; an
    object, or None for none. A block that is not an object is refused naming it."""
    name = "rope_scaling" if raw.get("rope_parameters") is None and raw.get("rope_scaling") is not None \
        else "rope_parameters"
    block = raw.get(name)
    if block is not None and not isinstance(block, dict):
        raise f.fail(name, f"must be an object or null, got {said(block)}")
    return name, block


def rope_fields(f, raw: dict[str, Any]):
    """Typed access to the rope block's fields (named_rope_block), errors naming the block
    (`rope_parameters: field 'factor'`)."""
    name, block = named_rope_block(f, raw)
    return type(f)(block or {}, f"{f.source}: {name}")


def transformers_yarn(f, yarn: Yarn | None) -> Yarn | None:
    """The YaRN block of the config f reads (`yarn`, as the MLA reader reads it) as transformers'
    YaRN reads it: `truncate`, and cos and sin scaled by `attention_factor` where the block gives
    one, else by mscale / mscale_all_dim's ratio where both are non-zero (attention_factor None:
    stepper's own rule, rope.yarn_cos_sin_scale), else by 0.1 ln(factor) + 1
    (modeling_rope_utils' _compute_yarn_parameters). None for no YaRN."""
    if yarn is None:
        return None
    _, block = named_rope_block(f, f.raw)
    inner = rope_fields(f, f.raw)
    if block.get("attention_factor") is not None:
        attention = inner.float("attention_factor")
    elif block.get("mscale") and block.get("mscale_all_dim"):
        attention = None
    else:
        attention = yarn_mscale(yarn.factor)
    return dataclasses.replace(yarn, attention_factor=attention, truncate=inner.bool("truncate", default=True))


def check_interleaved(f, raw: dict[str, Any]) -> None:
    """stepper rotates the rope dims in interleaved pairs (`rope_interleave: true`, every MLA
    family's default); the half-split layout is not built."""
    if raw.get("rope_interleave", True) is not True:
        raise f.fail("rope_interleave", f"must be true: stepper rotates interleaved pairs, "
                     f"got {said(raw['rope_interleave'])}")


def check_rotary_fraction(f, raw: dict[str, Any], expected: float) -> None:
    """`partial_rotary_factor` (top level or in the rope block) must make the rotary part exactly
    qk_rope_head_dim wide: `expected` is the fraction that does for this family."""
    for where, block in (("partial_rotary_factor", raw), ("rope_parameters.partial_rotary_factor", rope_block(raw))):
        value = block.get("partial_rotary_factor")
        if value is not None and value != expected:
            raise f.fail(where, f"must be {expected}: stepper rotates exactly qk_rope_head_dim dims, got {said(value)}")


def check_one_kind(f, kinds: Any, layers: int, kind: str, family: str) -> None:
    """`layer_types`, where given, must name the family's one kind of layer for each layer (Hy4's,
    Mistral Large 4's "indexed_attention")."""
    if kinds is not None and (not isinstance(kinds, list) or len(kinds) != layers or set(kinds) != {kind}):
        raise f.fail("layer_types", f"must be '{kind}' for each of the {layers} layers ({family}'s one kind), "
                     f"got {said(kinds)}")


def dense_prefix(f, raw: dict[str, Any]) -> tuple[int, int]:
    """`mlp_layer_types` ("dense"/"sparse" per layer) as DeepSeek's rule: first_k_dense_replace
    dense layers, then MoE every moe_layer_freq-th layer; a pattern the rule cannot say is refused."""
    types = raw.get("mlp_layer_types")
    n = typed(f, raw).int("num_hidden_layers")
    if not isinstance(types, list) or len(types) != n or not set(types) <= {"dense", "sparse"}:
        raise f.fail("mlp_layer_types", f"must list 'dense' or 'sparse' for each of the {n} layers, got {said(types)}")
    first = types.index("sparse") if "sparse" in types else n
    sparse = [i for i, t in enumerate(types) if t == "sparse"]
    freq = sparse[1] - sparse[0] if len(sparse) > 1 else 1
    if [i >= first and i % freq == 0 for i in range(n)] != [t == "sparse" for t in types]:
        raise f.fail("mlp_layer_types", "must be dense layers then MoE layers every k-th one (DeepSeek's "
                     f"first_k_dense_replace / moe_layer_freq), got {types}")
    return first, freq


def refuse_present(f, raw: dict[str, Any], fields: tuple[str, ...], why: str) -> None:
    """Refuse, naming it, the first of `fields` the config gives a value other than null, 0 or false."""
    for field in fields:
        if raw.get(field):
            raise f.fail(field, f"is not built: {why}, got {said(raw[field])}")


def published_fields(cfg, model_type: str, architecture: str, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """The config in DeepseekV3's names under the family's model_type and architecture, without the
    fields the family does not have."""
    mla = Config.to_hf(dataclasses.replace(cfg, model_type="deepseek_v3"))  # MLA's writer, not the family's
    out = {k: v for k, v in mla.items() if k not in ("scoring_func", "topk_method", *drop)}
    return {"architectures": [architecture], "model_type": model_type, **{k: v for k, v in out.items()
                                                                          if k not in ("architectures", "model_type")}}
