"""`stepper explain NAME` and the debugger's `e`: a tensor's catalogue entry on screen.

What it is, its shape and formula, the explanation for learners (its sizes the run's own: the
catalogue's explanations are templates, `catalog.texts`), then where it is computed:
stepper's own emit site (file:line and function, found from the code by `catalog.sites`) with its
line of code, and the reference implementations' cited lines (transformers' read from the
installed file when it is the cited version, the others' as the catalogue records them), then the
names other implementations use.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import importlib.util
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.text import Text

from stepper import catalog
from stepper.catalog import family_cites, family_notes, sites, texts
from stepper.config import Config, MlaVariants
from stepper.errors import StepperError
from stepper.presets import PRESETS, V4_PRESETS
from stepper.seams.trace import did_you_mean
from stepper.session import check_layer, preset_config, published_name, takes
from stepper.untrusted import cut, shown
from stepper.views.compare import merged
from stepper.weights.fused_experts import fused_name
from stepper.weights.names import held_layer_shapes, storage_dtype

# What a query to explain finds, the one reading of `stepper explain`, the debugger's `e` and the
# API's Run.explain: a query this model's catalogue does not have (DeepSeek-V4's `hc_attn.comb` asked
# of tiny) is read in the catalogue of a tiny preset that has it; entries of tensors the model never
# emits (Kimi Linear's `state` asked of Kimi K2) take the sizes of a preset that emits them.
LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")  # a name's layer: layers.1.x, prefill.layers.1.x, model.layers.1.x
SUBLAYER = re.compile(r"(?:^|\.)sub(\d+)\.")  # LongCat's: layers.1.sub0.x, sub1.x
Reading = Callable[[catalog.Catalog, Config, str], tuple[list[Any], list[dict[str, Any]]]]


@dataclass(frozen=True)
class Found:
    cat: catalog.Catalog  # the catalogue the entries come from (another family's for its tensors)
    named: list[Any]  # another implementation's names the query is (fixtures' Named: its note())
    entries: list[dict[str, Any]]
    sizes: Config | None  # the model whose sizes they are shown with (None: no preset emits them)
    elsewhere: str  # the line naming that model when it is not the one asked of; "" when it is
    layer: int | None = None  # the layer the query names, whose sizes they are (None: any layer's)


def looked_up(cfg: Config, query: str, read: Reading | None = None, give: str = "give --model {}") -> Found:
    """What `query` explains for a model of config cfg, as `read` reads a query in a catalogue
    (fixtures.implementation_names.explained: other implementations' names too; None: the catalogue's
    own names); refused in not_found's line (`give`: how the caller is told to ask for another
    model) when no catalogue has it."""
    if (layer := LAYER.search(query)) is not None:  # a layer the model has, as a run asks
        check_layer(int(layer[1]), cfg, f"{cut(query)}: layer")
    if (sub := SUBLAYER.search(query)) is not None and not (getattr(cfg, "shortcut_moe", False) and int(sub[1]) < 2):
        has = "sub0 and sub1" if getattr(cfg, "shortcut_moe", False) else "none (only LongCat-Flash's layers have two)"
        raise StepperError(f"{cut(query)}: model {cfg.name} has no sublayer sub{sub[1]}; its layers' sublayers: {has}")
    read = read or (lambda cat, cfg, query: ([], cat.find(query)))
    cat = catalog.around(cfg)
    named, entries = read(cat, cfg, query)
    if catalog.is_glob(query) and not named and not (entries := matching(cat, cfg, query)):
        raise StepperError(unmatched(cfg, query, give))  # a glob: what it matches of what this model emits
    if not entries and not named:  # a tensor of a family of other streams (DeepSeek-V4's, asked of tiny)
        if (preset := model_emitting(cat, query)) is None:
            raise StepperError(not_found(cat, query, give))
        cat = catalog.around(preset_config(preset))
        named, entries = read(cat, preset_config(preset), query)
    entries = in_sublayer(cat, cfg, query, emitted_by(cat, entries, cfg, query))
    named = of_layers(named, cat, cfg, query)
    if not entries and not named:  # a sublayer's name no layer makes: LongCat's `sub1.output` (the layer's is `output`)
        near = did_you_mean(query, layer_names(cat, cfg, range(cfg.num_hidden_layers)))
        raise StepperError(f"no tensor named '{cut(query)}' in the catalogue{near} (stepper tree lists them)")
    sizes, elsewhere = emitting_model(cat, entries, cfg)
    return Found(cat, named, entries, sizes, elsewhere, int(layer[1]) if layer and not elsewhere else None)


def in_sublayer(cat: catalog.Catalog, cfg: Config, query: str, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries a name of a LongCat sublayer found (`layers.1.sub0.output`) that the layers emit
    in that sublayer, each shown by the sublayer's name, with its texts (sub0's output is not the
    layer's; no layer makes a `sub1.output`); a glob's are named so already (`heading`)."""
    sub = SUBLAYER.search(query)
    if sub is None or catalog.is_glob(query):
        return entries
    emitted = set(layer_names(cat, cfg, range(cfg.num_hidden_layers)))
    return [{**e, "name": f"sub{sub[1]}.{e['name']}"} for e in entries if f"sub{sub[1]}.{e['name']}" in emitted]


