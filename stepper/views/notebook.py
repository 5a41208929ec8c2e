"""A run, a tensor and a diff in a notebook: the rows the terminal shows, exported by Rich as HTML
(`_repr_html_`), and as text in a plain console."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console, RenderableType
from rich.rule import Rule
from rich.text import Text

from stepper.config import Config
from stepper.trace import Event
from stepper.views import diff as diff_view
from stepper.views import pictures
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
    """The title, then each tensor's row under a rule naming its step and layer, as `stepper run` prints them."""
    rows = TensorRows(Console(file=io.StringIO()), cfg)
    shown: list[RenderableType] = [Text(title, style="bold")]
    scope = None
    for e in events[:SHOWN]:
        if (e.phase, e.layer) != scope:
            scope = (e.phase, e.layer)
            shown.append(Rule(rows.heading(e), style="dim", align="left"))
        shown.append(rows.render(e))
    if len(events) > SHOWN:
        shown.append(f"... {len(events) - SHOWN} more tensors (run.names lists them)")
    return shown


def run_html(events: list[Event], cfg: Config, title: str) -> str:
    return html(run_rows(events, cfg, title))


def diff_html(diff: Any) -> str:
    return html([diff_view.render(diff)])


class Shown:
    """Something the terminal draws (a row, a picture), which displays itself in a notebook."""

    def __init__(self, renderable: RenderableType):
        self.renderable = renderable

    def __rich__(self) -> RenderableType:
        return self.renderable

    def __repr__(self) -> str:
        return text([self.__rich__()]).rstrip("\n")

    def _repr_html_(self) -> str:
        return html([self.__rich__()])


def tensor_view(event: Event, cfg: Config) -> Shown:
    """One tensor's row: name, named shape, statistics, histogram sparkline, corners."""
    return Shown(TensorRows(Console(file=io.StringIO()), cfg).render(event))


def picture(kind: str, event: Event, cfg: Config, lookup) -> Shown:
    """`stepper run --show`'s pictures of one tensor: attention (a layer's attention weights as
    heat maps), routing (its router's token x expert map; `lookup` finds the topk_weight beside a
    topk_idx), hist (a histogram)."""
    if kind == "attention":
        return Shown(pictures.attention_heatmap(event.array, title=event.name))
    if kind == "routing":
        weights = lookup(event.name.replace("topk_idx", "topk_weight"))
        return Shown(pictures.routing_map(event.array, weights, cfg.n_routed_experts))
    return Shown(pictures.histogram(event.array, title=event.name))
