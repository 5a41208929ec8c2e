"""DeepSeek-V4 as transformers' save_pretrained writes it, read as the published checkpoint.

transformers 5.24 reads a published V4 checkpoint through its renames (conversion_mapping.py,
"deepseek_v4") and saves through the same renames backwards, which leave the layers and the final
norm under `model.` (`model.layers.3.attn.wq_a.weight`, `model.norm.weight`), the embedding as
`model.embed_tokens.weight` and the head's stream collapse as `model.hc_head.hc_fn` (`hc_base`,
`hc_scale`), and an attention's `kv_norm` as `norm` (the renames' `.norm.` -> `.kv_norm.` undone
where it was never done: `model.layers.3.attn.norm.weight`); `head.weight` comes back as published.
Its config.json folds DeepSeek's fields into its own (configuration_deepseek_v4.py): `layer_types` and
`compress_rates` for `compress_ratios`, `mlp_layer_types` for `num_hash_layers`, a nested
`rope_parameters` for `rope_theta`, `compress_rope_theta` and `rope_scaling`, `partial_rotary_factor`
beside `qk_rope_head_dim`; the multi-token-prediction block is neither built nor saved.

`from_saved` and `to_saved` translate a tensor's name each way; `published_fields` gives a
config.json's fields in the published form, with how the file spells each one it translated (for
messages), and refuses in one line what transformers' form can say and the published one cannot.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from stepper.config import Fields
from stepper.errors import StepperError
from stepper.untrusted import said
from stepper.weights.deepseek_v4_names import CSA as CSA_RATIO  # stepper, as DeepSeek's code, tells CSA by ratio 4

Fail = Callable[[str, str], StepperError]  # (field, why) -> the one line naming the file and the field

PREFIX = "model."
SAVED_GLOBALS = {"model.embed_tokens.weight": "embed.weight", "model.hc_head.hc_fn": "hc_head_fn",
                 "model.hc_head.hc_base": "hc_head_base", "model.hc_head.hc_scale": "hc_head_scale"}
PUBLISHED_GLOBALS = {published: saved for saved, published in SAVED_GLOBALS.items()}
OUTSIDE_MODEL = ("head.weight",)  # saved as published, without `model.`
LAYER = re.compile(r"(layers\.\d+\.)(.+)")
SAVED_IN_LAYER = {"attn.norm.weight": "attn.kv_norm.weight"}  # saved -> published, after `layers.N.`
PUBLISHED_IN_LAYER = {published: saved for saved, published in SAVED_IN_LAYER.items()}
QUOTED = re.compile(r"'([^'\s]+)'")  # a tensor's name, as messages quote it
PUBLISHED_TENSOR = re.compile(r"layers\.\d+\..+|(embed|norm|head)\.weight|hc_head_(fn|base|scale)")

SLIDING, CSA_TYPE, HCA_TYPE = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
DEFAULT_RATES = {CSA_TYPE: CSA_RATIO, HCA_TYPE: 128}  # transformers' when compress_rates is absent
HASH, SCORED = "hash_moe", "moe"
DEFAULT_HASH_LAYERS = 3  # transformers' when neither mlp_layer_types nor num_hash_layers is given
DEFAULT_FRACTION = 64 / 512  # transformers' partial_rotary_factor when neither it nor qk_rope_head_dim is given
SAVED_ONLY = ("layer_types", "compress_rates", "mlp_layer_types", "rope_parameters", "partial_rotary_factor")
NOT_YARN = ("rope_theta", "partial_rotary_factor", "attention_factor")  # a nested compress block's other keys


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


def from_saved(name: str) -> str:
    """A name as the published checkpoint stores it: `model.` dropped, transformers' names of the
    embedding, the head's collapse and an attention's kv_norm as DeepSeek's."""
    if name in SAVED_GLOBALS:
        return SAVED_GLOBALS[name]
    name = name.removeprefix(PREFIX)
    layer = LAYER.fullmatch(name)
    return layer[1] + SAVED_IN_LAYER.get(layer[2], layer[2]) if layer else name


def to_saved(published: str) -> str:
    """The name transformers' save_pretrained gives a published tensor (from_saved's inverse)."""
    if published in OUTSIDE_MODEL:
        return published
    layer = LAYER.fullmatch(published)
    if layer:
        return PREFIX + layer[1] + PUBLISHED_IN_LAYER.get(layer[2], layer[2])
    return PUBLISHED_GLOBALS.get(published, PREFIX + published)


def named_as_saved(message: str, stored_as: Mapping[str, str]) -> str:
    """A message whose quoted tensor names are published ones, naming each as the folder does
    (`stored_as`: published name -> the name on disk), or, one it does not hold, as transformers saves it."""
    def on_disk(m: re.Match) -> str:
        return f"'{stored_as.get(m[1]) or to_saved(m[1])}'" if PUBLISHED_TENSOR.fullmatch(m[1]) else m[0]

    return QUOTED.sub(on_disk, message)


# -- config.json ------------------------------------------------------------------------------