def found_texts(found: Found) -> list[Text]:
    """What is shown of it, block by block: the line naming the model whose sizes they are, the
    other implementations' names the query is, each entry with those sizes."""
    notes = [Text(found.elsewhere, style="bold")] if found.elsewhere else []
    if found.named:
        notes.append(Text("\n".join(one.note() for one in found.named), style="bold"))
    return [*notes, *(explain_text(found.cat, entry, found.sizes, found.layer) for entry in found.entries)]


def own_words(cat: catalog.Catalog, entry: dict[str, Any], cfg: Config | None,
              layer: int | None = None) -> dict[str, Any]:
    """The entry as cfg's model has it (None: the catalogue's): its family's description, formula and
    explanation where the family computes it otherwise (templates), and its family's own file's lines
    (those of the layer's kind, where `layer` is given: a KDA layer's o_proj is not an MLA layer's)."""
    key = catalog.key_of(entry["name"])  # a sublayer's `sub1.self_attn.q` is the entry self_attn.q
    names = (entry["name"], key)
    if layer is not None and cfg is not None and getattr(cfg, "is_kda_layer", lambda _: False)(layer):
        names = (family_cites.KDA + key, *names)
    return {**entry, "description": cat.description(entry["name"], cfg),
            **{which: family_notes.replaced(cfg, entry["name"], key, which, entry[which]) for which in ("formula",
                                                                                                        "explain")},
            "reference": family_cites.reference(cfg, names, entry["reference"])}


def explain_text(cat: catalog.Catalog, entry: dict[str, Any], cfg: Config | None, layer: int | None = None) -> Text:
    """The entry with cfg's sizes (None: its dims and template fields by name), those of `layer` if
    it is given (a DeepSeek-V4 layer's window slots)."""
    own, key = own_words(cat, entry, cfg, layer), catalog.key_of(entry["name"])
    text = Text()
    text.append(f"{entry['name']}\n", style="bold cyan")
    text.append(f"{own['description']}\n")
    dims = ", ".join(dim_text(cat, symbol, cfg, layer) for symbol in entry["dims"])
    text.append("shape   ", style="dim")
    text.append(f"[{dims}]\n")
    text.append("formula ", style="dim")
    text.append(f"{own['formula']}\n")
    for note in family_notes.notes(cfg, entry["name"], key):  # the family computes it otherwise
        text.append("note    ", style="dim")
        text.append(f"{texts.render(note, cfg)}\n", style="yellow")
    explanation = texts.unrendered(own["explain"]) if cfg is None else texts.render(own["explain"], cfg)
    text.append(f"\n{explanation}\n\n")
    text.append(emit_sites_text(key))
    text.append(citations_text(cat, own["reference"]))
    aliases = {k: v for k, v in entry.get("aliases", {}).items() if v}
    if aliases:
        text.append("aliases ", style="dim")
        text.append(own_names_pointer(cfg) or "; ".join(f"{k}: {v}" for k, v in aliases.items()))
    return text


