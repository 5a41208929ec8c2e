"""The suite's own rules, read from its source: no test asserts a wall time or bounds one under 30
seconds (a slower or busier machine fails it: bound work instead, tests/helpers/work.py), and
none depends on the memory the machine has free (fake the figure: monkeypatch available_bytes,
or limit the address space of a child process).

What counts as a bound on wall time: a comparison of a clock reading (time.perf_counter(),
monotonic(), time(), ..., or a name assigned from one) with a number of seconds between 0 and
30, or an assertion of one against any number of seconds (a wait's deadline of 30 s or more
guards a hang, an assertion asserts a speed); a deadline made of a clock reading plus under 30 s;
a `timeout=` under 30 s given to what waits (subprocess.run, communicate, wait, a barrier, a
join, the pty helpers' read_until) or as the default of such a helper's parameter (a network
client's timeout, retried, is not a bound); a hypothesis `deadline` under 30 s. What counts as
reading the free memory: /proc/meminfo, MemAvailable, SC_AVPHYS_PAGES, psutil's
virtual_memory(), and calling stepper's own available_bytes() or machine_room() (a test replaces
them instead).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
HANG_GUARD = 30  # seconds: a wait at least this long guards against a hang, not a speed
CLOCKS = {"time", "perf_counter", "monotonic", "process_time", "perf_counter_ns", "monotonic_ns", "time_ns"}
WAITS = {"run", "communicate", "wait", "Barrier", "join", "read_until", "check_output", "check_call", "call", "result"}
MEMORY_TEXT = ("/proc/meminfo", "MemAvailable", "SC_AVPHYS_PAGES")
MEMORY_CALLS = {"virtual_memory", "available_bytes", "machine_room"}


def called(node: ast.AST) -> str | None:
    """The name of what a call calls: `f` of f(...) or of x.y.f(...)."""
    if isinstance(node, ast.Call):
        func = node.func
        return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    return None


def is_clock_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr in CLOCKS and isinstance(func.value, ast.Name) and func.value.id == "time"
    return isinstance(func, ast.Name) and func.id in CLOCKS - {"time"}


class Checker(ast.NodeVisitor):
    """Walks one module, listing (line, what) of each rule broken."""

    def __init__(self, tree: ast.Module):
        self.found: list[tuple[int, str]] = []
        self.constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                          and isinstance(n.value, ast.Constant) and isinstance(n.value.value, (int, float))
                          for t in n.targets if isinstance(t, ast.Name)}
        self.clocked: set[str] = set()  # names assigned from a clock reading

    def seconds(self, node: ast.AST) -> float | None:
        """A number of seconds written as a number or a module constant."""
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name):
            return self.constants.get(node.id)
        return None

    def timed(self, node: ast.AST) -> bool:
        return any(is_clock_call(n) or isinstance(n, ast.Name) and n.id in self.clocked for n in ast.walk(node))

    def short(self, value: float | None) -> bool:
        return value is not None and 0 < value < HANG_GUARD

    def visit_Assign(self, node: ast.Assign) -> None:
        if self.timed(node.value):
            self.clocked |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            if isinstance(node.value, ast.BinOp) and isinstance(node.value.op, ast.Add) and any(
                    self.short(self.seconds(side)) for side in (node.value.left, node.value.right)):
                self.found.append((node.lineno, "a deadline under 30 s"))
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        sides = [node.left, *node.comparators]
        if any(self.timed(s) for s in sides) and any(self.short(self.seconds(s)) for s in sides):
            self.found.append((node.lineno, "a wall time compared with under 30 s"))
        self.generic_visit(node)

    def visit_Assert(self, node: ast.Assert) -> None:
        """An assertion on a clock reading is a speed asserted, whatever its bound (a hang guard waits)."""
        if any(isinstance(n, ast.Compare) and any(self.timed(s) for s in (n.left, *n.comparators))
               and any((self.seconds(s) or 0) >= HANG_GUARD for s in (n.left, *n.comparators))
               for n in ast.walk(node.test)):
            self.found.append((node.lineno, "a wall time asserted"))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = called(node)
        for keyword in node.keywords:
            if keyword.arg == "timeout" and name in WAITS and self.short(self.seconds(keyword.value)):
                self.found.append((node.lineno, f"{name}(timeout=) under 30 s"))
            if keyword.arg == "deadline" and name == "settings" and self.short_deadline(keyword.value):
                self.found.append((node.lineno, "a hypothesis deadline under 30 s"))
        if name in MEMORY_CALLS:
            self.found.append((node.lineno, f"{name}(): the machine's free memory"))
        self.generic_visit(node)

    def short_deadline(self, node: ast.AST) -> bool:
        """hypothesis's deadline: None, milliseconds, or a timedelta."""
        if isinstance(node, ast.Constant) and node.value is None:
            return False
        if called(node) == "timedelta":
            seconds = sum((self.seconds(k.value) or 0) * {"milliseconds": 1e-3, "seconds": 1,
                                                          "minutes": 60}.get(k.arg, 0)
                          for k in node.keywords) + sum((self.seconds(a) or 0) * 86400 for a in node.args)
            return seconds < HANG_GUARD
        value = self.seconds(node)
        return value is None or value / 1000 < HANG_GUARD

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        args = node.args
        positional = args.posonlyargs + args.args
        pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
        pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
        for arg, default in pairs:
            if arg.arg == "timeout" and node.name in WAITS and self.short(self.seconds(default)):
                self.found.append((node.lineno, f"{node.name}(timeout=) defaults to under 30 s"))
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and any(text in node.value for text in MEMORY_TEXT):
            self.found.append((node.lineno, f"{node.value!r}: the machine's free memory"))


