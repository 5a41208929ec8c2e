"""The families' own reference lines. The catalogue cites DeepSeek-V3's files (transformers'
modeling_deepseek_v3.py, the Hub's modeling_deepseek.py); a family that transformers models in a
file of its own cites that file's lines for the tensors it computes as DeepSeek-V3 does: one JSON
file per model_type (stepper/catalog/cites/<model_type>.json, shipped in the package), its `path`
under transformers' package folder and, by catalogue name, a citation as the catalogue writes one
(`lines`, `symbol`, `text`: the first cited line). tests/reference/test_catalog_refs.py checks
them against the installed transformers, as the catalogue's own.

A tensor the family's file has no line for (the absorbed path's, which only DeepSeek's inference
code computes) keeps the catalogue's citations, each naming its own file.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

FOLDER = "cites"
SOURCE = "transformers"  # the catalogue's reference the families' citations replace
REPLACED = ("modeling_deepseek.py", SOURCE)  # DeepSeek-V3's lines, not this family's


@cache
def cite_files() -> dict[str, dict[str, Any]]:
    """model_type -> {"path": ..., "tensors": {name: citation}} for every family with a file."""
    folder = resources.files("stepper.catalog").joinpath(FOLDER)
    return {f.name.removesuffix(".json"): json.loads(f.read_text(encoding="utf-8"))
            for f in sorted(folder.iterdir(), key=lambda f: f.name) if f.name.endswith(".json")}


def has_own_file(cfg: Any) -> bool:
    """Whether transformers writes cfg's family in a modeling file of its own (cites/ has it)."""
    return (getattr(cfg, "model_type", None) or "") in cite_files()


def reference(cfg: Any, name: str, deepseek: dict[str, Any]) -> dict[str, Any]:
    """A tensor's reference for cfg's model: its family's transformers line in place of DeepSeek-V3's
    two where the family's file has one; the catalogue's (`deepseek`) otherwise, or with no config."""
    family = cite_files().get(getattr(cfg, "model_type", None) or "")
    cited = family["tensors"].get(name) if family else None
    if cited is None:
        return deepseek
    return {**deepseek, **dict.fromkeys(REPLACED), SOURCE: {**cited, "path": family["path"]}}