def dim_text(cat: catalog.Catalog, symbol: str, cfg: Config | None, layer: int | None) -> str:
    """'D (head dims = 32)', 'slots (window slots = 16: m = 16)': a dim's label, size and what sets it."""
    size, note = None if cfg is None else cat.expected_size(symbol, cfg, layer), cat.note(symbol, cfg, layer)
    return (f"{symbol} ({cat.raw['dims'][symbol]['label']}" + (f" = {size}" if size is not None else "")
            + (f": {note}" if note else "") + ")")


def own_names_pointer(cfg: Config | None) -> str | None:
    """Where a model of a family transformers writes in a file of its own finds its names in other
    implementations (the catalogue's aliases are DeepSeek-V3's modules: LongCat's q is
    `self_attn.1.q_b_proj`, not `self_attn.q_b_proj`); None for DeepSeek-V3's own."""
    if cfg is None or not family_cites.has_own_file(cfg):
        return None
    model = cfg.name if cfg.name in (*PRESETS, *V4_PRESETS) else "MODEL"
    return f"this model's names in other implementations: stepper fixtures names --model {model}"


def emitted_by(cat: catalog.Catalog, entries: list[dict[str, Any]], cfg: Config,
               query: str) -> list[dict[str, Any]]:
    """The entries found for a query that this model's layers emit (the layer the query names, or
    any), when there are some: a parameter of a Kimi Linear KDA layer (`layers.0.self_attn.q_proj.
    weight`) is read by KDA's tensors, not by MLA's of the same name. All of them otherwise."""
    named = LAYER.search(query)
    layers = range(cfg.num_hidden_layers)
    if named and int(named.group(1)) < cfg.num_hidden_layers:
        layers = [int(named.group(1))]
    emitted = emitted_names(cat, cfg, layers)
    mine = [e for e in entries if e["scope"] != "layer" or e["name"] in emitted]
    return mine or entries


def of_layers(named: list[Any], cat: catalog.Catalog, cfg: Config, query: str) -> list[Any]:
    """The other implementations' names a glob matched that the layer it names (or any) has: the tensor
    a name holds is emitted there, or, a name holding none of stepper's, its module is (DeepSeek-V4's
    `layers.0.*.kv#2` matched the compressors' kv#2 of a layer without compressors). All of them when
    none is, and every name a query is outright."""
    named_layer = LAYER.search(query)
    emitted = emitted_names(cat, cfg, [int(named_layer[1])] if named_layer else range(cfg.num_hidden_layers))

    def has(one: Any) -> bool:
        if one.alias.tensor:
            return one.alias.tensor in emitted
        module = re.sub(r"^layers\.\{i\}\.", "", one.alias.name).rsplit(".", 1)[0]
        return any(name.startswith(module + ".") for name in emitted)

    kept = [one for one in named if not one.globbed or has(one)]
    return kept or named


def emitted_names(cat: catalog.Catalog, cfg: Any, layers: Sequence[int] | range) -> set[str]:
    """The catalogue names these layers of the model emit, on either attention path and index scoring
    (LongCat's `sub0.self_attn.q_nope_scaled` as its entry's name, `self_attn.q_nope_scaled`)."""
    return {catalog.key_of(name) for name in layer_names(cat, cfg, layers)}


def layer_names(cat: catalog.Catalog, cfg: Any, layers: Sequence[int] | range) -> list[str]:
    """The names these layers of the model emit as a layer names them (LongCat's under their sublayer:
    `sub0.self_attn.q`), on either attention path and index scoring, each once, in execution order."""
    scorings = ("exact", "fp8") if takes(cfg, "index_scoring") and getattr(cfg, "has_indexer", False) else ("exact",)
    names: list[str] = []
    for layer in layers:
        for attn in ("naive", "absorb"):
            for scoring in scorings:
                names = merged(names, [e["name"] for e in cat.layer_sequence(cfg, layer, attn, scoring)])
    return names


