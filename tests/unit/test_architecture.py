"""The package's architecture, as docs/design-notes.md describes it: rooms whose imports point one
way, no import cycles (imports inside functions included), and a model small enough to read.

Read from the source with `ast`, never by importing it, so an import made only inside a function
counts as much as one at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import stepper

PACKAGE = Path(stepper.__file__).resolve().parent

# What each room may import besides itself. A room is a subpackage (model, kernels, ...) or a
# top-level module (config, session, ...); "stepper" is the package's __init__ (the version, and
# the API loaded on first use). The modules of a grouped room (GROUPED: tensors/, seams/,
# untrusted/) are placed one by one ("tensors.tiled", "seams.trace"; the package's __init__ is the
# room's own name), so grouping them keeps each one's imports as strict as before. The rooms below
# everything may be imported by any other; among themselves, as listed.
BELOW_EVERYTHING: dict[str, set[str]] = {
    "version": set(),
    "errors": set(),
    "seams": set(),  # the room's __init__: its docstring only
    "seams.swap": set(),
    "seams.trace": {"tensors.tensor", "errors"},
    "seams.first_nan": {"seams.trace", "tensors.tensor"},  # a sink: the first tensor shown holding a NaN
    "tensors": set(),  # the room's __init__: its docstring only
    "tensors.tensor": {"tensors.statistics"},  # what a tensor of a run is: an array, or a LazyTensor made when read
    "tensors.tiled": {"tensors.tensor"},
    "tensors.statistics": {"kernels.cpu_caches"},  # the L2 its passes are cut to
    "kernels.cpu_caches": set(),  # the CPU's cache sizes, read from the machine: the kernels' tiles and blocks
    "kernels.parallel": set(),  # the cores, and work split between them
    "tensors.chunked": {"tensors.tensor"},
    "tensors.spill": {"tensors.statistics"},  # a chunked prefill's held tensors on disk while their ranges grow
    "config": {"errors", "untrusted.jsonfile", "untrusted", "untrusted.regex_subset", "untrusted.paths"},
    "untrusted.regex_subset": {"errors", "untrusted"},
    "dtypes": set(),
    "sizes": set(),  # a size in bytes said in the largest binary unit it reaches
    "untrusted.jsonfile": {"errors"},
    "untrusted.paths": {"errors", "untrusted"},  # what is at a path given: a folder that cannot be read, a link loop
    "files": {"errors", "untrusted"},  # every file stepper writes or removes goes through it
    "untrusted": set(),  # the room's __init__: text from a file or a user made safe to show (shown, cut)
    "text": {"errors", "untrusted.jsonfile", "untrusted"},
}
MAY_IMPORT: dict[str, set[str]] = {
    **BELOW_EVERYTHING,
    "presets": {"config", "families"},  # a preset's config.json, read by its family's reader
    "catalog": {"config", "families"},  # the registered families' part files; what a layer emits, from the model
    "fp8": set(),
    "fp4": {"fp8"},  # FP8 weights with E8M0 block scales are written with fp8's e4m3
    "seams.patching": set(),
    "seams.experiments": {"seams.patching"},  # the helpers of common experiments, made of patches
    "int4": set(),
    "weights": {"fp8", "int4", "fp4"},
    "kernels": {"weights", "fp8", "int4", "fp4"},
    "model": {"kernels", "weights", "fp8", "int4"},
    # The registry: each family's config reader, decoder layer, catalogue parts, miniature; what a layer emits
    "families": {"model", "kernels", "weights", "fp8", "int4"},
    "prefill": {"model", "catalog", "families"},  # a prefill in chunks of positions, its tensors shown whole
    "session": {"model", "kernels", "weights", "presets", "prefill", "families"},
    # One plan of a run: its auto choices, names, patterns, patches (the helpers' forms: seams.experiments) and
    # memory, for every entry point; the names the model around a family's layers emits (families.derive)
    "planning": {"session", "catalog", "model", "kernels", "weights", "presets", "prefill", "seams.patching",
                 "seams.experiments", "families"},
    # views: what a run computes of a shown tensor
    # stepper bench: the machine's ceilings, full-size layers of every family, transformers paired
    "bench": {"prefill", "views", "families", "model", "kernels", "weights", "fp8", "int4", "fp4", "presets"},
    "views": {"session", "catalog", "weights", "fp8", "int4", "fp4", "presets", "seams.patching"},
    "lessons": {"views", "planning", "session", "model", "kernels", "weights", "fp8", "int4", "catalog", "presets"},
    "fixtures": {"views", "planning", "session", "model", "kernels", "weights", "fp8", "int4", "fp4", "catalog",
                 "presets", "families"},  # a fixture's config, read by its family; the formats its manifest names
    "cli": {"lessons", "fixtures", "views", "bench", "planning", "session", "model", "kernels", "weights", "fp8",
            "int4", "catalog", "presets", "seams.patching"},
    "__main__": {"cli"},
    # The library on top: a run planned as the command line plans one (planning), as functions
    "api": {"lessons", "fixtures", "views", "planning", "session", "model", "kernels", "weights", "fp8", "catalog",
            "presets", "seams.patching", "seams.experiments"},
    "stepper": {"api"},  # the package's __init__: its version, and the API loaded on first use
}
NEVER_IMPORT_FROM = {"model", "weights", "fp8", "int4", "fp4", "kernels"}  # ... the rooms that present things
PRESENTATION = {"views", "lessons", "fixtures", "cli"}
MODEL_FILE_LINES = 300
MODEL_FUNCTION_LINES = 40
# Each room's source lines (its .py files, blank lines and comments included), about 20% above
# their size when the budget was set: a room that outgrows its budget is split, trimmed, or given
# a larger one here on purpose. TOP_LEVEL is the modules directly under stepper/.
TOP_LEVEL = "(top level)"
ROOM_LINES = {
    TOP_LEVEL: 4000,  # 3,193 lines
    # 1,050 when set: ceilings, checkpoints, layers, transformers paired, long context, KDA, V4 attention;
    # 1,344 with the V4-Flash layer figures (CSA, HCA) and the INT4 and FP8 layers in turn
    "bench": 1650,
    # 422; 625 with the families' own words (family_notes, moved out of config.py's MlaVariants); 731 with their
    # own names for a tensor, read from their cited lines (family_cites); 746 with a layer's own facts in its axes'
    # labels (DeepSeek-V4's window slots: 2m on a CSA layer, m on an HCA one)
    "catalog": 780,
    "cli": 2800,  # 1,846; 2,350 with usage (help naming arguments as written by hand, whatever typer writes)
    "families": 4000,  # 252 when set, with every 2026 family about to arrive
    # 2,388; 2,936 with candidates read tensor by tensor (.npz headers measured); 3,150 with the porter's view of a
    # divergence (the candidate's own name and index of it, a router weight's token and expert, rotary angle rounding)
    "fixtures": 3250,
    "fp4": 400,  # 332
    "fp8": 400,  # 275
    "int4": 300,  # 241
    # 2,322 with the choice of BLAS for the weights' products (gemm); 2,510 with FP8 parts' probe; 2,616 with
    # INT4, FP4 and BF16 tiles that follow the BLAS (OpenBLAS's direct small products, padding, tile heights);
    # 2,885 with few tokens' tiles in direct parts and blocks, and FP4 products shared with the helper processes
    # 3,461 with whole experts shared with the helper (kernels.experts)
    "kernels": 3600,
    "lessons": 4100,  # 3,397
    # 1,160; 1,575 with issue 33's MLA families' parts, about 2,000 with Kimi Linear's, DeepSeek-V4's
    # attention adding 662, its residual, routers, experts and layer 309
    "model": 3400,
    # 552; 711 with the long-run note, the files an index does not name, the seeded weights' share; 761 with the
    # tensors DeepSeek-V4's routing picture is drawn from (picture_tensors)
    "planning": 780,
    # 553; 711 with the choice a set or a patch of indices is checked against (trace.Choice); 833 with the
    # experiment helpers on DeepSeek-V4's and KDA's layers too (seams.experiments, their forms for each kind of layer)
    "seams": 900,
    # 530; 720 with the spill of a chunked prefill's held tensors; 809 with arithmetic refused in words; 851 with
    # integer tensors' own lattice (bins of whole integers)
    "tensors": 900,  # 873 with same_values (compared a block at a time) and tiles of any trailing dims (KDA states)
    "untrusted": 380,  # 233; 308 with the paths a user gives (untrusted.paths)
    # 3,811; DeepSeek-V4 adds its pictures (streams and comb, a query's reach), its catalogue view, FP4 codes;
    # 5,010 with explain's checked parameters, a pipe's whole trees and tables, a new user's review mended;
    # 5,634 with pictures of NaN and infinities, hints and pictures each model's own, explain across families;
    # 5,808 with globs read in what a model emits and LongCat's sublayers lined up in a comparison; 5,911 with
    # integer tensors shown as integers and a LongCat sublayer's name explained as that sublayer's; 6,004 with a
    # display's text fitted to the terminal of a Python prompt; then legends that keep each item whole at 80
    # columns (pictures.legend) and s state's note at the console's width
    "views": 6050,
    # 3,778, of which ~700 read and check DeepSeek-V4's published layout; 4,476 with the config
    # field the weights contradict; 4,628 with the files an index does not name; 4,721 with seeded weights kept;
    # 4,804 with the layouts transformers' save_pretrained writes and a shard cut short refused before its read;
    # 5,078 with DeepSeek-V4 as transformers saves it (its config.json's form and its tensors' names); 5,154 with
    # Mistral Large 4's seeded query scales and LeRoPE alpha
    "weights": 5200,
}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(rel.parts).removesuffix(".__init__")


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


GROUPED = {"tensors", "seams", "untrusted"}  # rooms whose modules are placed in the layering one by one
# modules below everything in a room that is not: the L2 the tiles are cut to, the cores work is split across
PLACED_ALONE = {"kernels.cpu_caches", "kernels.parallel"}


def room(module: str) -> str:
    parts = module.split(".")
    if ".".join(parts[1:3]) in PLACED_ALONE:
        return ".".join(parts[1:3])
    if len(parts) > 2 and parts[1] in GROUPED:
        return ".".join(parts[1:3])
    return parts[1] if len(parts) > 1 else "stepper"


def imports(path: Path, known: set[str]) -> set[str]:
    """The stepper modules a file imports, anywhere in it (`from stepper.x import y` counts as
    stepper.x.y when that is a module, else stepper.x)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}: relative import (stepper imports by absolute names)")
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "stepper":
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in known else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "stepper"}
    return found