def is_saved_config(raw: dict[str, Any]) -> bool:
    """Whether a V4 config.json is in transformers' form: `layer_types`, no `compress_ratios`."""
    return "layer_types" in raw and "compress_ratios" not in raw


def published_fields(raw: dict[str, Any], source: str) -> tuple[dict[str, Any], dict[str, str]]:
    """config.json's fields in the published form, and the fields it spells otherwise (published
    name -> the file's), so a message names each as the file does. A published config comes back as
    it is. What transformers' form says that the published one cannot is refused here; the values
    are otherwise translated as they are, and the published reader checks them."""
    if not is_saved_config(raw):
        return raw, {}
    fail, layers = Fields(raw, source).fail, layer_count(raw)
    fields = {name: value for name, value in raw.items() if name not in SAVED_ONLY}
    fields["num_nextn_predict_layers"] = 0  # transformers neither builds nor saves the MTP block
    fields["compress_ratios"] = compress_ratios(raw, layers, fail)
    spelled = {"compress_ratios": "layer_types"}
    if raw.get("mlp_layer_types") is not None:
        spelled["num_hash_layers"] = "mlp_layer_types"
    fields["num_hash_layers"] = hash_layers(raw, layers, fail)
    rope, rope_spelled = rope_fields(raw, fail)
    fields.update(rope)
    if isinstance(raw.get("quantization_config"), dict) and "expert_dtype" not in raw:
        fields["expert_dtype"] = raw["quantization_config"].get("expert_dtype")  # where transformers moves it
    return fields, {**spelled, **rope_spelled}


