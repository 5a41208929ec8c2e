"""The model's code read as text: it goes on with what emit returns, and its shapes use the catalogue's
symbols. (One emit site per catalogued name: tests/cli/test_emit_sites.py, through catalog.sites.)"""

import ast
import io
import json
import re
import tokenize
from importlib import resources
from pathlib import Path

import pytest

import stepper
from stepper import catalog

ROOT = Path(stepper.__file__).parent
MODEL_FILES = sorted((ROOT / "model").glob("*.py"))
SHAPE_FILES = [*MODEL_FILES, ROOT / "kernels" / "attention.py"]
SHAPE = re.compile(r"(?<![\w\])])\[([^\[\]]*)\]")  # a bracket right after a name or a bracket indexes
TERM = re.compile(r"^(?:\.\.\.|[A-Za-z_][A-Za-z0-9_]*|\d+|[\s()+*/])*$")  # symbols, numbers, + * / ( ) and ...


def emit_calls(tree: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "emit"]


# Tensors shown only, that nothing in the layer computes from: their emit may stand alone
SHOWN_ONLY = {"ffn.experts.clamp_counts", "ffn.shared_experts.clamp_counts",  # DeepSeek-V4: how often the clamp bit
              "self_attn.indexer.kept_of_exact",  # FP8 index scoring's count of the exactly chosen positions it kept
              "attn.sink_mass",  # DeepSeek-V4: the probability the sink takes (the weights drop its column)
              # KDA's writes and states along the way (model.kda): the rule has already used them when shown
              "self_attn.delta", "self_attn.state_per_token", "self_attn.state_per_chunk"}


def shown_only(call: ast.Call) -> bool:
    return bool(call.args) and isinstance(call.args[0], ast.Constant) and call.args[0].value in SHOWN_ONLY


def test_the_model_goes_on_with_what_emit_returns():
    """No emit call is a statement of its own (its result dropped), but for the SHOWN_ONLY tensors,
    and nothing calls an emitter under another name: every emitter call in the model is
    `emit(...)` or `emit.<method>(...)`."""
    for path in MODEL_FILES:
        tree = ast.parse(path.read_text())
        dropped = [n.lineno for n in ast.walk(tree)
                   if isinstance(n, ast.Expr) and n.value in emit_calls(n) and not shown_only(n.value)]
        assert dropped == [], f"{path.name}: emit's result dropped at lines {dropped}"
        for fn in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.Lambda)]:
            emitters = {a.arg for a in fn.args.args
                        if a.annotation is not None and ast.unparse(a.annotation) == "Emitter"}
            assert emitters <= {"emit"}, f"{path.name}:{fn.lineno}: an Emitter named {emitters - {'emit'}}"


def texts(source: str) -> list[tuple[int, str]]:
    """The comments and docstrings of Python source, each with its first line number."""
    out = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
           if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        documented = isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        if documented and ast.get_docstring(node, clean=False) is not None:
            out.append((node.body[0].lineno, ast.get_docstring(node, clean=False)))
    return out


def unknown_symbols(source: str, symbols: set[str]) -> list[str]:
    """Every bracketed shape in the comments and docstrings, `[B, H, T, qk_head]`, checked term by
    term: `line: [shape]: what is wrong` for each symbol not in the table or term not a shape."""
    problems = []
    for line, text in texts(source):
        for shape in SHAPE.findall(text):
            for term in shape.split(","):
                if not TERM.match(term):
                    problems.append(f"{line}: [{shape}]: '{term.strip()}' is not a shape term")
                    continue
                unknown = [s for s in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", term) if s not in symbols]
                problems += [f"{line}: [{shape}]: unknown symbol {s}" for s in unknown]
    return problems


@pytest.fixture(scope="module")
def symbols() -> set[str]:
    """The catalogue's symbols and those the part files (stepper/catalog/parts/*.json, and V4's in
    stepper/catalog/v4/*.json) add."""
    folders = [resources.files("stepper.catalog").joinpath(name) for name in ("parts", "v4")]
    added = [json.loads(f.read_text("utf-8")).get("dims", {}) for parts in folders for f in parts.iterdir()
             if f.name.endswith(".json")]
    return set(catalog.load().raw["dims"]).union(*added)


@pytest.mark.parametrize("path", SHAPE_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shapes_in_comments_and_docstrings_use_the_catalogue_dims(path, symbols):
    assert unknown_symbols(path.read_text(), symbols) == []


def test_the_shape_check_finds_an_unknown_symbol_or_a_non_shape(symbols):
    source = ('"""Module.  [B, T, d]"""\n\n\n'
              'def f(x):\n    """x [B, T, Q] -> [..., H*v_head]"""\n    return x  # [B, C, rope/2]\n')
    assert unknown_symbols(source, symbols) == ["6: [B, C, rope/2]: unknown symbol C", "5: [B, T, Q]: unknown symbol Q"]
    assert unknown_symbols("y = 1  # [a | b]\n", symbols) == ["1: [a | b]: 'a | b' is not a shape term"]
    assert unknown_symbols("y = 1  # [nope+rope, one, ..., 64] from kv[..., :n]\n", symbols) == []
