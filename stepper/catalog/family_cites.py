"""The families' own reference lines. The catalogue cites DeepSeek-V3's files (transformers'
modeling_deepseek_v3.py, the Hub's modeling_deepseek.py); a family that transformers models in a
file of its own cites that file's lines for the tensors it computes as DeepSeek-V3 does: one JSON
file per model_type (stepper/catalog/cites/<model_type>.json, shipped in the package), its `path`
under transformers' package folder and, by catalogue name, a citation as the catalogue writes one
(`lines`, `symbol`, `text`: the first cited line). tests/reference/test_catalog_refs.py checks
them against the installed transformers, as the catalogue's own.

A tensor the family's file has no line for (the absorbed path's, which only DeepSeek's inference
code computes) keeps the catalogue's citations, each naming its own file. Where a model's KDA and MLA
layers emit a tensor of one name from different lines (`self_attn.attn_output`, `self_attn.o_proj`),
the KDA layers' line is cited as `kda:NAME`, and `stepper explain` shows it for a KDA layer it is
asked about (`layers.0.self_attn.o_proj`).

"The references call it" (the catalogue's `variable`) is modeling_deepseek.py's name, and a family's
file may name the tensor otherwise (transformers' `q_pass` for DeepSeek's `q_nope`). The family's name
is read from its cited line, never kept a second time: the catalogue's name where the family's line
assigns that name too (with the catalogue's words about it where the two lines are alike); else,
where the two first lines are one statement (as many names assigned, by the same call:
`q_nope, q_pe = torch.split(` and `q_pass, q_rot = torch.split(`), the name the family's line
assigns in its place; else none, and explain shows no name rather than DeepSeek's.
"""

from __future__ import annotations

import ast
import json
import re
from functools import cache
from importlib import resources
from typing import Any

FOLDER = "cites"
KDA = "kda:"  # before a name: the line of a KDA layer's, where MLA's and KDA's layers name a tensor alike
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


def reference(cfg: Any, names: tuple[str, ...], deepseek: dict[str, Any]) -> dict[str, Any]:
    """A tensor's reference for cfg's model: its family's transformers line in place of DeepSeek-V3's
    two where the family's file has one for the first of its `names` it cites (a LongCat sublayer's
    `sub0.output`, then its catalogue name `output`); the catalogue's (`deepseek`) otherwise, or with
    no config."""
    family = cite_files().get(getattr(cfg, "model_type", None) or "")
    cited = next((family["tensors"][n] for n in names if n in family["tensors"]), None) if family else None
    if cited is None:
        return deepseek
    own = own_variable(deepseek.get("variable"), (deepseek.get(REPLACED[0]) or {}).get("text"), cited["text"])
    return {**deepseek, **dict.fromkeys(REPLACED), "variable": own, SOURCE: {**cited, "path": family["path"]}}


def own_variable(variable: str | None, deepseeks: str | None, families: str) -> str | None:
    """The family's name for what modeling_deepseek.py's first line `deepseeks` calls `variable` (a
    name and words about it: 'q (inner self.q_a_proj(...), unnamed)'), read from the family's first line."""
    name = re.match(r"[\w.]+", variable or "")
    theirs, ours = assigned(deepseeks or ""), assigned(families)
    if name is None or name[0] in ours[0]:  # the same name; the words are about DeepSeek's line
        return name and (variable if (deepseeks or "").strip() == families.strip() else name[0])
    if name[0] in theirs[0] and len(theirs[0]) == len(ours[0]) and theirs[1] == ours[1] is not None:
        return ours[0][theirs[0].index(name[0])] + variable[name.end():]
    return None


def assigned(line: str) -> tuple[list[str], str | None]:
    """The names a line assigns and its outermost call, indexing dropped ('q_pass, q_rot = torch.split('
    -> (['q_pass', 'q_rot'], 'torch.split')); ([], None) for a line that assigns nothing alone."""
    try:
        statement = ast.parse(line.strip() + (")" if line.rstrip().endswith("(") else "")).body[0]
    except (SyntaxError, IndexError):
        return [], None
    target = getattr(statement, "target", None) or (getattr(statement, "targets", None) or [None])[0]
    if not isinstance(statement, ast.Assign | ast.AnnAssign) or target is None:
        return [], None
    names = [ast.unparse(t) for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
    call = statement.value.func if isinstance(statement.value, ast.Call) else None
    return names, re.sub(r"\[[^]]*\]", "", ast.unparse(call)) if call is not None else None