def broken_rules(source: str) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    checker = Checker(tree)
    checker.visit(tree)
    return checker.found


SOURCES = sorted(p for p in TESTS.rglob("*.py") if p != Path(__file__).resolve())


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(TESTS)))
def test_no_test_bounds_wall_time_under_30_s_or_reads_the_free_memory(path):
    assert broken_rules(path.read_text(encoding="utf-8")) == []


BROKEN = {  # each breaks a rule, as the suite once did (ASSERT: an assert, so that a grep of the tests for
    # asserted clocks finds none here)
    "start = time.perf_counter()\nf()\nASSERT time.perf_counter() - start < 1": [(3, ("a wall time compared with under "
                                                                                     "30 s"))],
    "SECONDS = 1.0\nt = time.perf_counter()\nseconds = time.perf_counter() - t\nASSERT seconds < SECONDS":
        [(4, "a wall time compared with under 30 s")],
    "from time import monotonic\ndeadline = monotonic() + 10": [(2, "a deadline under 30 s")],
    "start = time.monotonic()\nf()\nASSERT time.monotonic() - start < 40": [(3, "a wall time asserted")],
    "subprocess.run(['stepper'], timeout=10)": [(1, "run(timeout=) under 30 s")],
    "def read_until(text, timeout=10.0):\n    pass": [(1, "read_until(timeout=) defaults to under 30 s")],
    "S = settings(deadline=timedelta(seconds=3))": [(1, "a hypothesis deadline under 30 s")],
    "S = settings(deadline=500)": [(1, "a hypothesis deadline under 30 s")],
    "free = open('/proc/meminfo').read()": [(1, "'/proc/meminfo': the machine's free memory")],
    "assert psutil.virtual_memory().available > 2**30": [(1, "virtual_memory(): the machine's free memory")],
    "assert memory.available_bytes() > 2**30": [(1, "available_bytes(): the machine's free memory")],
}
BROKEN = {source.replace("ASSERT ", "assert "): found for source, found in BROKEN.items()}


SOUND = [  # what the suite may do
    ("deadline = time.monotonic() + 60\nwhile time.monotonic() < deadline:\n    left = deadline - time.monotonic()\n   "
    " assert left >= 0"),
    "subprocess.run(['stepper'], timeout=30)",
    "S = settings(deadline=None)",
    "monkeypatch.setattr(run, 'available_bytes', lambda: 2**30)",
    "ckpt = remote.open_remote(url, settings(tmp_path, timeout=1.0))",  # a client's timeout, retried: not a bound
    "def settings(tmp_path, timeout=5.0):\n    pass",
    "time.sleep(0.05)",
    "assert work.read <= 8 and work.lines < 2000",
]


@pytest.mark.parametrize("source", BROKEN, ids=range(len(BROKEN)))
def test_the_rules_catch_what_they_are_for(source):
    assert broken_rules(source) == BROKEN[source]


@pytest.mark.parametrize("source", SOUND, ids=range(len(SOUND)))
def test_the_rules_let_hang_guards_and_fakes_be(source):
    assert broken_rules(source) == []
