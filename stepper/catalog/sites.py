"""Where stepper's own code emits each catalogued tensor: `stepper explain` and the debugger's `e`
point from a name to the line that made it.

The sites are found by reading the model's source with `ast`, never by importing or running it:
model code reports a tensor as `emit("self_attn.k_pe", k_pe)` (or `k_pe = emit(...)`, or through
`emit.shown` and `emit.choice`), the callee a name `emit` and the first argument a string literal,
so every such call is a site of that key.
A part used at several sites of a layer names its tensors by an f-string (`emit(f"{site}.comb", ...)`:
DeepSeek-V4's hyper-connections before the attention and the MoE, its two compressors); such a call
is the site of a key no literal names whose shape it fits (`hc_attn.comb`, `hc_ffn.comb`).
The files are the package's own (`stepper/model/**/*.py`, found through `importlib.resources`), so
this works from a source tree and from an installed wheel alike.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

PACKAGE = "stepper"
MODEL = "model"  # the folder of the package whose emit calls are the sites
CALLEE = "emit"
EMITTING = ("shown", "choice")  # emit.shown("key", ...) and emit.choice("key", ...) emit too (seams.trace.Emitter)
FORMATTED = "f:"  # what begins the pattern of an f-string site's keys (no catalogue name begins so)
SIMPLE = (ast.Expr, ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Return)  # statements shown whole


@dataclass(frozen=True)
class Site:
    """One `emit("key", ...)` call in stepper's model code."""

    key: str  # the catalogue name, e.g. 'self_attn.k_pe'
    path: str  # relative to the package's parent folder, e.g. 'stepper/model/attention.py'
    line: int  # of the call
    function: str  # the enclosing function, classes and outer functions first: 'Transformer.head'
    code: tuple[str, ...]  # the source lines of the call (of its whole statement if simple), as written
    code_line: int  # the line number of code[0]

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def sites_of(key: str) -> list[Site]:
    """Every emit site of a catalogue key, in file and line order (one, when the model is right):
    its literal emits, else the f-string emits whose shape it fits."""
    literal = all_sites().get(key, ())
    if literal:
        return list(literal)
    return [site for pattern, found in all_sites().items() if pattern.startswith(FORMATTED)
            and re.fullmatch(pattern.removeprefix(FORMATTED), key) for site in found]


@cache
def all_sites() -> dict[str, tuple[Site, ...]]:
    """Catalogue key -> its emit sites, over every module of stepper/model/."""
    found: dict[str, list[Site]] = {}
    for path, source in model_sources():
        for site in sites_in(source, path):
            found.setdefault(site.key, []).append(site)
    return {key: tuple(sites) for key, sites in found.items()}


def model_sources() -> Iterator[tuple[str, str]]:
    """(path relative to the package's parent, source text) of every .py file under stepper/model/."""
    yield from python_files(resources.files(PACKAGE).joinpath(MODEL), f"{PACKAGE}/{MODEL}")


def python_files(folder: Traversable, relative: str) -> Iterator[tuple[str, str]]:
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.is_dir() and entry.name != "__pycache__":
            yield from python_files(entry, f"{relative}/{entry.name}")
        elif entry.name.endswith(".py"):
            yield f"{relative}/{entry.name}", entry.read_text(encoding="utf-8")


def sites_in(source: str, path: str) -> list[Site]:
    """The emit sites of one module's source, each with its enclosing function."""
    lines = source.splitlines()
    sites: list[Site] = []

    def visit(node: ast.AST, scope: tuple[str, ...], statement: ast.stmt | None) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            scope = (*scope, node.name)
        if isinstance(node, ast.stmt):
            statement = node
        key = emitted_key(node)
        if key is not None:
            span = statement if isinstance(statement, SIMPLE) else node  # `k_pe = emit(...)`: the whole line
            code = tuple(lines[span.lineno - 1 : span.end_lineno])
            sites.append(Site(key, path, node.lineno, ".".join(scope) or "<module>", code, span.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, scope, statement)

    visit(ast.parse(source, filename=path), (), None)
    return sites


def emitted_key(node: ast.AST) -> str | None:
    """'self_attn.k_pe' for a call `emit("self_attn.k_pe", ...)`; for `emit(f"{site}.comb", ...)`
    FORMATTED and the pattern of the keys it makes (`[\\w.]+\\.comb`); else None."""
    if not (isinstance(node, ast.Call) and (isinstance(node.func, ast.Name) and node.func.id == CALLEE
                                            or isinstance(node.func, ast.Attribute) and node.func.attr in EMITTING
                                            and isinstance(node.func.value, ast.Name)
                                            and node.func.value.id == CALLEE)):
        return None
    first = node.args[0] if node.args else None
    if isinstance(first, ast.JoinedStr):
        return FORMATTED + "".join(re.escape(part.value) if isinstance(part, ast.Constant) else r"[\w.]+"
                                   for part in first.values)
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
