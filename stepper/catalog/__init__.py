"""The tensor catalogue: what each named tensor is, its named dimensions and where the reference
computes it. The content is data (catalog.json, shipped in the package); this module reads it,
finds entries by what a user types and turns a tensor's shape into named dimensions for a given
config. An entry's `explain` text is a template filled with the run's config (`catalog.texts`)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import cache, cached_property
from importlib import resources
from typing import Any

from stepper.catalog import texts
from stepper.config import Config

RUNTIME = "runtime"
SCOPE = re.compile(r"^(?:prefill\.|decode\d+\.)?(?:layers\.\d+\.)?(?:sub\d\.)?")  # sub: LongCat's sublayers


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


@dataclass(frozen=True)
class Catalog:
    raw: dict[str, Any]

    @property
    def entries(self) -> list[dict[str, Any]]:
        return self.raw["tensors"]

    def entry(self, key: str) -> dict[str, Any] | None:
        """The entry of a catalogue name, or of a LongCat sublayer's (`sub1.self_attn.q`)."""
        return self._by_name.get(key) or self._by_name.get(key_of(key))

    def names(self) -> list[str]:
        return [e["name"] for e in self.entries]

    def dims(self, key: str, shape: tuple[int, ...], cfg: Config) -> list[Dim]:
        """Named dimensions of a tensor of this shape; unknown tensors get anonymous dims."""
        entry = self.entry(key)
        symbols = entry["dims"] if entry and len(entry["dims"]) == len(shape) else None
        if symbols is None:
            return [Dim(f"dim{i}", "", n, True) for i, n in enumerate(shape)]
        table = self.raw["dims"]
        return [Dim(s, table[s]["label"], n, table[s]["size"] == RUNTIME) for s, n in zip(symbols, shape)]

    def find(self, query: str) -> list[dict[str, Any]]:
        """Entries for a query, the first kind that matches: a name (with or without its phase and
        layer, or its last parts: `k_pe`), a glob, a checkpoint parameter (the tensors computed from
        it), a word of names (`topk`), another implementation's name for a tensor (HF module,
        DeepSeek inference/model.py, llama.cpp). Empty when nothing matches."""
        key = key_of(query)
        if key in self._by_name:
            return [self._by_name[key]]
        if any(c in key for c in "*?["):
            return [e for e in self.entries if fnmatchcase(e["name"], key) or fnmatchcase(e["name"], "*." + key)]
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

    def consumers(self, parameter: str) -> list[dict[str, Any]]:
        """The tensors computed from a checkpoint parameter (`model.layers.1.self_attn.q_a_proj.weight`,
        its `weight_scale_inv`, `mlp.gate.e_score_correction_bias`): the entries whose formula names
        it, else the outputs of the nearest HF module that holds it (`mlp.experts.5.up_proj.weight`
        -> the `mlp.experts` output); a wrapper's prefix (`language_model.`) is passed over. Empty
        for a name that is not a parameter's."""
        name = re.sub(r"^(?:[\w.]*?\blayers\.\d+\.|[\w.]*?\bmodel\.)", "", parameter).removesuffix("_scale_inv")
        if not PARAMETER.search(name):
            return []
        named = [e for e in self.entries if any(dotted_suffix(name, p) or dotted_suffix(p, name)
                                                 for p in PARAMETER.findall(e["formula"]))]
        return named or self.module_outputs(name.rsplit(".", 1)[0])

    def module_outputs(self, module: str) -> list[dict[str, Any]]:
        """Entries that are an output of the innermost HF module holding `module` (layer-relative)."""
        outputs = [(hf_module(e), e) for e in self.entries]
        held = [(m, e) for m, e in outputs if m and (module == m or module.startswith(m + "."))]
        innermost = max((len(m) for m, _ in held), default=0)
        return [e for m, e in held if len(m) == innermost]

    def layer_sequence(self, cfg: Config, layer: int, attn: str = "naive", index_scoring: str = "exact") -> list[dict[str, Any]]:
        """The entries one layer emits, in execution order, for this config, attention (naive or
        absorb) and index scoring (exact or fp8)."""
        kind = "moe" if cfg.is_moe_layer(layer) else "dense"
        kinds = ("all", "dense", "moe") if cfg.shortcut_moe else ("all", kind)  # LongCat: both, in sublayers
        no_q_lora = cfg.q_lora_rank is None
        entries = [
            e for e in self.in_order
            if e["scope"] == "layer"
            and applies(e, cfg, index_scoring, layer)
            and e["layers"] in kinds
            and e["path"] in ("both", attn)
            and not (no_q_lora and e["name"] in ("self_attn.q_a", "self_attn.q_a_norm"))
            and not (cfg.n_shared_experts == 0 and e["name"] == "mlp.shared_output")
        ]
        return sublayered(entries) if cfg.shortcut_moe else entries

    def run_names(self, cfg: Config, steps: Sequence[tuple[str | None, str]], layers: Iterable[int],
                  start: Sequence[str] = (), end: Sequence[str] = (), index_scoring: str = "exact") -> list[str]:
        """Every name a run emits, in order: for each step (its phase, None without decode steps,
        and its attention path), the global tensors `start`, each layer's sequence, then `end`."""
        names = []
        start, end = self.with_globals_after(start, cfg), self.with_globals_after(end, cfg)
        for phase, attn in steps:
            scope = "" if phase is None else f"{phase}."
            names += [scope + key for key in start]
            for layer in layers:
                names += [f"{scope}layers.{layer}.{e['name']}" for e in self.layer_sequence(cfg, layer, attn, index_scoring)]
            names += [scope + key for key in end]
        return names

    def with_globals_after(self, keys: Sequence[str], cfg: Config) -> list[str]:
        """The global names `keys`, each followed by the global entries this config emits after it
        (MiniCPM3's embed_scaled after embed)."""
        return [e["name"] for e in self.in_order if e["scope"] == "global" and applies(e, cfg)
                and (e["name"] in keys or e.get("after") in keys)]

    def expected_size(self, symbol: str, cfg: Config) -> int | None:
        """The size a config gives a dimension symbol, or None for runtime dims and unset fields."""
        expr = self.raw["dims"][symbol]["size"]
        if expr == RUNTIME or any(getattr(cfg, f, 0) is None for f in re.findall(r"[a-z_]+", expr)):
            return None  # runtime, or a size of another family (the indexer's, for a config without one)
        return evaluate_size(expr, cfg)

    @cached_property
    def _by_name(self) -> dict[str, dict[str, Any]]:
        return {e["name"]: e for e in self.entries}

    @cached_property
    def in_order(self) -> list[dict[str, Any]]:
        """The entries in execution order: one with `after` (a family's own tensor, appended to the
        catalogue) goes right after the entry it names, which comes before it in the catalogue."""
        ordered = [e for e in self.entries if "after" not in e]
        for e in self.entries:
            if "after" in e:
                ordered.insert(next(i for i, o in enumerate(ordered) if o["name"] == e["after"]) + 1, e)
        return ordered


