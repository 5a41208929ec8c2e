"""The tensor catalogue: what each named tensor is, its named dimensions and where the reference
computes it: what code cannot say. The content is data, one JSON file per part of a model
(stepper/catalog/parts/*.json, shipped in the package; a family lists its parts, and a family
added elsewhere brings its own files); this module merges the registered families' parts, finds
entries by what a user types and turns a tensor's shape into named dimensions for a given config.
Which tensors a layer emits, and in which order, is not kept here: the model says it
(`families.derive`), and `layer_sequence` asks it. An entry's `explain` text is a template
filled with the run's config (`catalog.texts`)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import cache, cached_property
from importlib.abc import Traversable
from typing import Any

from stepper import families
from stepper.catalog import family_notes, texts
from stepper.config import Config
from stepper.families import derive

RUNTIME = "runtime"
FAMILY_PARAMETERS = ((r"^(self_attn|input_layernorm|post_attention_layernorm)\.\d\.", r"\1."),  # LongCat's
                     (r"^mlps\.\d\.", "mlp."), (r"^mlp\.router\.(?:classifier\.)?", "mlp.gate."),
                     (r"^mlp\.experts\.(gate_up|down)_proj$", r"mlp.experts.\1_proj.weight"))  # Mistral 4's fused
PLACE = re.compile(r"^(?:prefill\.|decode\d+\.)?(?:layers\.\d+\.)?")  # a name's step and layer
SCOPE = re.compile(PLACE.pattern + r"(?:sub\d\.)?")  # and LongCat's sublayer
GLOB = "*?["


def is_glob(query: str) -> bool:
    return any(c in query for c in GLOB)


def glob_matches(name: str, pattern: str) -> bool:
    """Whether a name is matched by a glob, whole or from one of its dots on: `*.kv` and `kv*`
    match `self_attn.kv`; `sub1.*` matches `sub1.self_attn.q`, not `self_attn.q`."""
    return fnmatchcase(name, pattern) or fnmatchcase(name, "*." + pattern)


def key_of(name: str) -> str:
    """The catalogue name of an emitted name: `decode0.layers.3.self_attn.k_pe` -> `self_attn.k_pe`."""
    return SCOPE.sub("", name, count=1)


@dataclass(frozen=True)
class Dim:
    symbol: str
    label: str
    size: int
    runtime: bool  # batch, positions, tokens: set by the run, not by the config

    def __str__(self) -> str:
        return f"{self.symbol}={self.size} {self.label}" if self.runtime else f"{self.size} {self.label}"


def singular(label: str) -> str:
    """A dim label's first plural word in the singular, for a dim of size 1: 'positions' -> 'position',
    'compressed entries' -> 'compressed entry', 'entries a query attends' -> 'entry a query attends'."""
    return re.sub(r"\b([a-z]+?)(ies|s)\b", lambda m: m[1] + ("y" if m[2] == "ies" else ""), label, count=1)


def counted(label: str, size: int) -> str:
    """A dim's label for its size: singular for one ('1 expert group'), as it is for more."""
    return singular(label) if size == 1 else label


