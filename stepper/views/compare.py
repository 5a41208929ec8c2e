"""`stepper tree --compare B`: two models' layers side by side, where they differ.

For one layer of each (the first MoE layer, or the given one), the union of the named tensors in
execution order: a tensor only one of them has, a shape that differs, and a tensor whose formula
reads a config field the two set apart (its catalogue formula and explanation name the field),
with the two values. Above it, every config field that differs. Everything comes from the
catalogue and the two configs: nothing is kept here per family.
"""

from __future__ import annotations

import dataclasses
import inspect
import re

from rich.console import Group
from rich.text import Text

from stepper import catalog
from stepper.config import TOKEN_ID_FIELDS, Config
from stepper.session import takes
from stepper.untrusted import shown
from stepper.views.fitted_table import fitted

ONLY = "—"
FIELD = re.compile(r"[a-z][a-z0-9_]+")
SUBLAYER = re.compile(r"^sub\d+\.")  # LongCat's layers: two sublayers, their tensors under sub0. and sub1.
# the config fields of the MLA families whose effect a formula names by another word
SAID_AS = {"router_bias": ("e_score_correction_bias",), "moe_output_norm": ("post_mlp_layernorm",),
           "query_scale": ("q_position_scale",), "tie_word_embeddings": ("lm_head",),
           "rope_scaling": ("mscale", "yarn", "YaRN"), "rope_interleave": ("0::2",), "longrope": ("rope_cos",),
           "indexer_rope_interleave": ("rotate_half_rope",), "masked_groups_zero": ("expert's group kept",)}


def compared_layer(cfg: Config, layer: int | None) -> int:
    """The given layer, else the first MoE layer (the first layer of a dense-only model)."""
    if layer is not None:
        return layer
    return next((i for i in range(cfg.num_hidden_layers) if cfg.is_moe_layer(i)), 0)


def differing_fields(a: Config, b: Config) -> dict[str, tuple[object, object]]:
    """Each config field (but the name) the two set apart: field -> (a's value, b's value). Each
    family's value is its own, set or stated (Kimi Linear's sigmoid router with a bias, which its
    config class states rather than reads): a name either config has is compared with the value
    the other reads under it. A name only one config has is ONLY on the side without it when the
    other's file sets it (DeepSeek-V4's hc_mult, Kimi Linear's kda_layers); a value its class fixes
    (a default, a class variable: MiniCPM3's scale_emb 1.0, the INT4 of none) is how that family's
    code reads the name, no difference. A field holding settings of its own (rope_scaling's YaRN,
    the quantization) is compared setting by setting, `rope_scaling.factor`, under its kind."""
    flat_a, flat_b = flattened(a), flattened(b)
    given = set_fields(a) | set_fields(b)
    values = {name: (read(a, flat_a, name), read(b, flat_b, name)) for name in merged(list(flat_a), list(flat_b))
              if name != "name" and name not in TOKEN_ID_FIELDS}  # the layer reads no special token's id
    return {name: (x, y) for name, (x, y) in values.items()
            if x != y and (ONLY not in (x, y) or "." in name or name in given)}


def stated(settings: object) -> list[str]:
    """A config's names for what configures it: its dataclass fields, then the values its class
    states as class variables (Kimi Linear's model_type, scoring_func: `ClassVar`)."""
    fields = [f.name for f in dataclasses.fields(settings)]
    return fields + [name for name in inspect.get_annotations(type(settings)) if name not in fields]


def read(cfg: object, flat: dict[str, object], name: str) -> object:
    """The config's value of a compared field: its own, else the one it reads under that name
    (Kimi Linear's router_bias, MlaVariants'), else ONLY."""
    if name in flat:
        return flat[name]
    found = ONLY if "." in name else getattr(cfg, name, ONLY)
    return ONLY if callable(found) else found


def set_fields(cfg: object) -> set[str]:
    """The fields a config's file sets: those of its class with no default, or away from it."""
    return {f.name for f in dataclasses.fields(cfg)
            if f.default is dataclasses.MISSING or getattr(cfg, f.name) != f.default}


def flattened(settings: object, prefix: str = "") -> dict[str, object]:
    """A dataclass's stated fields by dotted name, those holding a dataclass as its kind (the
    class's name) and each of its own fields."""
    out: dict[str, object] = {}
    for name in stated(settings):
        value = getattr(settings, name)
        if dataclasses.is_dataclass(value):
            out[prefix + name] = Kind(type(value).__name__)
            out.update(flattened(value, f"{prefix}{name}."))
        else:
            out[prefix + name] = value
    return out


class Kind(str):
    """The kind of a field holding settings of its own (Yarn, Fp8), shown as its name."""

    def __repr__(self) -> str:
        return str(self)


def shape(cat: catalog.Catalog, entry: dict, cfg: Config, layer: int) -> str:
    sizes = [d if (size := cat.expected_size(d, cfg, layer)) is None else str(size) for d in entry["dims"]]
    return "[" + ", ".join(sizes) + "]"


def read_fields(entry: dict, fields: dict[str, tuple[object, object]]) -> list[str]:
    """The differing fields the tensor's formula or explanation names."""
    text = entry["formula"] + " " + entry.get("explain", "")
    words = set(FIELD.findall(text))
    tops = dict.fromkeys(f.split(".")[0] for f in fields)  # rope_scaling for rope_scaling.factor
    return [f for f in tops if f in words or any(word in text for word in SAID_AS.get(f, ()))]


