"""`stepper explain NAME` and the debugger's `e`: a tensor's catalogue entry on screen.

What it is, its shape and formula, the explanation for learners (its sizes the run's own: the
catalogue's explanations are templates, `catalog.texts`), then where it is computed:
stepper's own emit site (file:line and function, found from the code by `catalog.sites`) with its
line of code, and the reference implementations' cited lines (transformers' shown when it is
installed), then the names other implementations use.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.text import Text

from stepper import catalog
from stepper.catalog import sites, texts
from stepper.config import Config
from stepper.trace import did_you_mean
from stepper.untrusted import shown

REFERENCES = (
    ("modeling_deepseek.py", "modeling_deepseek.py"),
    ("transformers", "transformers modeling_deepseek_v3.py"),
    ("inference", "DeepSeek inference/model.py"),
)


def explain_text(cat: catalog.Catalog, entry: dict[str, Any], cfg: Config) -> Text:
    text = Text()
    text.append(f"{entry['name']}\n", style="bold cyan")
    text.append(f"{entry['description']}\n")
    dims = ", ".join(f"{s} ({cat.raw['dims'][s]['label']}"
                     + (f" = {cat.expected_size(s, cfg)}" if cat.expected_size(s, cfg) is not None else "") + ")"
                     for s in entry["dims"])
    text.append("shape   ", style="dim")
    text.append(f"[{dims}]\n")
    text.append("formula ", style="dim")
    text.append(f"{entry['formula']}\n")
    text.append(f"\n{texts.render(entry['explain'], cfg)}\n\n")
    text.append(emit_sites_text(entry["name"]))
    ref = entry["reference"]
    for source, title in REFERENCES:
        lines = ref.get(source)
        if lines:
            text.append(f"{title}", style="dim")
            text.append(f"  lines {lines[0]}-{lines[1]}  ({ref.get('variable', '')})\n")
            text.append(reference_source(source, lines))
    aliases = {k: v for k, v in entry.get("aliases", {}).items() if v}
    if aliases:
        text.append("aliases ", style="dim")
        text.append("; ".join(f"{k}: {v}" for k, v in aliases.items()))
    return text


def emit_sites_text(key: str) -> Text:
    """'stepper emits it  stepper/model/attention.py:188  in latent()' and that line, for each emit site."""
    text = Text()
    for site in sites.sites_of(key):
        text.append("stepper emits it", style="dim")
        text.append(f"  {site.where}  in {site.function}()\n")
        text.append(numbered(site.code, site.code_line))
    return text


def reference_source(source: str, lines: list[int]) -> Text:
    """The cited lines of the installed transformers file, when transformers is installed."""
    if source != "transformers":
        return Text()
    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):
        return Text()
    if spec is None or spec.origin is None:
        return Text()
    path = Path(spec.origin).parent / "models" / "deepseek_v3" / "modeling_deepseek_v3.py"
    if not path.exists():
        return Text()
    return numbered(path.read_text(encoding="utf-8").splitlines()[lines[0] - 1 : lines[1]], lines[0])


def numbered(code: Sequence[str], first: int) -> Text:
    """Source lines with their line numbers, indented under the line that cites them (escaped: the
    reference lines are read from the installed transformers' file)."""
    return Text("".join(f"    {first + i:4d}  {shown(line)}\n" for i, line in enumerate(code)), style="green")


def not_found(cat: catalog.Catalog, query: str) -> str:
    """The one line for a query that names no tensor, with the nearest names."""
    return f"no tensor named '{query}' in the catalogue{did_you_mean(query, cat.names())} (stepper tree lists them)"


def also_named(cat: catalog.Catalog, query: str, shown_entries: Sequence[dict[str, Any]]) -> str:
    """'also with "logits" in the name: mlp.gate.logits' for the names a bare word matched less
    closely than the ones shown; "" when there are none."""
    word = catalog.key_of(query)
    others = [e["name"] for e in cat.containing(word) if e not in shown_entries] if word.isidentifier() else []
    return f"also with '{word}' in the name: {', '.join(others)}" if others else ""
