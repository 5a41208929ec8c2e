"""One hop from a name to the code: every catalogued tensor has exactly one `emit("name", ...)` in
stepper/model/, and `stepper explain` and the debugger's `e` print its file:line and function."""

import ast
import io
import json
import re
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
from rich.console import Console

import stepper
from stepper import catalog
from stepper.catalog import sites
from stepper.presets import preset
from stepper.session import preset_config
from stepper.views.explain import explain_text

NAMES = catalog.load().names()
ROOT = Path(stepper.__file__).resolve().parent.parent  # the folder the printed paths are relative to
SITE_LINE = re.compile(r"^stepper emits it  (?P<path>\S+):(?P<line>\d+)  in (?P<function>\S+)\(\)$", re.MULTILINE)


FAMILIES = (preset("tiny"), preset_config("tiny-v4"), preset("tiny-hy4"))  # MLA's stream, V4's, Hy4's


def explained(name: str) -> str:
    """explain's text of a name, for a model whose family emits it (its sizes are that config's)."""
    console = Console(width=200, no_color=True, record=True, file=io.StringIO())
    cfg = next(cfg for cfg in FAMILIES if name in catalog.around(cfg).names())
    console.print(explain_text(catalog.load(), catalog.load().entry(name), cfg))
    return console.export_text()


def enclosing_function(path: Path, line: int) -> str:
    """The dotted names of the classes and functions around `line`, innermost last."""
    names: list[str] = []

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, ast.FunctionDef | ast.ClassDef) and child.lineno <= line <= child.end_lineno:
                inner = [*scope, child.name]
                names[:] = inner
            visit(child, inner)

    visit(ast.parse(path.read_text(encoding="utf-8")), [])
    return ".".join(names)


@pytest.mark.parametrize("name", NAMES)
def test_every_catalogued_name_has_exactly_one_emit_site(name):
    found = sites.sites_of(name)
    assert len(found) == 1, f"{name}: {len(found)} emit sites {[s.where for s in found]}, expected exactly one"


@pytest.mark.parametrize("name", NAMES)
def test_explain_points_at_the_line_that_emits_the_name(name):
    printed = SITE_LINE.findall(explained(name))
    assert len(printed) == 1, f"{name}: explain shows {len(printed)} emit sites, expected one"
    path, line, function = printed[0]
    assert path.startswith("stepper/model/")
    source = (ROOT / path).read_text(encoding="utf-8").splitlines()
    # emit("name" (or emit.shown, emit.choice), or a part's emit(f"{site}.name"
    made_by = re.search(r'emit(?:\.shown|\.choice)?\((f?)"([^"]*)"', source[int(line) - 1])
    assert made_by, source[int(line) - 1]
    if made_by[1]:
        assert re.fullmatch(re.sub(r"\\\{[^}]*\\\}", r"[\\w.]+", re.escape(made_by[2])), name), source[int(line) - 1]
    else:
        assert made_by[2] == name, source[int(line) - 1]
    assert enclosing_function(ROOT / path, int(line)) == function


def part_names() -> set[str]:
    """The names the catalogue's part files (stepper/catalog/parts/*.json, and V4's in
    stepper/catalog/v4/*.json) describe."""
    folders = [resources.files("stepper.catalog").joinpath(name) for name in ("parts", "v4")]
    files = [f for parts in folders for f in parts.iterdir() if f.name.endswith(".json")]
    return {e["name"] for f in files for e in json.loads(f.read_text("utf-8"))["tensors"]}


def test_every_emit_site_is_a_catalogued_name():
    names = set(NAMES) | part_names()
    literal = {key for key in sites.all_sites() if not key.startswith(sites.FORMATTED)}
    assert literal <= names
    for key in set(sites.all_sites()) - literal:  # a part's f-string emit: some catalogued name fits it
        assert any(re.fullmatch(key.removeprefix(sites.FORMATTED), name) for name in names), key


def test_sites_are_read_from_the_source_without_running_it():
    source = '''
def outer(x, emit):
    emit("a.first", x)
    y = emit("a.second",
             x + 1)
    def inner():
        emit("a.third", x)
    emit(name_of(x), x)    # not a literal: no site
    other("a.fourth", x)   # not emit: no site
    return emit("a.fifth", y)

class Model:
    def head(self, emit):
        emit("a.sixth", 1)
'''
    found = sites.sites_in(source, "stepper/model/example.py")
    assert [(s.key, s.line, s.function) for s in found] == [
        ("a.first", 3, "outer"), ("a.second", 4, "outer"), ("a.third", 7, "outer.inner"),
        ("a.fifth", 10, "outer"), ("a.sixth", 14, "Model.head"),
    ]
    second = found[1]
    assert second.code == ('    y = emit("a.second",', "             x + 1)") and second.code_line == 4
    assert second.where == "stepper/model/example.py:4"


def run_explain(*args: str, cwd=None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stepper", *args], capture_output=True, text=True, timeout=120,
                          check=False, cwd=cwd, env=env)


def test_explain_k_pe_names_the_file_and_line_of_stepper_that_emits_it():
    out = run_explain("explain", "k_pe")
    assert out.returncode == 0, out.stderr
    (where,) = [s.where for s in sites.sites_of("self_attn.k_pe")]
    assert re.search(rf"^stepper emits it  {re.escape(where)}  in \w+\(\)$", out.stdout, re.MULTILINE), out.stdout
    lines = out.stdout.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("stepper emits it"))
    assert 'emit("self_attn.k_pe"' in lines[at + 1]  # the line itself, under it
    before, _, after = out.stdout.partition("stepper emits it")
    assert "modeling_deepseek.py  lines" in after and "modeling_deepseek.py  lines" not in before


def test_the_debuggers_explain_names_the_emit_site():
    out = subprocess.run([sys.executable, "-m", "stepper", "step", "--plain", "--break", "layers.1.self_attn.k_pe"],
                         input="e\ne mlp.gate.topk_idx\nq\n", capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    for key in ("self_attn.k_pe", "mlp.gate.topk_idx"):
        (where,) = [s.where for s in sites.sites_of(key)]
        assert f"stepper emits it  {where}  in " in out.stdout


def test_sites_come_from_the_package_files_wherever_it_is_installed(tmp_path):
    """A copy of the package outside the repository (as a wheel installs it) finds the same sites."""
    shutil.copytree(ROOT / "stepper", tmp_path / "stepper", ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import stepper; from stepper.catalog import sites; print(stepper.__file__); "
            "print(*(s.where for s in sites.sites_of('self_attn.k_pe')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
                         cwd=tmp_path, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    installed, where = out.stdout.splitlines()
    assert installed.startswith(str(tmp_path))
    assert where == sites.sites_of("self_attn.k_pe")[0].where