def merged(first: list[str], second: list[str]) -> list[str]:
    """Both name lists in one execution order: each one's order kept, the other's names slotted in
    after the last name they follow."""
    order = list(first)
    for i, name in enumerate(second):
        if name not in order:
            before = next((order.index(n) + 1 for n in reversed(second[:i]) if n in order), 0)
            order.insert(before, name)
    return order


def path(cfg: Config, attn: str) -> str:
    """' (naive attention)' for a model with a choice of attention path, '' for one with one."""
    return f" ({attn} attention)" if takes(cfg, "attn") else ""


def comparison(cat: catalog.Catalog, a: Config, b: Config, layers: tuple[int, int], attn: str,
               everything: bool = False, width: int | None = None) -> Group:
    """The two layers' differences as a table (every tensor with `everything`), the differing
    config fields above it, fitted to a terminal `width` wide (None: a pipe, every row on one line)."""
    fields = differing_fields(a, b)
    subs = [sublayers(cat.layer_sequence(cfg, i, attn)) for cfg, i in zip((a, b), layers)]
    seq_a, seq_b = (rows_of(cat.layer_sequence(cfg, i, attn), fold=bool(own) and not other)
                    for cfg, i, own, other in ((a, layers[0], *subs), (b, layers[1], *subs[::-1])))
    names_a, names_b = shown(a.name), shown(b.name)
    heading = (f"{names_a} layer {layers[0]} vs {names_b} layer {layers[1]}, {attn} attention"
               if takes(a, "attn") and takes(b, "attn")  # else the path named on the side that has two: V4 has one
               else f"{names_a} layer {layers[0]}{path(a, attn)} vs {names_b} layer {layers[1]}{path(b, attn)}")
    title = Text(heading, style="bold")
    col_a, col_b = (names_a, names_b) if names_a != names_b else (f"{names_a} (A)", f"{names_b} (B)")
    config = [{"config field": field, col_a: value(x), col_b: value(y)} for field, (x, y) in fields.items()]
    rows, same = [], 0
    for name in merged(list(seq_a), list(seq_b)):
        entry = (seq_a.get(name) or seq_b[name])[0]
        left = shape(cat, entry, a, layers[0]) if name in seq_a else ONLY
        right = shape(cat, entry, b, layers[1]) if name in seq_b else ONLY
        if ONLY in (left, right):
            side = a if name in seq_a else b
            why = f"only in {shown(side.name)}: {cat.description(entry['name'], side).split(':')[0]}"
        else:
            reads = read_fields(entry, fields)
            why = "; ".join(filter(None, ["shape" if left != right else "",
                                          f"formula reads {', '.join(reads)}" if reads else ""]))
        if why or everything:
            rows.append({"tensor": Text(name, style="bold cyan"), col_a: times(left, seq_a.get(name)),
                         col_b: times(right, seq_b.get(name)), "what differs": why})
        else:
            same += 1
    footer = Text(f"{same} tensor(s) alike in both (same shape, no differing field in their formula)"
                  + ("" if everything else "; --all lists them"))
    sides = ((col_a, "left"), (col_b, "left"))
    folded = [Text(sublayers_line(mine, own, theirs)) for mine, own, theirs, others in
              ((names_a, subs[0], names_b, subs[1]), (names_b, subs[1], names_a, subs[0])) if own and not others]
    return Group(title, *folded,
                 fitted("fields that differ", (("config field", "left"), *sides), config, "config field", (), width),
                 fitted("tensors", (("tensor", "left"), *sides, ("what differs", "left")), rows, "tensor",
                        ("what differs",), width),
                 footer)


def sublayers(sequence: list[dict]) -> list[str]:
    """The sublayers a layer's names are under (LongCat's `sub0.`, `sub1.`), in order; [] for a layer of none."""
    return list(dict.fromkeys(found[0] for e in sequence if (found := SUBLAYER.match(e["name"]))))


def rows_of(sequence: list[dict], fold: bool) -> dict[str, list[dict]]:
    """A layer's tensors by the name their row shows, each with its entries as the layer emits them:
    their own names, or (fold) a sublayer's tensors under their catalogue name, the other family's
    (LongCat's sub0.self_attn.q and sub1.self_attn.q on the row of self_attn.q)."""
    rows: dict[str, list[dict]] = {}
    for entry in sequence:
        rows.setdefault(catalog.key_of(entry["name"]) if fold else entry["name"], []).append(entry)
    return rows


def times(shape: str, emitted: list[dict] | None) -> str:
    """A row's shape, '×2' after it when the layer emits the tensor twice (once in each sublayer)."""
    return shape if emitted is None or len(emitted) == 1 else f"{shape} ×{len(emitted)}"


def sublayers_line(name: str, own: list[str], other: str) -> str:
    """The line saying how a layer of sublayers is lined up with one without."""
    return (f"{name}'s layer runs {len(own)} sublayers ({', '.join(own)}): a sublayer's tensor is on the row of "
            f"{other}'s of the same name, ×{len(own)} after its shape when each sublayer emits it")


def value(v: object) -> str:
    """A config value as the table shows it: ONLY as it is, anything else as Python writes it."""
    return ONLY if v is ONLY else shown(repr(v))