def matching(cat: catalog.Catalog, cfg: Any, query: str) -> list[dict[str, Any]]:
    """The entries of the tensors this model emits whose names a glob matches, in execution order:
    the model's own (embed, logits) and its layers' (only the layer the glob names, if it names one),
    those of a LongCat sublayer with it (`sub1.*`, `layers.1.sub0.self_attn.*`), named so (`heading`)."""
    pattern = catalog.PLACE.sub("", query, count=1)
    named = LAYER.search(query)
    if named and int(named[1]) >= cfg.num_hidden_layers:
        return []
    names = layer_names(cat, cfg, [int(named[1])] if named else range(cfg.num_hidden_layers))
    if not named:
        start, end = cat.outside_layers(cfg)
        names = [*start, *names, *end]
    shown = dict.fromkeys(heading(name, pattern) for name in names if catalog.glob_matches(name, pattern))
    return [{**entry, "name": name} for name in shown if (entry := cat.entry(catalog.key_of(name))) is not None]


def heading(name: str, pattern: str) -> str:
    """The name an entry a glob matched is shown by: its catalogue name, or the sublayer's name the
    glob was written in (`sub1.*` matches `sub1.self_attn.q`, not `self_attn.q`)."""
    key = catalog.key_of(name)
    return key if catalog.glob_matches(key, pattern) else name


def unmatched(cfg: Config, query: str, give: str) -> str:
    """The one line for a glob that matches no tensor the model emits, naming a tiny preset whose
    tensors it matches (`attn.*`, DeepSeek-V4's, asked of tiny), if one does. Only a preset whose
    catalogue has a name the glob matches is asked what it emits (tracing its layers took 0.04 s a
    preset, most of a second for a glob no preset matches)."""
    key = catalog.key_of(catalog.PLACE.sub("", query, count=1))  # what a catalogue must match first
    tiny = (name for name in (*PRESETS, *V4_PRESETS) if name.startswith("tiny"))
    other = next((name for name in tiny if names(catalog.around(preset_config(name)), key)  # no model to run
                  and matching(catalog.around(preset_config(name)), preset_config(name), query)), None)
    elsewhere = f"; {other}'s do ({give.format(other)})" if other else " (stepper tree lists them)"
    return f"no tensor of model {shown(cfg.name)} matches '{cut(query)}'{elsewhere}"


def emits(cat: catalog.Catalog, cfg: Any, name: str) -> bool:
    """Whether some layer of this model emits the tensor `name` (a catalogue name)."""
    return name in emitted_names(cat, cfg, range(cfg.num_hidden_layers))


def emitting_model(cat: catalog.Catalog, entries: list[dict[str, Any]], cfg: Config) -> tuple[Config | None, str]:
    """The config the entries are shown with, and a line saying so when it is not cfg: entries of
    layer tensors this model never emits (Kimi Linear's `state` asked of Kimi K2, whose catalogue
    shares the residual stream; DeepSeek-V4's `hc_attn.comb`, found in tiny-v4's catalogue) take
    the sizes of a preset that emits them (a tiny one first), named on the line; None (no sizes)
    when none does. (cfg, '') when the model emits one of them, or they are not layer tensors."""
    layered = [catalog.key_of(e["name"]) for e in entries if e["scope"] == "layer"]  # sub0.output: output
    if not layered or len(layered) < len(entries) or set(layered) & emitted_names(cat, cfg,
                                                                                  range(cfg.num_hidden_layers)):
        return cfg, ""
    presets = sorted((*PRESETS, *V4_PRESETS), key=lambda name: not name.startswith("tiny"))  # tiny ones first
    other = next(((name, other_cfg) for name, other_cfg in ((name, preset_config(name)) for name in presets)
                  if emits(catalog.around(other_cfg), other_cfg, layered[0])), None)
    them = f"model {shown(cfg.name)} does not emit {'it' if len(layered) == 1 else 'these'}"
    if other is None:
        return None, f"{them}, nor does any preset: shown without sizes"
    return other[1], (f"{them}: a tensor of {other[0]}'s, shown with its sizes "
                      f"(stepper explain {layered[0]} --model {other[0]})")


