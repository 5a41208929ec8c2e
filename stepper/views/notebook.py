"""A run, a tensor and a diff in a notebook: the rows the terminal shows, exported by Rich as HTML
(`_repr_html_`), and as text in a plain console."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console, RenderableType

from stepper.config import Config
from stepper.trace import Event
from stepper.views import diff as diff_view
from stepper.views.sinks import TensorRows

WIDTH = 160
SHOWN = 200  # a run shows its first tensors; index it for the others


def html(renderables: list[RenderableType]) -> str:
    console = Console(record=True, width=WIDTH, file=io.StringIO(), force_terminal=True, color_system="truecolor",
                      highlight=False, markup=False, soft_wrap=True)
    for r in renderables:
        console.print(r)
    return console.export_html(inline_styles=True, code_format="<pre style=\"font-family:monospace\">{code}</pre>")


def text(renderables: list[RenderableType]) -> str:
    console = Console(width=WIDTH, file=io.StringIO(), no_color=True, highlight=False, markup=False, soft_wrap=True)
    for r in renderables:
        console.print(r)
    return console.file.getvalue()


def run_rows(events: list[Event], cfg: Config, title: str) -> list[RenderableType]:
    rows = TensorRows(Console(file=io.StringIO()), cfg)
    shown = [title] + [rows.render(e) for e in events[:SHOWN]]
    if len(events) > SHOWN:
        shown.append(f"... {len(events) - SHOWN} more tensors (run.names lists them)")
    return shown


def run_html(events: list[Event], cfg: Config, title: str) -> str:
    return html(run_rows(events, cfg, title))


def diff_html(diff: Any) -> str:
    return html([diff_view.render(diff)])


class TensorView:
    """One tensor's row (name, named shape, statistics, histogram sparkline, corners)."""

    def __init__(self, event: Event, cfg: Config):
        self.event, self.cfg = event, cfg

    def __rich__(self) -> RenderableType:
        return TensorRows(Console(file=io.StringIO()), self.cfg).render(self.event)

    def __repr__(self) -> str:
        return text([self.__rich__()]).rstrip("\n")

    def _repr_html_(self) -> str:
        return html([self.__rich__()])
