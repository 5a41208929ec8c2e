"""A run, a tensor, a picture and a diff in a notebook: the rows the terminal shows, exported by Rich as HTML
(`_repr_html_`: its lines kept whole, a narrow page scrolls them; captions wrap at WIDTH), and as text.

One call, one display: each object here displays itself when it is a cell's value (or is passed to
`display`), and nothing is displayed while it is drawn. Rich's consoles display what they print
when they find themselves in Jupyter, so every console here is told it is not in one."""

from __future__ import annotations

import io
import shutil
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
from rich.console import Console, Group, RenderableType
from rich.text import Text

from stepper.config import Config
from stepper.errors import StepperError
from stepper.seams.trace import Event
from stepper.views import attention_map, diff_table, histogram_picture, kda_state, pictures, routing_map
from stepper.views.compressed_attention_picture import compressed_attention_map
from stepper.views.hyper_connections import hyper_connection_map
from stepper.views.sinks import TensorRows
from stepper.views.v4_pictures import choice_of, routing_picture

WIDTH = 160
SCOPES = 24  # a run's summary lists its first steps and layers; run.names lists every name
PRE = '<pre style="font-family:monospace;white-space:pre;overflow-x:auto">{code}</pre>'  # not JupyterLab's pre-wrap
HINT = 'run["NAME"] a tensor · run.show(NAME) its row · run.picture({}, NAME) · run.names every name'


def console(**options: Any) -> Console:
    """A console writing into a string, never displaying in a notebook itself, and plain text
    unless told otherwise (a Jupyter kernel sets FORCE_COLOR, which Rich would follow)."""
    options = {"force_terminal": False, **options}
    return Console(file=io.StringIO(), force_jupyter=False, highlight=False, markup=False, **options)


def html(renderables: list[RenderableType]) -> str:
    out = console(record=True, width=WIDTH, force_terminal=True, color_system="truecolor")
    for r in renderables:
        out.print(r)
    return out.export_html(inline_styles=True, code_format=PRE)


def text(renderables: list[RenderableType]) -> str:
    """As text: fitted to the terminal in a Python prompt, as `stepper run` fits it; else WIDTH wide."""
    prompt = getattr(sys.stdout, "isatty", bool)()  # (no stdout at all under pythonw: None has no isatty)
    out = console(width=shutil.get_terminal_size((WIDTH, 0)).columns if prompt else WIDTH, no_color=True)
    for r in renderables:
        out.print(r)
    return out.file.getvalue()


def run_summary(events: list[Event], cfg: Config, title: str, pictures: tuple[str, ...],
                notes: Sequence[str] = ()) -> list[RenderableType]:
    """The title and the run's notes, then a line per step and layer: its heading, how many tensors
    it kept and their names (as far as the line goes), then how to see one. Not the tensors
    themselves: a run of every tensor would be pages long."""
    rows = TensorRows(console(), cfg)
    scopes: dict[tuple[str | None, int | None], list[Event]] = {}
    for e in events:
        scopes.setdefault((e.phase, e.layer), []).append(e)
    headings = {scope: rows.heading(kept[0]) for scope, kept in scopes.items()}
    column = max(map(len, headings.values()), default=0) + 2
    shown: list[RenderableType] = [Text(title, style="bold"), *(Text(note, style="yellow") for note in notes)]
    for scope, kept in list(scopes.items())[:SCOPES]:
        line = Text(headings[scope].ljust(column), style="dim")
        line.append(f"{len(kept):>4} kept  ")
        line.append(", ".join(e.key for e in kept))
        line.truncate(WIDTH, overflow="ellipsis")
        shown.append(line)
    if len(scopes) > SCOPES:
        shown.append(Text(f"... {len(scopes) - SCOPES} more steps and layers", style="dim"))
    shown.append(Text(HINT.format("|".join(f'"{kind}"' for kind in pictures)), style="dim"))
    return shown


