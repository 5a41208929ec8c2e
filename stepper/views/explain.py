"""`stepper explain NAME` and the debugger's `e`: a tensor's catalogue entry on screen.

What it is, its shape and formula, the explanation for learners, then where it is computed:
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
from stepper.catalog import sites
from stepper.config import Config
from stepper.untrusted import shown

REFERENCES = (
    ("modeling_deepseek.py", "modeling_deepseek.py"),
    ("transformers", "transformers modeling_{model}.py"),
    ("inference", "DeepSeek inference/model.py"),
    ("inference_v32", "DeepSeek-V3.2-Exp inference/model.py"),
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
    text.append(f"\n{entry['explain']}\n\n")
    text.append(emit_sites_text(entry["name"]))
    ref = entry["reference"]
    model = ref.get("transformers_model", "deepseek_v3")  # the family's own transformers file
    for source, title in REFERENCES:
        lines = ref.get(source)
        if lines:
            text.append(title.format(model=model), style="dim")
            text.append(f"  lines {lines[0]}-{lines[1]}  ({ref.get('variable', '')})\n")
            text.append(reference_source(source, lines, model))
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


def reference_source(source: str, lines: list[int], model: str = "deepseek_v3") -> Text:
    """The cited lines of the installed transformers file of `model`, when transformers is installed."""
    if source != "transformers":
        return Text()
    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):
        return Text()
    if spec is None or spec.origin is None:
        return Text()
    path = Path(spec.origin).parent / "models" / model / f"modeling_{model}.py"
    if not path.exists():
        return Text()
    return numbered(path.read_text(encoding="utf-8").splitlines()[lines[0] - 1 : lines[1]], lines[0])


def numbered(code: Sequence[str], first: int) -> Text:
    """Source lines with their line numbers, indented under the line that cites them (escaped: the
    reference lines are read from the installed transformers' file)."""
    return Text("".join(f"    {first + i:4d}  {shown(line)}\n" for i, line in enumerate(code)), style="green")
