"""DeepSeek-V4 as transformers' save_pretrained writes it, read as the published checkpoint.

transformers 5.24 reads a published V4 checkpoint through its renames (conversion_mapping.py,
"deepseek_v4") and saves through the same renames backwards, which leave the layers and the final
norm under `model.` (`model.layers.3.attn.wq_a.weight`, `model.norm.weight`), the embedding as
`model.embed_tokens.weight` and the head's stream collapse as `model.hc_head.hc_fn` (`hc_base`,
`hc_scale`), and an attention's `kv_norm` as `norm` (the renames' `.norm.` -> `.kv_norm.` undone
where it was never done: `model.layers.3.attn.norm.weight`); `head.weight` comes back as published.
Its config.json folds DeepSeek's fields into its
own (configuration_deepseek_v4.py): `layer_types` and `compress_rates` for `compress_ratios`,
`mlp_layer_types` for `num_hash_layers`, a nested `rope_parameters` for `rope_theta`,
`compress_rope_theta` and `rope_scaling`, `partial_rotary_factor` beside `qk_rope_head_dim`; the
multi-token-prediction block is neither built nor saved.

`published_name` and `saved_name` translate a tensor's name each way; `published_fields` gives a
config.json's fields in the published form, with how the file spells each one it translated (for
messages), and refuses in one line what transformers' form can say and the published one cannot.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from stepper.errors import StepperError
from stepper.untrusted import said

PREFIX = "model."
SAVED_GLOBALS = {"model.embed_tokens.weight": "embed.weight", "model.hc_head.hc_fn": "hc_head_fn",
                 "model.hc_head.hc_base": "hc_head_base", "model.hc_head.hc_scale": "hc_head_scale"}
PUBLISHED_GLOBALS = {published: saved for saved, published in SAVED_GLOBALS.items()}
OUTSIDE_MODEL = ("head.weight",)  # saved as published, without `model.`
LAYER = re.compile(r"(layers\.\d+\.)(.+)")
SAVED_IN_LAYER = {"attn.norm.weight": "attn.kv_norm.weight"}  # saved -> published, after `layers.N.`
PUBLISHED_IN_LAYER = {published: saved for saved, published in SAVED_IN_LAYER.items()}
QUOTED = re.compile(r"'([^'\s]+)'")  # a tensor's name, as messages quote it

SLIDING, CSA_TYPE, HCA_TYPE = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
CSA_RATIO = 4  # stepper, as DeepSeek's code, tells a CSA layer by its ratio 4
DEFAULT_RATES = {CSA_TYPE: CSA_RATIO, HCA_TYPE: 128}  # transformers' when compress_rates is absent
HASH, SCORED = "hash_moe", "moe"
DEFAULT_HASH_LAYERS = 3  # transformers' when neither mlp_layer_types nor num_hash_layers is given
DEFAULT_ROTARY_FRACTION = 64 / 512  # transformers' partial_rotary_factor when neither it nor qk_rope_head_dim is given
SAVED_ONLY = ("layer_types", "compress_rates", "mlp_layer_types", "rope_parameters", "partial_rotary_factor")


def is_saved_layout(names: Iterable[str], where: str) -> bool:
    """Whether a checkpoint's layers are named as transformers saves V4 (`model.layers.N.`); layers
    named both ways are refused (`where`: the folder, for the message)."""
    names = list(names)
    saved = next((name for name in names if name.startswith(PREFIX) and LAYER.match(name, len(PREFIX))), None)
    published = next((name for name in names if LAYER.match(name)), None)
    if saved is not None and published is not None:
        raise StepperError(f"{where}: tensors named as transformers saves DeepSeek-V4 ('{saved}') and as DeepSeek "
                           f"publishes it ('{published}'): expected one naming")
    return saved is not None


def published_name(name: str) -> str:
    """A name as the published checkpoint stores it: `model.` dropped, transformers' names of the
    embedding and the head's collapse as DeepSeek's."""
    if name in SAVED_GLOBALS:
        return SAVED_GLOBALS[name]
    name = name.removeprefix(PREFIX)
    layer = LAYER.fullmatch(name)
    return layer[1] + SAVED_IN_LAYER.get(layer[2], layer[2]) if layer else name


def saved_name(published: str) -> str:
    """The name transformers' save_pretrained gives a published tensor (published_name's inverse)."""
    if published in OUTSIDE_MODEL:
        return published
    layer = LAYER.fullmatch(published)
    if layer:
        return PREFIX + layer[1] + PUBLISHED_IN_LAYER.get(layer[2], layer[2])
    return PUBLISHED_GLOBALS.get(published, PREFIX + published)


def named_as_saved(message: str) -> str:
    """A message whose quoted tensor names are published ones, naming each as transformers saves it."""
    def renamed(m: re.Match) -> str:
        name = m[1]
        is_tensor = re.fullmatch(r"layers\.\d+\..+|(embed|norm|head)\.weight|hc_head_(fn|base|scale)", name)
        return f"'{saved_name(name)}'" if is_tensor else m[0]

    return QUOTED.sub(renamed, message)


# -- config.json ------------------------------------------------------------------------------


def is_saved_config(raw: dict[str, Any]) -> bool:
    """Whether a V4 config.json is in transformers' form: `layer_types`, no `compress_ratios`."""
    return "layer_types" in raw and "compress_ratios" not in raw