def import_graph() -> dict[str, set[str]]:
    known = set(MODULES)
    return {name: imports(path, known) - {name} for name, path in MODULES.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle_and_only_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_import_cycles_function_level_imports_included():
    assert cycles(import_graph()) == []


def test_every_room_is_placed_in_the_layering():
    assert {room(m) for m in MODULES} <= set(MAY_IMPORT), "a new room: say in MAY_IMPORT what it may import"


def allowed(name: str) -> set[str]:
    """The rooms a room may import: its own list, and everything below everything."""
    return MAY_IMPORT[name] | (set() if name in BELOW_EVERYTHING else set(BELOW_EVERYTHING))


def test_imports_point_one_way():
    wrong = sorted(
        f"{m} imports {t}" for m, targets in import_graph().items() for t in targets
        if room(t) != room(m) and room(t) not in allowed(room(m))
    )
    assert wrong == []


def test_nothing_outside_the_command_line_imports_it():
    """cli/ is the top of the package: the library (api), lessons and fixtures plan a run through
    stepper.planning, as the command line does, never through the command line's modules."""
    assert "cli" not in set().union(*(allowed(name) for name in MAY_IMPORT if name not in ("cli", "__main__")))
    wrong = sorted(f"{m} imports {t}" for m, targets in import_graph().items() for t in targets
                   if room(t) == "cli" and room(m) not in ("cli", "__main__"))
    assert wrong == []


def test_the_layering_itself_has_no_cycle_and_keeps_presentation_out_of_the_core():
    assert cycles({name: allowed(name) for name in MAY_IMPORT}) == []
    for name in NEVER_IMPORT_FROM | set(BELOW_EVERYTHING):
        assert not allowed(name) & PRESENTATION, name


@pytest.mark.parametrize("path", sorted((PACKAGE / "model").glob("*.py")), ids=lambda p: p.name)
def test_the_model_is_small_enough_to_read(path):
    source = path.read_text(encoding="utf-8")
    assert len(source.splitlines()) <= MODEL_FILE_LINES
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MODEL_FUNCTION_LINES
    ]
    assert long == []


