"""What `stepper diff` shows (and a diff in a notebook): a row per tensor in execution order, a bar
of its relative difference on a log scale, how the difference grows through each layer, and the
first tensor where the two runs part.

A diff is read by its fields (`rows`, `first`, `only_a`, `only_b`, `a`, `b`; each row's `name`,
`status`, `max_abs`, `rel`, `cosine`, `detail`, `nonfinite`, `phase`, `layer`), as `stepper.fixtures.run_diff` makes it.
"""

from __future__ import annotations

import math
from itertools import groupby
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from stepper.untrusted import cut, shown
from stepper.views.fitted_table import figure, fitted
from stepper.views.summary import SPARK

FLOOR = 1e-9  # a relative difference at or below this draws as nothing
STYLE = {"same": "dim green", "close": "green", "differs": "bold red"}
BAR = 12


def level(row: Any) -> float:
    """The row's relative difference on a log scale from FLOOR (0) to 1 (1); a changed choice of experts is 1."""
    if row.rel is None:
        return 1.0 if row.status == "differs" else 0.0
    if not math.isfinite(row.rel):
        return 1.0
    if row.rel <= FLOOR:
        return 0.0
    return min(1.0, (math.log10(row.rel) - math.log10(FLOOR)) / -math.log10(FLOOR))


def bar(row: Any, width: int = BAR) -> Text:
    eighths = round(level(row) * width * 8)
    full, part = divmod(eighths, 8)
    text = "█" * full + (" ▏▎▍▌▋▊▉"[part] if part else "")
    return Text(text.ljust(width), style=STYLE[row.status])


COLUMNS = (("#", "right"), ("tensor", "left"), ("status", "left"), ("max|b-a|", "right"), ("relative", "right"),
           ("cosine", "right"), ("1e-9 .. 1", "left"), ("what changed", "left"))


def table(diff: Any, width: int | None = None) -> RenderableType:
    """The rows; `width`: the terminal's (narrower than the whole table, what changed goes under
    each row: `views.fitted_table`), None (a pipe, a notebook) for every column on one line."""
    rows = [{"#": str(r.index), "tensor": shown(r.name), "status": Text(r.status, style=STYLE[r.status]),
             "max|b-a|": figure(r.max_abs), "relative": figure(r.rel),
             "cosine": "" if r.cosine is None else f"{r.cosine:.8f}", "1e-9 .. 1": bar(r),
             "what changed": shown(r.detail)} for r in diff.rows]
    return fitted("", COLUMNS, rows, "tensor", ("what changed",), width)


def scope_label(phase: str | None, layer: int | None) -> str:
    parts = [] if phase is None else [phase]
    parts.append("model" if layer is None else f"layer {layer}")
    return " · ".join(parts)


def growth(diff: Any, width: int | None = None) -> Text:
    """One line per layer (and step): a character per tensor in execution order, its height the
    tensor's relative difference on the log scale (blank: the same bit for bit), red where it differs.
    On a terminal `width` wide, a note that does not fit goes on the next line, under the characters."""
    text = Text("growth: a character a tensor, log |B-A|/absmax(A) from 1e-9 to 1, blank: the same\n", style="dim")
    label = max((len(scope_label(p, la)) for p, la in {(r.phase, r.layer) for r in diff.rows}), default=0)
    for (phase, layer), rows in groupby(diff.rows, key=lambda r: (r.phase, r.layer)):
        rows = list(rows)
        text.append(scope_label(phase, layer).ljust(label) + "  ", style="dim")
        for r in rows:
            height = level(r)
            char = " " if r.status == "same" else SPARK[min(len(SPARK) - 1, int(height * len(SPARK)))]
            text.append(char, style=STYLE[r.status])
        note = scope_note(rows)
        fits = width is None or label + 2 + len(rows) + 2 + len(note) <= width
        text.append(f"  {note}\n" if fits else f"\n{' ' * (label + 2)}{note}\n", style="dim")
    return text


def scope_note(rows: list) -> str:
    """Where a layer's difference starts and how large it gets."""
    if all(r.status == "same" for r in rows):
        return "the same"
    first = next((r for r in rows if r.status == "differs"), None)
    note = f"differs from {shown(first.key)}" if first else "within round-off"
    broken = next((r for r in rows if r.nonfinite), None)
    if broken:
        return note + (" (NaN or inf)" if broken is first else f", NaN or inf from {shown(broken.key)}")
    measured = [r for r in rows if r.rel]
    worst = max(measured, key=lambda r: r.rel) if measured else None
    return note + (f", at most {figure(worst.rel)} ({shown(worst.key)})" if worst else "")


def summary(diff: Any) -> Text:
    counts = {s: sum(r.status == s for r in diff.rows) for s in STYLE}
    both, differ = len(diff.rows), counts["differs"]
    text = Text(f"{shown(diff.a)} vs {shown(diff.b)}: {both} tensor{'s' if both != 1 else ''} in both, "
                f"{counts['same']} the same bit for bit, {counts['close']} within round-off, "
                f"{differ} differ{'s' if differ == 1 else ''}\n")
    for label, names in (("only in A", diff.only_a), ("only in B", diff.only_b)):
        if names:
            listed = ", ".join(cut(n) for n in names[:6])  # (a name of 100,000 characters: its first 60)
            text.append(f"{len(names)} {label}: {listed}{' ...' if len(names) > 6 else ''}\n", style="dim")
    first = diff.first
    if first is None:
        both = " in both" if diff.only_a or diff.only_b else ""
        text.append(f"no tensor{both} differs beyond round-off (the tolerance of fixtures verify)", style="bold green")
    else:
        text.append(f"first difference: {shown(first.name)}", style="bold red")
        text.append(f" ({shown(first.detail)})" if first.detail else "")
        if getattr(diff, "file_order", False):
            text.append("\nfirst in A's file order: neither side records the order the run made its tensors in "
                        "(a --dump, a fixture, a run or an .npz does)", style="dim")
    return text


def render(diff: Any, width: int | None = None) -> Group:
    """The table (fitted to `width`, a terminal's), the growth per layer and the summary."""
    return Group(table(diff, width), Text(""), growth(diff), summary(diff))