def published_fields(raw: dict[str, Any], source: str) -> tuple[dict[str, Any], dict[str, str]]:
    """config.json's fields in the published form, and the fields it spells otherwise (published
    name -> the file's), so a message names each as the file does. A published config comes back as
    it is. The values are translated, not checked: the published reader checks them."""
    if not is_saved_config(raw):
        return raw, {}
    fail = failing(source)
    layers = raw.get("num_hidden_layers")
    layers = layers if type(layers) is int and layers >= 0 else None
    fields = {name: value for name, value in raw.items() if name not in SAVED_ONLY}
    fields["compress_ratios"] = compress_ratios(raw, layers, fail)
    fields["num_nextn_predict_layers"] = 0  # transformers neither builds nor saves the MTP block
    fields["num_hash_layers"] = hash_layers(raw, layers, fail)
    spelled = {"compress_ratios": "layer_types", "num_hash_layers": "mlp_layer_types"}
    fields.update(rotary_dims(raw, fail))
    rope, rope_spelled = rope_fields(raw, fail)
    fields.update(rope)
    if isinstance(raw.get("quantization_config"), dict) and "expert_dtype" not in raw:
        fields["expert_dtype"] = raw["quantization_config"].get("expert_dtype")  # where transformers moves it
    return fields, {**spelled, **rope_spelled}


def failing(source: str):
    def fail(field: str, why: str) -> StepperError:
        return StepperError(f"{source}: field '{field}' {why}")

    return fail


def compress_ratios(raw: dict[str, Any], layers: int | None, fail) -> list[Any]:
    """`layer_types` as DeepSeek's per-layer ratios: 0 sliding, 4 CSA, the HCA rate."""
    types = raw["layer_types"]
    if not isinstance(types, list):
        raise fail("layer_types", f"must be a list of one attention kind per layer, got {said(types)}")
    if layers is not None and len(types) != layers:
        raise fail("layer_types", f"must have one entry per layer (num_hidden_layers {layers}), got {len(types)}")
    rates = raw.get("compress_rates") or DEFAULT_RATES
    if not isinstance(rates, dict):
        raise fail("compress_rates", f"must be an object of a compress rate per attention kind, got {said(rates)}")
    rates = {**DEFAULT_RATES, **rates}
    if rates[CSA_TYPE] != CSA_RATIO or type(rates[CSA_TYPE]) is not int:
        raise fail(f"compress_rates.{CSA_TYPE}", f"must be {CSA_RATIO} (stepper tells a CSA layer by its ratio 4, as "
                   f"DeepSeek's code does), got {said(rates[CSA_TYPE])}")
    hca = rates[HCA_TYPE]
    if type(hca) is not int or hca < 2 or hca == CSA_RATIO:
        raise fail(f"compress_rates.{HCA_TYPE}", f"must be a whole number >= 2 other than {CSA_RATIO} (the CSA "
                   f"ratio; published: 128), got {said(hca)}")
    ratios = {SLIDING: 0, CSA_TYPE: CSA_RATIO, HCA_TYPE: hca}
    for i, kind in enumerate(types):
        if kind not in ratios:
            raise fail(f"layer_types[{i}]", f"must be one of {', '.join(ratios)}, got {said(kind)}")
    return [ratios[kind] for kind in types]