def emit_sites_text(key: str) -> Text:
    """'stepper emits it  stepper/model/attention.py:188  in latent()' and that line, for each emit site."""
    text = Text()
    for site in sites.sites_of(key):
        text.append("stepper emits it", style="dim")
        text.append(f"  {site.where}  in {site.function}()\n")
        text.append(numbered(site.code, site.code_line))
    return text


def citations_text(cat: catalog.Catalog, reference: dict[str, Any]) -> Text:
    """The reference's name for the tensor, then each cited source: its file, its own lines and the
    revision they refer to, and the lines themselves (transformers' from the installed file when it
    is the cited version, the others' as the catalogue records them: `text`, then `code`)."""
    text = Text()
    if reference.get("variable"):
        text.append("the references call it  ", style="dim")
        text.append(f"{reference['variable']}\n")
    for source, about in cat.raw["references"].items():
        citation = reference.get(source)
        if not isinstance(citation, dict):
            continue
        first, last = citation["lines"]
        text.append(citation_file(about, citation), style="dim")
        text.append(f"  {f'line {first}' if first == last else f'lines {first}-{last}'}")
        text.append(f"  ({revision(about)})\n", style="dim")
        lines = installed_lines(about, citation) or [citation["text"], *citation.get("code", [])]
        text.append(numbered(lines, first))
        if first + len(lines) <= last:  # an installed package of another version: its first line alone
            text.append(f"    {'':4}  ... to line {last}\n", style="green")
    return text


def citation_file(about: dict[str, Any], citation: dict[str, Any]) -> str:
    """'modeling_deepseek.py', 'transformers modeling_deepseek_v3.py' (the file this citation names)."""
    path = citation.get("path", about.get("path"))
    return f"{about['label']} {Path(path).name}" if "package" in about and path else about["label"]


def revision(about: dict[str, Any]) -> str:
    """'transformers 5.24.0' or 'moonshotai/Kimi-K2-Instruct@fd1984e2b7a3': the cited revision."""
    return f"{about['package']} {about['version']}" if "package" in about else f"{about['repo']}@{about['commit'][:12]}"


def installed_lines(about: dict[str, Any], citation: dict[str, Any]) -> list[str]:
    """The cited lines of an installed package's file (transformers'), when the installed version is
    the cited one; [] otherwise."""
    if "package" not in about:
        return []
    try:
        if importlib.metadata.version(about["package"]) != about["version"]:
            return []
        spec = importlib.util.find_spec(about["package"])
    except (ImportError, ValueError):
        return []
    if spec is None or spec.origin is None:
        return []
    path = Path(spec.origin).parent / citation.get("path", about["path"])
    first, last = citation["lines"]
    return path.read_text(encoding="utf-8").splitlines()[first - 1 : last] if path.is_file() else []


def numbered(code: Sequence[str], first: int) -> Text:
    """Source lines with their line numbers, indented under the line that cites them (escaped: the
    reference lines are read from an installed package's file)."""
    return Text("".join(f"    {first + i:4d}  {shown(line)}\n" for i, line in enumerate(code)), style="green")


LAYER_PARAMETER = re.compile(r"(?:model\.)?layers\.(\d+)\.(.+)")


def block_scaled(cfg: Config, name: str) -> bool:
    """Whether an MLA-family checkpoint stores the weight in FP8 with a weight_scale_inv beside it
    (DeepSeek-V4's own checkpoints name their scales otherwise: `scale`)."""
    return isinstance(cfg, MlaVariants) and storage_dtype(cfg, name) == "F8_E4M3"