@dataclass(frozen=True)
class Catalog:
    raw: dict[str, Any]

    @property
    def entries(self) -> list[dict[str, Any]]:
        return self.raw["tensors"]

    def entry(self, key: str) -> dict[str, Any] | None:
        """The entry of a catalogue name, or of a LongCat sublayer's (`sub1.self_attn.q`)."""
        return self._by_name.get(key) or self._by_name.get(key_of(key))

    def description(self, name: str, cfg: Any) -> str:
        """The one-line description of a tensor (its name as emitted: `layers.1.sub0.output`) for cfg's
        model: a family's own where it computes the tensor otherwise (catalog.family_notes), else the
        entry's; cfg None: the entry's."""
        name = PLACE.sub("", name, count=1)
        entry = self.entry(name) or uncatalogued(name)
        return family_notes.description(cfg, name, key_of(name), entry["description"])

    def names(self) -> list[str]:
        return [e["name"] for e in self.entries]

    def dims(self, key: str, shape: tuple[int, ...], cfg: Config, layer: int | None = None) -> list[Dim]:
        """Named dimensions of a tensor of this shape (on `layer`: labelled with its own facts);
        unknown tensors get anonymous dims."""
        entry = self.entry(key)
        symbols = entry["dims"] if entry and len(entry["dims"]) == len(shape) else None
        if symbols is None:
            return [Dim(f"dim{i}", "", n, True) for i, n in enumerate(shape)]
        table = self.raw["dims"]
        return [Dim(s, self.label(s, cfg, layer), n, table[s]["size"] == RUNTIME) for s, n in zip(symbols, shape)]

    def label(self, symbol: str, cfg: Any, layer: int | None = None) -> str:
        """A dim's label with what sets its size on `layer` (None: on each kind of layer), where the
        config says (DeepSeek-V4's `axis_notes`): 'window slots (2m, m = 4)' on a CSA layer."""
        note = self.note(symbol, cfg, layer)
        return self.raw["dims"][symbol]["label"] + (f" ({note})" if note else "")

    def note(self, symbol: str, cfg: Any, layer: int | None = None) -> str:
        """What sets a dim's size on `layer` (or on each kind of layer), or ''."""
        return getattr(cfg, "axis_notes", lambda layer: {})(layer).get(symbol, "")

    def find(self, query: str) -> list[dict[str, Any]]:
        """Entries for a query, the first kind that matches: a name (with or without its phase and
        layer, or its last parts: `k_pe`), a glob (past its step and layer: `sub1.*`, a sublayer's,
        names no entry; views.explain reads it in the names a model emits), a checkpoint parameter
        (the tensors computed from it), a word of names (`topk`), another implementation's name for
        a tensor (HF module, DeepSeek inference/model.py, llama.cpp). Empty when nothing matches."""
        key = key_of(query)
        if key in self._by_name:
            return [self._by_name[key]]
        if is_glob(key):  # matched as written past its step and layer: a sublayer's `sub1.*` names no entry
            pattern = PLACE.sub("", query, count=1)
            return [e for e in self.entries if glob_matches(e["name"], pattern)]
        for found in (
            [e for e in self.entries if e["name"].endswith("." + key)],
            self.consumers(query),
            self.containing(key),
            [e for e in self.entries if any(alias_matches(a, query) for a in e["aliases"].values() if a)],
        ):
            if found:
                return found
        return []

    def containing(self, word: str) -> list[dict[str, Any]]:
        """Entries whose name contains a word: `topk` -> mlp.gate.topk_idx, mlp.gate.topk_weight."""
        return [e for e in self.entries if word and word in e["name"]]

    def consumers(self, parameter: str, known: bool = False) -> list[dict[str, Any]]:
        """The tensors computed from a checkpoint parameter (`model.layers.1.self_attn.q_a_proj.weight`,
        its `weight_scale_inv`, `mlp.gate.e_score_correction_bias`): the entries whose formula names
        it, else the outputs of the nearest HF module that holds it (`mlp.experts.5.up_proj.weight`
        -> the `mlp.experts` output); a wrapper's prefix (`language_model.`) is passed over. Empty
        for a name that is not a parameter's, unless the model is `known` to have it (Kimi Linear's
        `self_attn.A_log`: the entries whose formula names its last part)."""
        if len(parameter) > LONGEST_PARAMETER:  # (a query of 100,000 characters took 20 s)
            return []
        name = re.sub(r"^(?:[\w.]*?\blayers\.\d+\.|[\w.]*?\bmodel\.)", "", parameter).removesuffix("_scale_inv")
        for published, canonical in FAMILY_PARAMETERS:  # LongCat's `mlps.1.up_proj.weight` is a `mlp.up_proj.weight`
            name = re.sub(published, canonical, name)
        if not (names_parameter(name) or known):
            return []
        leaf = name.rsplit(".", 1)[-1]
        named = [e for e in self.entries if any(dotted_suffix(name, p) or dotted_suffix(p, name)
                                                 for p in PARAMETER.findall(e["formula"]))
                 or known and not names_parameter(name) and re.search(rf"\b{re.escape(leaf)}\b", e["formula"])]
        fits = {e["name"]: module_fit(name, e["name"]) for e in named}
        best = max(fits.values(), default=-1)
        if best < 0:  # no entry's place fits the module: the module's outputs
            return self.module_outputs(name.rsplit(".", 1)[0])
        return [e for e in named if fits[e["name"]] == best]

    def module_outputs(self, module: str) -> list[dict[str, Any]]:
        """Entries that are an output of the innermost HF module holding `module` (layer-relative)."""
        outputs = [(hf_module(e), e) for e in self.entries]
        held = [(m, e) for m, e in outputs if m and (module == m or module.startswith(m + "."))]
        innermost = max((len(m) for m, _ in held), default=0)
        return [e for m, e in held if len(m) == innermost]

    def layer_sequence(self, cfg: Config, layer: int, attn: str = "naive",
                       index_scoring: str = "exact") -> list[dict[str, Any]]:
        """The entries one layer emits, in execution order, for this config, attention (naive or
        absorb) and index scoring (exact or fp8): the names the model emits (families.derive),
        each with its entry (a name with none gets a bare one, which the catalogue tests refuse)."""
        keys = derive.layer_keys(cfg, layer, attn, index_scoring)
        return [{**(self.entry(key) or uncatalogued(key)), "name": key} for key in keys]  # LongCat: `sub0.` names

    def run_names(self, cfg: Config, steps: Sequence[tuple[str | None, str]], layers: Iterable[int],
                  start: Sequence[str] = (), end: Sequence[str] = (), index_scoring: str = "exact") -> list[str]:
        """Every name a run emits, in order: for each step (its phase, None without decode steps,
        and its attention path), the global tensors `start`, each layer's sequence, then `end`."""
        names = []
        start, end = self.with_globals_after(start, cfg), self.with_globals_after(end, cfg)
        keys = {}  # (layer, attn) -> the layer's keys: the same in every decode step
        for phase, attn in steps:
            scope = "" if phase is None else f"{phase}."
            names += [scope + key for key in start]
            for layer in layers:
                if (layer, attn) not in keys:
                    keys[layer, attn] = [e["name"] for e in self.layer_sequence(cfg, layer, attn, index_scoring)]
                names += [f"{scope}layers.{layer}.{key}" for key in keys[layer, attn]]
            names += [scope + key for key in end]
        return names

    def outside_layers(self, cfg: Config) -> tuple[list[str], list[str]]:
        """The names the model emits before its first layer and after its last (derive.model_names)."""
        around = derive.model_names(cfg)
        return list(around.start), list(around.end)

    def with_globals_after(self, keys: Sequence[str], cfg: Config) -> list[str]:
        """The global names `keys`, each followed by what the model around the layers emits after
        it for this config (MiniCPM3's embed_scaled after embed: model.transformer.global_names)."""
        return derive.global_names(cfg, keys)

    def expected_size(self, symbol: str, cfg: Config, layer: int | None = None) -> int | None:
        """The size a config gives a dimension symbol (or, given a layer, one the layer's own
        settings give: DeepSeek-V4's window of m tokens), or None for runtime dims and unset fields."""
        expr = self.raw["dims"][symbol]["size"]
        if expr == RUNTIME and layer is not None and hasattr(cfg, "layer_sizes"):
            return cfg.layer_sizes(layer).get(symbol)
        if expr == RUNTIME or any(getattr(cfg, f, None) is None for f in re.findall(r"[a-z_]+", expr)):
            return None  # runtime, or a size of another family (the indexer's, or KDA's, for a config without one)
        return evaluate_size(expr, cfg)

    @cached_property
    def _by_name(self) -> dict[str, dict[str, Any]]:
        return {e["name"]: e for e in self.entries}