def hash_layers(raw: dict[str, Any], layers: int | None, fail) -> Any:
    """How many first layers route by tid2eid: the leading `hash_moe` entries of `mlp_layer_types`
    (stepper, as DeepSeek's code, hash-routes the first layers only)."""
    types = raw.get("mlp_layer_types")
    if types is None:
        given = raw.get("num_hash_layers")
        return given if given is not None else min(layers or 0, DEFAULT_HASH_LAYERS)
    if not isinstance(types, list):
        raise fail("mlp_layer_types", f"must be a list of one MoE kind per layer, got {said(types)}")
    if layers is not None and len(types) != layers:
        raise fail("mlp_layer_types", f"must have one entry per layer (num_hidden_layers {layers}), got {len(types)}")
    for i, kind in enumerate(types):
        if kind not in (HASH, SCORED):
            raise fail(f"mlp_layer_types[{i}]", f"must be {HASH!r} or {SCORED!r}, got {said(kind)}")
    count = next((i for i, kind in enumerate(types) if kind != HASH), len(types))
    if HASH in types[count:]:
        raise fail(f"mlp_layer_types[{types.index(HASH, count)}]", f"is {HASH!r} after a {SCORED!r} layer: the "
                   "hash-routed layers must come first (DeepSeek's num_hash_layers)")
    if raw.get("num_hash_layers", count) != count:
        raise fail("num_hash_layers", f"is {said(raw['num_hash_layers'])} but mlp_layer_types starts with {count} "
                   f"{HASH!r}: give one, or both alike")
    return count


def rotary_dims(raw: dict[str, Any], fail) -> dict[str, Any]:
    """qk_rope_head_dim as transformers takes it: head_dim x partial_rotary_factor where that is given."""
    fraction, head_dim = raw.get("partial_rotary_factor"), raw.get("head_dim")
    if fraction is None and "qk_rope_head_dim" in raw:
        return {}
    fraction = DEFAULT_ROTARY_FRACTION if fraction is None else fraction
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise fail("partial_rotary_factor", f"must be a number in (0, 1], got {said(fraction)}")
    if type(head_dim) is not int:
        return {}  # the published reader refuses head_dim
    dims = int(head_dim * fraction)
    given = raw.get("qk_rope_head_dim", dims)
    if given != dims:
        raise fail("qk_rope_head_dim", f"is {said(given)} but head_dim x partial_rotary_factor is {dims} "
                   f"({head_dim} x {fraction:g}), the dims transformers rotates: give one, or both alike")
    return {"qk_rope_head_dim": dims}


def rope_fields(raw: dict[str, Any], fail) -> tuple[dict[str, Any], dict[str, str]]:
    """rope_theta, compress_rope_theta and rope_scaling from `rope_parameters` ({main, compress}, or
    one flat block: the compressed layers' YaRN), with how the file spells each."""
    block = raw.get("rope_parameters")
    if block is None:
        return {}, {}
    if not isinstance(block, dict):
        raise fail("rope_parameters", f"must be an object, got {said(block)}")
    if not (isinstance(block.get("main"), dict) and isinstance(block.get("compress"), dict)):
        return {"rope_scaling": block}, {"rope_scaling": "rope_parameters"}  # transformers' compress block
    main, compress = block["main"], block["compress"]
    if main.get("rope_type", main.get("type", "default")) != "default":
        raise fail("rope_parameters.main.rope_type", f"must be 'default' (V4's sliding layers turn by plain RoPE), "
                   f"got {said(main.get('rope_type', main.get('type')))}")
    if compress.get("attention_factor", 1.0) != 1.0:
        raise fail("rope_parameters.compress.attention_factor", "must be 1.0 (V4 scales no cos and sin; "
                   f"transformers would multiply them by it), got {said(compress['attention_factor'])}")
    fraction = raw.get("partial_rotary_factor")
    for kind, rope in (("main", main), ("compress", compress)):
        if "partial_rotary_factor" in rope and fraction is not None and rope["partial_rotary_factor"] != fraction:
            raise fail(f"rope_parameters.{kind}.partial_rotary_factor", f"is {said(rope['partial_rotary_factor'])} "
                       f"but partial_rotary_factor is {said(fraction)}: give one, or both alike")
    fields: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for name, rope, kind in (("rope_theta", main, "main"), ("compress_rope_theta", compress, "compress")):
        if "rope_theta" not in rope:
            continue
        if name in raw and raw[name] != rope["rope_theta"]:
            raise fail(f"rope_parameters.{kind}.rope_theta", f"is {said(rope['rope_theta'])} but {name} is "
                       f"{said(raw[name])}: give one, or both alike")
        fields[name], spelled[name] = rope["rope_theta"], f"rope_parameters.{kind}.rope_theta"
    yarn = {k: v for k, v in compress.items() if k not in ("rope_theta", "partial_rotary_factor", "attention_factor")}
    fields["rope_scaling"], spelled["rope_scaling"] = yarn, "rope_parameters.compress"
    return fields, spelled