def layer_parameter(cat: catalog.Catalog, cfg: Config, query: str) -> str | None:
    """The model's name of the layer parameter a query names: as transformers names it
    (`model.layers.1.self_attn.q_a_proj.weight`, its `weight_scale_inv`) or as the family's own
    checkpoints do (DeepSeek-V4's `layers.1.attn.wq_a.weight`). None for a query that names a
    tensor, or a layer the model has not; refused for a parameter that layer does not have, rather
    than answered by the module around it."""
    found = LAYER_PARAMETER.fullmatch(query)
    if found is None or int(found[1]) >= cfg.num_hidden_layers or cat.entry(catalog.key_of(query)) is not None:
        return None
    layer = int(found[1])
    names: dict[str, str] = {}
    for name in held_layer_shapes(cfg, layer):  # what a checkpoint may hold
        scale = [name.removesuffix("weight") + "weight_scale_inv"] if block_scaled(cfg, name) else []
        for alias in (name, *scale):
            names[alias] = names[published_name(cfg, alias) if alias == name else alias] = name
        if getattr(cfg, "fused_experts", False) and (fused := fused_name(name)):  # Mistral 4's gate_up_proj
            names.setdefault(fused, name)
            if scale:
                names.setdefault(fused + "_scale_inv", name)
    asked = query if query.startswith("model.") else f"model.{query}"
    if query in names or asked in names:
        return names.get(query) or names[asked]
    if not (catalog.names_parameter(query) or cat.consumers(query)):
        return None
    near = difflib.get_close_matches(asked, list(names), n=3, cutoff=0.6)
    raise StepperError(f"layer {layer} of {cfg.name} has no parameter '{shown(query)}'"
                       + (f"; did you mean {', '.join(near)}?" if near else " (stepper inspect lists a checkpoint's)"))


def not_found(cat: catalog.Catalog, query: str, give: str = "give --model {}") -> str:
    """The one line for a query that names no tensor, with the nearest names, or the models whose
    catalogue has it (DeepSeek-V4's `attn.weights` asked of an MLA model; `give`: how the caller
    is told to ask for that model)."""
    if (preset := model_emitting(cat, query)) is not None:
        word = catalog.key_of(query).rpartition(".")[2]  # self_attn.k_pe: its k_pe, not its self_attn
        near = did_you_mean(word, cat.names()).removeprefix("; did you mean ").removesuffix("?")
        own = f"; this model's nearest: {near}" if near else ""
        return (f"no tensor named '{cut(query)}' in this model's catalogue: it is a tensor of {preset}'s family "
                f"({give.format(preset)}){own}")
    near = did_you_mean(query, cat.names())
    return f"no tensor named '{cut(query)}' in the catalogue{near} (stepper tree lists them)"


def model_emitting(cat: catalog.Catalog, query: str) -> str | None:
    """A tiny preset of another family whose catalogue has the name `query` (whole, or its last
    parts: `q_pe`), if any."""
    key = catalog.key_of(query)
    if not key.replace(".", "_").isidentifier() or names(cat, key):
        return None
    tiny = [name for name in (*PRESETS, *V4_PRESETS) if name.startswith("tiny")]
    return next((name for name in tiny if names(catalog.around(preset_config(name)), key)), None)


def names(cat: catalog.Catalog, key: str) -> bool:
    """Whether a catalogue has a tensor of this name, or ending in it (`q_pe`: self_attn.q_pe), or
    one a glob matches."""
    if catalog.is_glob(key):
        return any(catalog.glob_matches(e["name"], key) for e in cat.entries)
    return cat.entry(key) is not None or any(e["name"].endswith("." + key) for e in cat.entries)


def also_named(cat: catalog.Catalog, query: str, shown_entries: Sequence[dict[str, Any]]) -> str:
    """'also with "logits" in the name: mlp.gate.logits' for the names a bare word matched less
    closely than the ones shown; "" when there are none."""
    word = catalog.key_of(query)
    others = [e["name"] for e in cat.containing(word) if e not in shown_entries] if word.isidentifier() else []
    return f"also with '{word}' in the name: {', '.join(others)}" if others else ""