def sublayered(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A LongCat-Flash layer's entries in its order (model.longcat): sublayer 0's attention, the
    MoE beside the sublayers, sublayer 0's MLP and output, sublayer 1's attention and MLP, the
    layer's output; a sublayer's names under `sub0.` / `sub1.`."""
    names = [e["name"] for e in entries]
    attention = entries[names.index("input_layernorm"): names.index("post_attention_layernorm") + 1]
    moe = [e for e in entries if e["layers"] == "moe"]
    mlp = [e for e in entries if e["layers"] == "dense"] + [e for e in entries if e["name"] == "mlp_output"]
    output = [e for e in entries if e["name"] == "output"]

    def sub(j: int, part: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**e, "name": f"sub{j}.{e['name']}"} for e in part]

    return entries[:1] + sub(0, attention) + moe + sub(0, mlp + output) + sub(1, attention + mlp) + output


def applies(entry: dict[str, Any], cfg: Config, index_scoring: str = "exact", layer: int | None = None) -> bool:
    """Whether a config emits the entry (in `layer`, for a layer's entry): its `when` maps config
    fields to the values under which it is emitted (the router's scoring_func and topk_method,
    has_indexer), the run's choice of index_scoring, or whether the layer reuses the previous
    layer's index choice (GLM-5)."""
    choices = {"index_scoring": index_scoring, "index_reused": layer is not None and cfg.index_reused(layer)}
    when = entry.get("when", {})
    if choices["index_reused"] and "has_indexer" in when:  # GLM-5's shared layer runs no indexer of its own
        return False
    return all((choices[field] if field in choices else getattr(cfg, field)) in values for field, values in when.items())


PARAMETER = re.compile(r"[A-Za-z_][\w.]*\.weight(?!\w)|\b\w+_bias\b")  # q_a_proj.weight, e_score_correction_bias
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


@cache
def load() -> Catalog:
    """catalog.json, with each part file's entries (parts/<part>.json: a family's own tensors,
    each placed by its `after`) appended."""
    folder = resources.files("stepper.catalog")
    raw = json.loads(folder.joinpath("catalog.json").read_text(encoding="utf-8"))
    parts = folder.joinpath("parts")
    for part in sorted((p for p in parts.iterdir() if p.name.endswith(".json")), key=lambda p: p.name) if parts.is_dir() else ():
        raw["tensors"] += json.loads(part.read_text(encoding="utf-8"))["tensors"]
    return Catalog(raw)