def run_html(events: list[Event], cfg: Config, title: str, pictures: tuple[str, ...], notes: Sequence[str] = ()) -> str:
    """The run's summary, its last line naming the pictures of what it kept (`pictures`)."""
    return html(run_summary(events, cfg, title, pictures, notes))


def diff_html(diff: Any) -> str:
    return html([diff_table.render(diff)])


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
    return Shown(TensorRows(console(), cfg).render(event))


def picture(kind: str, event: Event, cfg: Config, lookup) -> Shown:
    """`stepper run --show`'s pictures of one tensor: attention (a layer's attention weights as
    heat maps), routing (its router's token x expert map from its topk_idx and topk_weight, either
    named, `lookup` finding the other; DeepSeek-V4's from its hash_idx or topk_idx and weights), hist
    (a histogram); DeepSeek-V4's hc (a comb matrix) and reach (what a layer's last query attends);
    Kimi Linear's state (a KDA layer's, with its writes and decays when kept)."""
    if kind == "attention":
        return Shown(attention_map.attention_heatmap(event.array, title=event.name))
    if kind == "routing" and event.key.startswith("ffn.gate."):  # DeepSeek-V4's, by a hash or by score
        scope = event.name.removesuffix(event.key)
        chosen = scope + choice_of(cfg, event.layer)
        return Shown(routing_picture(chosen, lookup(chosen), lookup(scope + "ffn.gate.weights"), cfg.router_experts))
    if kind == "routing":
        gate = event.name.rpartition(".")[0]
        return Shown(routing_map.routing_map(lookup(f"{gate}.topk_idx"), lookup(f"{gate}.topk_weight"),
                                          cfg.router_experts, zero_experts=cfg.zero_experts))
    if kind == "hc":
        return Shown(hc_picture(event, lookup))
    if kind == "reach":
        return Shown(reach_picture(event, cfg, lookup))
    if kind == "state":
        scope = event.name.removesuffix(event.key)
        return Shown(Group(*kda_state.state_pictures(event.array, event.name, kept(lookup, f"{scope}self_attn.delta"),
                                                     kept(lookup, f"{scope}self_attn.forget_gate"))))
    return Shown(histogram_picture.histogram(event.array, title=event.name))


def kept(lookup, name: str) -> np.ndarray | None:
    """The tensor `name` if the run kept it, else None."""
    try:
        return np.asarray(lookup(name))
    except KeyError:
        return None


def hc_picture(event: Event, lookup) -> pictures.Picture:
    """DeepSeek-V4's comb matrix at the last position, with the site's pre, post and input streams when kept."""
    scope, site = event.name.removesuffix(event.key), event.key.removesuffix(".comb")
    streams = kept(lookup, scope + ("streams" if site == "hc_attn" else "attn_streams"))
    return hyper_connection_map(np.asarray(event.array), kept(lookup, f"{scope}{site}.pre"),
                                kept(lookup, f"{scope}{site}.post"), streams, title=event.name,
                                first=step_start(event, lookup))


def step_start(event: Event, lookup) -> int:
    """The position of the first token of the event's step: 0 for the prefill, the prompt's length
    plus k for decode step k (the prompt's length read from the same tensor of the prefill)."""
    if not event.phase or event.phase == "prefill":
        return 0
    prefill = kept(lookup, event.name.replace(f"{event.phase}.", "prefill.", 1))
    if prefill is None:
        raise StepperError(f"picture: {event.name}'s positions need the prefill's {event.key} of its layer; keep it")
    return prefill.shape[1] + int(event.phase.removeprefix("decode"))


def reach_picture(event: Event, cfg: Config, lookup) -> pictures.Picture:
    """What a DeepSeek-V4 layer's last query attends (attn.chosen [B, T, K]): window, entries kept and dropped."""
    chosen = np.asarray(event.array)
    position = step_start(event, lookup) + chosen.shape[1] - 1  # the step's last query
    return compressed_attention_map(position, cfg.sliding_window, cfg.compress_ratio(event.layer), chosen[0, -1],
                                    title=f"{event.name}: the query at position {position}",
                                    indexer=cfg.layer_kind(event.layer) == "csa")
