"""DeepSeek-V4's tensors explained (`stepper explain NAME --model tiny-v4`) and listed layer by layer
(`stepper tree --model tiny-v4`), from its catalogue part files (stepper/catalog/v4/*.json, in the
part format; `logits` is the MLA family's entry, the same tensor) and, for the order and the
branches, from what the layers emit (session.v4_layer_emits: the model code run on a miniature).

V4 is not in the families' registry (stepper.families) yet: its layers run on hc_mult streams in
a model of its own (families.deepseek_v4.V4Model), which the registry's Transformer, the run plan
and derive do not know, so its parts are kept beside the registered ones, not merged into the
catalogue every MLA query searches.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from fnmatch import fnmatchcase
from functools import cache
from importlib import resources
from typing import Any

from stepper import catalog
from stepper.untrusted import shown

PARTS = ("v4_residual", "v4_router", "v4_attention")
SHARED = ("logits",)  # the MLA family's entry
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


@cache
def part(name: str) -> dict[str, Any]:
    """One V4 part file (stepper/catalog/v4/NAME.json)."""
    return json.loads(resources.files("stepper.catalog").joinpath(f"v4/{name}.json").read_text(encoding="utf-8"))


@cache
def catalogue() -> catalog.Catalog:
    """The registered catalogue with V4's entries and symbols added, to name a V4 run's dims."""
    raw = catalog.load().raw
    extra = [entry for name, entry in entries().items() if name not in SHARED]
    return catalog.Catalog({**raw, "dims": symbols(), "tensors": [*raw["tensors"], *extra]})


@cache
def entries() -> dict[str, dict[str, Any]]:
    """Every V4 entry by name."""
    found: dict[str, dict[str, Any]] = {name: catalog.load().entry(name) for name in SHARED}
    for name in PARTS:
        found |= {e["name"]: e for e in part(name)["tensors"]}
    return found


@cache
def symbols() -> dict[str, dict[str, str]]:
    """Every dim symbol: the catalogue's and V4's own."""
    table = dict(catalog.load().raw["dims"])
    for name in PARTS:
        table |= part(name).get("dims", {})
    return table


def find(query: str) -> list[dict[str, Any]]:
    """Entries for a query: a name (with or without its phase and layer), a glob, a dotted tail
    (`comb`), a word of names (`gate`)."""
    key = catalog.key_of(query)
    table = entries()
    if key in table:
        return [table[key]]
    for test in (lambda n: any(c in key for c in "*?[") and (fnmatchcase(n, key) or fnmatchcase(n, "*." + key)),
                 lambda n: n.endswith("." + key), lambda n: key in n):
        found = [e for n, e in table.items() if test(n)]
        if found:
            return found
    return []


def size_of(symbol: str, cfg) -> int | None:
    """A dim's size for the config: its expression over config fields; None at run time."""
    expression = symbols().get(symbol, {}).get("size", "runtime")
    try:
        return evaluate(ast.parse(expression, mode="eval").body, cfg)
    except (SyntaxError, ValueError):
        return None


def evaluate(node: ast.expr, cfg) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name) and isinstance(getattr(cfg, node.id, None), int):
        return getattr(cfg, node.id)
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](evaluate(node.left, cfg), evaluate(node.right, cfg))
    raise ValueError(ast.unparse(node))


def dims_text(entry: dict[str, Any], cfg) -> str:
    parts = []
    for symbol in entry["dims"]:
        size = size_of(symbol, cfg)
        label = symbols().get(symbol, {}).get("label", "")
        parts.append(f"{symbol} ({label}{'' if size is None else f' = {size}'})")
    return "[" + ", ".join(parts) + "]"


def filled(text: str, cfg) -> str:
    """An entry's text with its {field} placeholders read from the config (left as written when
    the config has no such number)."""
    def field(match: re.Match) -> str:
        value = getattr(cfg, match.group(1), None)
        return match.group(0) if value is None or isinstance(value, (tuple, dict)) else f"{value:g}" \
            if isinstance(value, float) else str(value)
    return re.sub(r"\{([a-z_]+)\}", field, text)


def explain(entry: dict[str, Any], cfg) -> str:
    """An entry's lines: name and description, shape, formula, explanation, the reference's lines."""
    lines = [f"{entry['name']}: {entry['description']}", f"  shape {dims_text(entry, cfg)} {entry['dtype']}",
             f"  formula  {entry['formula']}", f"  {filled(entry['explain'], cfg)}"]
    for source, cited in entry["reference"].items():
        if isinstance(cited, dict) and "lines" in cited:
            first, last = cited["lines"]
            where = cited.get("path", source)
            lines.append(f"  {source}: {where} lines {first}-{last}: {cited['text'].strip()}")
    aliases = [f"{k}: {v}" for k, v in entry.get("aliases", {}).items() if v]
    if aliases:
        lines.append("  also " + " · ".join(aliases))
    return "\n".join(lines)


def tree(cfg, layer: int, emitted: list[tuple[str, tuple[int, ...], str]]) -> str:
    """One layer's tensors in the order it emits them, each with its dims for this config and its
    description."""
    kind = {"sliding": "sliding window", "csa": "CSA (compressed, indexer)", "hca": "HCA (heavily compressed)"}
    routing = "hash-routed" if cfg.is_hash_layer(layer) else "score-routed"
    lines = [f"layer {layer} of {shown(cfg.name)}: {kind[cfg.layer_kind(layer)]}, {routing}"]
    table = entries()
    for key, _, _ in emitted:
        entry = table.get(key)
        dims = "" if entry is None else "[" + ", ".join(
            s if (n := size_of(s, cfg)) is None else f"{n}" for s in entry["dims"]) + "]"
        description = "(no catalogue entry)" if entry is None else entry["description"]
        lines.append(f"  {key:<36} {dims:<22} {description}")
    return "\n".join(lines)