def room_lines(package: Path = PACKAGE) -> dict[str, int]:
    """Source lines per room: each subpackage, and the top-level modules together."""
    lines: dict[str, int] = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package).parts
        name = parts[0] if len(parts) > 1 else TOP_LEVEL
        lines[name] = lines.get(name, 0) + len(path.read_text(encoding="utf-8").splitlines())
    return lines


def test_every_room_keeps_to_its_line_budget():
    lines = room_lines()
    assert sorted(lines) == sorted(ROOM_LINES), "a new room needs a line budget in ROOM_LINES (or an old one removed)"
    over = {name: f"{n} > {ROOM_LINES[name]}" for name, n in lines.items() if n > ROOM_LINES[name]}
    assert over == {}


def test_the_budget_counts_every_line_of_a_room(tmp_path):
    """room_lines on a made-up package: lines of nested modules add up in their room."""
    (tmp_path / "deep" / "er").mkdir(parents=True)
    (tmp_path / "top.py").write_text("a = 1\n\n# note\n")
    (tmp_path / "deep" / "__init__.py").write_text("")
    (tmp_path / "deep" / "er" / "x.py").write_text("x = 1\ny = 2\n")
    (tmp_path / "deep" / "y.py").write_text("z = 3\n")
    assert room_lines(tmp_path) == {TOP_LEVEL: 3, "deep": 3}