def module_fit(parameter: str, entry: str) -> int:
    """How well an entry's place fits a parameter's module, below their block (`self_attn`, `attn`,
    `mlp`, `ffn`) and leaf: the parts both name, less those only one names (an expert's number
    aside, and the weight's own module: `gate` of `mlp.gate.weight`). `self_attn.compressor.kv_proj.weight`
    fits `attn.compressor.kv` (1), not `attn.kv_proj` (0) or `attn.indexer.compressor.kv` (0);
    `mlp.experts.5.up_proj.weight` fits no `mlp.up` (-1)."""
    parts = parameter.split(".")
    own = parts[-2] if parts[-1] == "weight" and len(parts) > 2 else ""  # `gate` of mlp.gate.weight
    module = {part for part in parts[1 : -2 if own else -1] if not part.isdigit()}
    place = set(entry.split(".")[1:-1]) - {own}
    return len(module & place) - len(module ^ place)


def uncatalogued(key: str) -> dict[str, Any]:
    """The bare entry of a name the model emits that no part file explains."""
    return {"name": key, "scope": "layer", "block": "uncatalogued", "dims": [], "dtype": "float32", "aliases": {},
            "description": "(not in the catalogue)", "formula": "", "explain": "", "reference": {}}


PARAMETER = re.compile(r"[A-Za-z_][\w.]*\.weight(?!\w)|\b\w+_bias\b")  # q_a_proj.weight, e_score_correction_bias
LONGEST_PARAMETER = 1000  # characters: a longer query is no parameter's name (PARAMETER's search of it is quadratic)