def shape_fields(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """What the tensors' shapes need of transformers' form, compress_ratios and num_hash_layers,
    each where its own fields give it: a config refused for another field still lists its tensors."""
    fields: dict[str, Any] = {}
    fail, layers = Fields(raw, source).fail, layer_count(raw)
    for name, read in (("compress_ratios", compress_ratios), ("num_hash_layers", hash_layers)):
        try:
            fields[name] = read(raw, layers, fail)
        except StepperError:
            continue
    return fields


def layer_count(raw: dict[str, Any]) -> int | None:
    layers = raw.get("num_hidden_layers")
    return layers if type(layers) is int and layers >= 0 else None


def compress_ratios(raw: dict[str, Any], layers: int | None, fail: Fail) -> list[Any]:
    """`layer_types` as DeepSeek's per-layer ratios: 0 sliding, 4 CSA, the HCA rate (each rate of a
    kind the layers use checked: stepper, as DeepSeek's code, tells CSA from HCA by the ratio)."""
    types = raw["layer_types"]
    if not isinstance(types, list):
        raise fail("layer_types", f"must be a list of one attention kind per layer, got {said(types)}")
    if layers is not None and len(types) != layers:
        raise fail("layer_types", f"must have one entry per layer (num_hidden_layers {layers}), got {len(types)}")
    for i, kind in enumerate(types):
        if kind not in (SLIDING, CSA_TYPE, HCA_TYPE):
            raise fail(f"layer_types[{i}]", f"must be one of {SLIDING}, {CSA_TYPE}, {HCA_TYPE}, got {said(kind)}")
    rates = raw.get("compress_rates")
    if rates is None:
        rates = DEFAULT_RATES
    if not isinstance(rates, dict):
        raise fail("compress_rates", f"must be an object of a compress rate per attention kind, got {said(rates)}")
    ratios = {SLIDING: 0}
    for kind in {CSA_TYPE, HCA_TYPE} & set(types):
        if kind not in rates:
            raise fail("compress_rates", f"has no rate for {kind}, which layer {types.index(kind)} is")
        ratios[kind] = checked_rate(kind, rates[kind], raw.get("max_position_embeddings"), fail)
    return [ratios[kind] for kind in types]


def checked_rate(kind: str, rate: Any, positions: Any, fail: Fail) -> int:
    """A compress rate: CSA's 4; HCA's a whole number >= 2 other than 4, at most max_position_embeddings."""
    field = f"compress_rates.{kind}"
    if kind == CSA_TYPE and (rate != CSA_RATIO or type(rate) is not int):
        raise fail(field, f"must be {CSA_RATIO} (stepper tells a CSA layer by its ratio 4, as DeepSeek's code "
                   f"does), got {said(rate)}")
    if kind == HCA_TYPE and (type(rate) is not int or rate < 2 or rate == CSA_RATIO):
        raise fail(field, f"must be a whole number >= 2 other than {CSA_RATIO} (the CSA ratio; published: 128), "
                   f"got {said(rate)}")
    if type(positions) is int and rate > positions:
        raise fail(field, f"({rate:,}) must not exceed max_position_embeddings ({positions:,}): a window that long "
                   "never closes, and its ape has a row per position")
    return rate


def hash_layers(raw: dict[str, Any], layers: int | None, fail: Fail) -> Any:
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


def rope_fields(raw: dict[str, Any], fail: Fail) -> tuple[dict[str, Any], dict[str, str]]:
    """rope_theta, compress_rope_theta, rope_scaling and qk_rope_head_dim as transformers' rotary
    takes them: from `rope_parameters` {main, compress} where it is nested; else transformers nests
    the top-level fields itself (a flat block being the compressed layers' YaRN)."""
    block = raw.get("rope_parameters")
    if block is not None and not isinstance(block, dict):
        raise fail("rope_parameters", f"must be an object, got {said(block)}")
    if block is None or not (isinstance(block.get("main"), dict) and isinstance(block.get("compress"), dict)):
        fields, spelled = top_level_rotary(raw, fail)
        if block is None:
            return fields, spelled
        if block.get("attention_factor", 1.0) != 1.0:
            raise fail("rope_parameters.attention_factor", f"must be 1.0 (V4 scales no cos and sin; transformers "
                       f"would multiply them by it), got {said(block['attention_factor'])}")
        return {**fields, "rope_scaling": block}, {**spelled, "rope_scaling": "rope_parameters"}
    return nested_rope(raw, block["main"], block["compress"], fail)


def nested_rope(raw: dict[str, Any], main: dict, compress: dict, fail: Fail) -> tuple[dict[str, Any], dict[str, str]]:
    """The fields of `rope_parameters` {main: the sliding layers', compress: the compressed layers'}."""
    if main.get("rope_type", main.get("type", "default")) != "default":
        raise fail("rope_parameters.main.rope_type", f"must be 'default' (V4's sliding layers turn by plain RoPE), "
                   f"got {said(main.get('rope_type', main.get('type')))}")
    yarn = compress.get("rope_type", compress.get("type")) == "yarn"
    if yarn and compress.get("attention_factor") != 1.0:
        given = f"got {said(compress['attention_factor'])}" if "attention_factor" in compress else (
            "absent, transformers takes 0.1 ln(factor) + 1")
        raise fail("rope_parameters.compress.attention_factor", "must be 1.0 (V4 scales no cos and sin; "
                   f"transformers multiplies them by it), {given}")
    fraction = main.get("partial_rotary_factor", 1.0)  # transformers' rotary: the whole head without one
    if compress.get("partial_rotary_factor", 1.0) != fraction:
        raise fail("rope_parameters.compress.partial_rotary_factor", f"is {said(compress.get('partial_rotary_factor'))}"
                   f" but rope_parameters.main.partial_rotary_factor is {said(main.get('partial_rotary_factor'))}: "
                   "stepper rotates as many dims in every layer")
    if raw.get("partial_rotary_factor", fraction) != fraction:
        raise fail("partial_rotary_factor", f"is {said(raw['partial_rotary_factor'])} but "
                   f"rope_parameters.main.partial_rotary_factor, which transformers rotates by, is {said(fraction)}")
    field = "rope_parameters.main.partial_rotary_factor"
    fields = {"qk_rope_head_dim": rotary_dims(raw, fraction, field, fail)}
    spelled = {} if "qk_rope_head_dim" in raw else {"qk_rope_head_dim": field}
    for name, rope, kind in (("rope_theta", main, "main"), ("compress_rope_theta", compress, "compress")):
        field = f"rope_parameters.{kind}.rope_theta"
        if "rope_theta" not in rope:
            raise fail(field, "is missing (transformers would take rope_theta, the sliding layers' base)")
        if name in raw and raw[name] != rope["rope_theta"]:
            raise fail(field, f"is {said(rope['rope_theta'])} but {name} is {said(raw[name])}: give one, or both alike")
        fields[name], spelled[name] = rope["rope_theta"], field
    fields["rope_scaling"] = {k: v for k, v in compress.items() if k not in NOT_YARN}
    return fields, {**spelled, "rope_scaling": "rope_parameters.compress"}


def top_level_rotary(raw: dict[str, Any], fail: Fail) -> tuple[dict[str, Any], dict[str, str]]:
    """qk_rope_head_dim where transformers nests the rotary itself: head_dim x partial_rotary_factor,
    else qk_rope_head_dim as given, else its default fraction."""
    fraction = raw.get("partial_rotary_factor")
    if fraction is None and "qk_rope_head_dim" in raw:
        return {}, {}
    spelled = {} if "qk_rope_head_dim" in raw or fraction is None else {"qk_rope_head_dim": "partial_rotary_factor"}
    fraction = DEFAULT_FRACTION if fraction is None else fraction
    return {"qk_rope_head_dim": rotary_dims(raw, fraction, "partial_rotary_factor", fail)}, spelled


def rotary_dims(raw: dict[str, Any], fraction: Any, field: str, fail: Fail) -> Any:
    """The dims a head rotates, int(head_dim x fraction) as transformers' rotary takes them; a
    qk_rope_head_dim beside it must agree."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise fail(field, f"must be a number in (0, 1], got {said(fraction)}")
    head_dim = raw.get("head_dim")
    if type(head_dim) is not int:
        return raw.get("qk_rope_head_dim")  # the published reader refuses head_dim
    dims = int(head_dim * fraction)
    if raw.get("qk_rope_head_dim", dims) != dims:
        raise fail("qk_rope_head_dim", f"is {said(raw['qk_rope_head_dim'])} but head_dim x {field} is {dims} "
                   f"({head_dim} x {fraction:g}), the dims transformers rotates: give one, or both alike")
    return dims