def names_parameter(text: str) -> bool:
    """Whether a text holds a parameter's name (`q_a_proj.weight`, `e_score_correction_bias`); one longer
    than LONGEST_PARAMETER does not (PARAMETER's search of 100,000 characters took 14-20 s)."""
    return len(text) <= LONGEST_PARAMETER and PARAMETER.search(text) is not None
OUTPUT = re.compile(r"^(\S+) \(output\b")  # 'model.layers.{i}.mlp.experts (output, [N, d])'


def dotted_suffix(name: str, tail: str) -> bool:
    """`mlp.gate.weight` ends with `gate.weight`; `mlp.gate_proj.weight` does not."""
    return name == tail or name.endswith("." + tail)


def hf_module(entry: dict[str, Any]) -> str | None:
    """The layer-relative HF module an entry is the output of (`mlp.experts`, `norm`), or None."""
    found = OUTPUT.match(entry["aliases"].get("hf_module") or "")
    return re.sub(r"^(?:model\.)?(?:layers\.\{i\}\.?)?", "", found.group(1)) if found else None


def alias_matches(alias: str, query: str) -> bool:
    """An alias like 'kv_cmpr (first cb, before the norm)' or 'model.layers.{i}.mlp.gate (output)'
    matches a query equal to one of its names: the first word, or any later one that reads as code
    (with `_`, `.`, a digit or a capital: `kv_cache`, `inpL`; not `the`, `sum`); `{i}` matches a
    layer number."""
    first, *rest = re.findall(r"[A-Za-z0-9_.{}]+", alias) or [""]
    names = [first] + [w for w in rest if not re.fullmatch(r"[a-z]+", w)]
    return any(re.fullmatch(re.escape(name).replace(r"\{i\}", r"\d+"), query) for name in names if len(name) > 1)


def evaluate_size(expr: str, cfg: Config) -> int | None:
    """'kv_lora_rank + qk_rope_head_dim' or 'num_attention_heads * v_head_dim' for a config; None
    when it reads a field the config leaves unset (q_lora_rank)."""
    size = texts.value(expr, cfg)
    return None if size is None else int(size)


def format_shape(dims: list[Dim]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


_loaded: tuple[tuple, Catalog] | None = None  # the families last loaded (held, so never another's id) and theirs


def load() -> Catalog:
    """The catalogue of every registered family's parts (stepper.families). Kept while the same
    families are registered: a run's memory estimate asks for it for each tensor of each step, and
    gathering the parts took 0.4 ms a time (a plan of 1,000 decode steps spent most of a minute on it)."""
    global _loaded
    registry = families.registry()
    if _loaded is None or len(_loaded[0]) != len(registry) or any(a is not b for a, b in zip(_loaded[0], registry)):
        _loaded = registry, merged(tuple(dict.fromkeys(part for family in registry for part in family.parts)))
    return _loaded[1]


def around(cfg: Any) -> Catalog:
    """The catalogue a query about cfg's tensors searches: the parts of every family whose layers
    take the same stream as cfg's (MLA's residual [B, T, d]; DeepSeek-V4's hc streams), so that a
    word or a parameter finds the tensors such a model can emit (DeepSeek-V4's `attn.q_a` is not
    offered for a run of Kimi K2)."""
    stream = families.family_for(cfg).stream
    return merged(tuple(dict.fromkeys(part for f in families.registry() if f.stream is stream for part in f.parts)))


@cache
def merged(parts: tuple[Traversable, ...]) -> Catalog:
    """One catalogue of part files: their references and dims joined, their tensors in the order of
    the files. Two parts may not explain one name or define one symbol differently."""
    raw: dict[str, Any] = {"format": "stepper-catalog", "version": 1, "references": {}, "dims": {}, "tensors": []}
    names: dict[str, str] = {}
    for part in parts:
        data = json.loads(part.read_text(encoding="utf-8"))
        for table in ("references", "dims"):
            for key, value in data.get(table, {}).items():
                if raw[table].setdefault(key, value) != value:
                    raise ValueError(f"catalogue part {part.name}: {table} {key!r} differs from an earlier part's")
        for entry in data["tensors"]:
            if entry["name"] in names:
                raise ValueError(f"catalogue part {part.name}: {entry['name']} is already in {names[entry['name']]}")
            names[entry["name"]] = part.name
            raw["tensors"].append(entry)
    return Catalog(raw)
