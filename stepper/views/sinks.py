"""The sinks that show a run: a Rich row per tensor (colour or plain), JSON Lines, pictures after
the tensors they belong to (`--show`), and progress bars for long loops.

A row reads, on three lines: the name with its named shape and dtype; its statistics with a
histogram sparkline; its corner values (the first values of the first row, the last of the last).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import IO, Any

import numpy as np
from rich.cells import cell_len
from rich.console import Console, ConsoleRenderable, RenderableType, RenderHook
from rich.text import Text

from stepper import catalog
from stepper.config import Config
from stepper.seams.trace import Event
from stepper.tensors.statistics import CORNER, integral
from stepper.tensors.tensor import held
from stepper.text import Tokens
from stepper.views import attention_map, histogram_picture, routing_map, summary
from stepper.views.group_map import group_map
from stepper.views.scale_grids import ScaleGrids
from stepper.views.summary import BINS, exact, finite_or_none, number, value
from stepper.views.tree import layer_kind


class TensorRows:
    """Sink printing one row per tensor to a Rich console (colour unless the console is plain)."""

    def __init__(self, console: Console, cfg: Config, tokens: Tokens | None = None):
        self.console = console
        self.cfg = cfg
        self.tokens = tokens  # with a text prompt, a decode step's heading names the token it feeds
        self.catalog = catalog.load()
        self.scope: tuple[str | None, int | None] | None = None

    def __call__(self, event: Event) -> None:
        scope = (event.phase, event.layer)
        if scope != self.scope:
            self.scope = scope
            self.console.rule(self.heading(event), style="dim", align="left")
        self.console.print(self.render(event), soft_wrap=True)

    def heading(self, event: Event) -> str:
        parts = [] if event.phase is None else [event.phase]
        if self.tokens is not None and event.phase is not None and event.phase.startswith("decode"):
            parts.append("token " + self.tokens.numbered(self.tokens.of_step(event.phase, 1))[0])
        if event.layer is None:
            parts.append("model")
        else:
            kind = layer_kind(self.cfg, event.layer)
            parts.append(f"layer {event.layer} ({kind})")
        return " · ".join(parts)

    def render(self, event: Event) -> Text:
        """The tensor's three lines (two for a tensor of no values); on a terminal each is wrapped
        between its fields to fit."""
        width = line_width(self.console)
        text = self.name_line(event, width)
        text.append("\n")
        if event.array.size == 0:  # a dim of size 0: V4's entries before the first window closes
            text.append(Text("    no values: a dimension of size 0", style="dim"))
            return text
        text.append(stats_line(event.array, width))
        text.append("\n")
        text.append(corners_line(event.array, width))
        return text

    def name_line(self, event: Event, width: int | None) -> Text:
        """The name, the named shape (broken only between its dims) and the dtype."""
        phase, _, rest = event.name.rpartition(event.key)
        name = Text.assemble((phase, "dim"), (event.key, "bold cyan"), rest)
        dims = self.catalog.dims(event.key, event.array.shape, self.cfg, event.layer)
        parts = named_dims(dims)
        shape = [Text(("[" if i == 0 else "") + part + ("]" if i == len(parts) - 1 else ","), style="yellow")
                 for i, part in enumerate(parts)] or [Text("[]", style="yellow")]
        fields = [name, *shape, Text(str(event.array.dtype), style="dim")]
        if event.patched:
            fields.append(Text("patched", style="bold magenta"))
        return wrap_fields(fields, width, "", "    ", seps=["  ", *[" "] * (len(shape) - 1), "  ", "  "])


def named_dims(dims: list[catalog.Dim]) -> list[str]:
    """Each dim as the rows name it: 'T=7 positions', 'T=1 position'."""
    return [str(replace(d, label=catalog.counted(d.label, d.size))) for d in dims]


def stats_line(array: np.ndarray, width: int | None) -> Text:
    """The statistics and the sparkline (an integer tensor's: min, max, absmax and sum as integers)."""
    st, bins = summary.look(array)
    counts = bins.view(BINS)[0].tolist()
    integers = integral(array.dtype)
    fields = [Text.assemble((f"{label} ", "dim"), text) for label, text in (
        ("min", value(st.min, integers)), ("max", value(st.max, integers)), ("mean", number(st.mean)),
        ("std", number(st.std)), ("absmax", value(st.absmax, integers)), ("sum", value(st.sum, integers)),
    )] if st.finite else [Text("no finite values", style="bold red")]  # not nan figures beside "nan 0"
    fields += [Text.assemble((f"{label} ", "dim"), (f"{value:,}", "bold red" if value else ""))
               for label, value in (("nan", st.nan), ("inf", st.inf))]
    fields.append(Text(summary.sparkline(counts), style="green"))
    return wrap_fields(fields, width, "    ", "    ")


def corners_line(array: np.ndarray, width: int | None) -> Text:
    """The first values of the first row and the last of the last, or every value of a tensor of
    no more than that many (a token's four chosen experts); an integer tensor's as integers."""
    integers = integral(array.dtype)
    if held(array) and 0 < array.size <= 2 * CORNER:
        values = [value(v, integers) for v in np.asarray(array).reshape(-1).tolist()]
    else:
        first, last = summary.corners(array)
        values = [value(v, integers) for v in first] + ["…"] + [value(v, integers) for v in last]
    fields = [Text.assemble(("corners ", "dim"), values[0]), *map(Text, values[1:])]
    return wrap_fields(fields, width, "    ", "    ", sep=" ")


def line_width(console: Console) -> int | None:
    """The width text is wrapped to: a terminal's; None (lines kept whole) for a pipe or a file,
    coloured or not (FORCE_COLOR makes Rich treat a pipe as a terminal, but it has no width)."""
    isatty = getattr(console.file, "isatty", None)
    return console.width if isatty is not None and isatty() else None


def wrap_fields(fields: list[Text], width: int | None, first: str, indent: str, sep: str = "  ",
                seps: list[str] | None = None) -> Text:
    """Fields joined by `sep` (or seps[i] before field i + 1), starting a new line (after `indent`)
    where the next field would pass `width`: a line breaks between fields, never inside one."""
    out = Text(first)
    column = len(first)
    for i, field in enumerate(fields):
        gap = (seps[i - 1] if seps else sep) if i else ""
        if i and width is not None and column + len(gap) + field.cell_len > width:
            out.append("\n" + indent)
            column, gap = len(indent), ""
        out.append(gap)
        out.append_text(field)
        column += len(gap) + field.cell_len
    return out


def styles(plain: bool) -> dict[str, Any]:
    """A console's options for `--plain`, or NO_COLOR set: no escape codes at all (Rich's no_color
    alone drops the colours but still writes bold, dim and italic)."""
    return {"no_color": True, "color_system": None} if plain or os.environ.get("NO_COLOR") else {}


class WholeLinesOffTerminal(Console):
    """A console whose prints wrap (at words) only on a terminal, unless they ask not to: to a pipe
    or a file each keeps its lines whole, whatever it asks (so piped prose is never cut at 80
    columns, nor padded)."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.soft_wrap = line_width(self) is None

    def print(self, *objects: Any, **kwargs: Any) -> None:
        if line_width(self) is None:
            kwargs["soft_wrap"] = True
        super().print(*objects, **kwargs)


def print_picture(console: Console, picture: RenderableType) -> None:
    """A picture: its captions wrapped at a terminal's width, its lines whole elsewhere."""
    console.print(picture, soft_wrap=line_width(console) is None)


def print_fitted(console: Console, text: Text | str, indent: int = 4, style: str = "") -> None:
    """Lines of text: on a terminal each line longer than its width is broken at spaces and
    continued `indent` spaces further in than the line begins (a word longer than a line is kept
    whole); elsewhere whole."""
    body = text if isinstance(text, Text) else Text(text, style=style)
    width = line_width(console)
    for line in body.split("\n", allow_blank=True):
        for part in [line] if width is None else fitted(line, width, indent):
            console.print(part, soft_wrap=True)


def titled_rule(console: Console, title: str, style: str = "dim") -> None:
    """A title in a rule (`style` the rule's); where the rule would cut the title short (a narrow
    terminal, or 80 columns through a pipe), the title alone, whole, on lines of its own."""
    if Text(title).cell_len + 4 > console.width:
        print_fitted(console, Text(title, style="bold"))
    else:
        console.rule(Text(title), style=style, align="left")


def fitted(line: Text, width: int, indent: int) -> list[Text]:
    """A line broken at spaces into lines of at most `width` cells, all but the first `indent`
    spaces further in than the line's own leading spaces."""
    line = line.copy()
    line.rstrip()
    plain, cuts, start, room = line.plain, [], 0, width
    indent += len(plain) - len(plain.lstrip(" "))
    while cell_len(plain[start:]) > room:
        cut = plain.rfind(" ", start, start + room + 1)
        if cut <= start:  # a word longer than the room: it goes whole, up to the next space
            cut = plain.find(" ", start + room)
            if cut < 0:
                break
        start = len(plain) - len(plain[cut:].lstrip(" "))
        cuts += [cut, start]
        room = max(20, width - indent)
    parts = list(line.divide(cuts))[::2]  # the lines, without the spaces between them
    return [parts[0], *(Text(" " * indent).append_text(part) for part in parts[1:])]


def print_whole(console: Console, renderable: RenderableType) -> None:
    """On a terminal as Rich draws it; to a pipe or a file (no width) one line per row, never folded
    or cut, without trailing padding, so it diffs and greps cleanly (a tree, a table)."""
    if line_width(console) is not None:
        console.print(renderable, soft_wrap=False)  # a tree's labels wrap at words
        return
    width, console.width = console.width, WHOLE_WIDTH
    try:
        with console.capture() as captured:
            console.print(renderable)
    finally:
        console.width = width
    console.out("\n".join(line.rstrip() for line in captured.get().splitlines()), highlight=False)


WHOLE_WIDTH = 1000  # the width a pipe's trees and tables are drawn at: wider than any of their lines


def print_wrapped(console: Console, text: Text | str, indent: int = 0, style: str = "") -> None:
    """Prose: wrapped at word boundaries on a terminal (continued under its indent), one line elsewhere."""
    body = text if isinstance(text, Text) else Text(text, style=style)
    width = line_width(console)
    for line in [body] if width is None else body.wrap(console, max(20, width - indent)):
        console.print(Text(" " * indent) + line, soft_wrap=True)


EXACT_FIGURES = {"min", "max", "absmax", "sum"}  # an integer tensor's are integers (its mean and std are not)


class JsonLines:
    """Sink writing one JSON object per tensor, one per line (non-finite numbers become null)."""

    def __init__(self, stream: IO[str], cfg: Config, before_write: Callable[[], None] = lambda: None):
        self.stream = stream
        self.cfg = cfg
        self.catalog = catalog.load()
        self.before_write = before_write  # e.g. the progress bars leave a terminal first

    def __call__(self, event: Event) -> None:
        self.before_write()
        self.stream.write(json.dumps(self.record(event), allow_nan=False) + "\n")
        self.stream.flush()

    def record(self, event: Event) -> dict[str, Any]:
        array = event.array
        dims = self.catalog.dims(event.key, array.shape, self.cfg, event.layer)
        st, bins = summary.look(array)
        counts, edges = bins.view(BINS)
        first, last = summary.corners(array)
        integers = integral(array.dtype)  # its values, edges and integer figures as JSON integers
        figures = {k: exact(v, integers) if k in EXACT_FIGURES else finite_or_none(v) for k, v in st.as_dict().items()}
        return {
            "name": event.name,
            "key": event.key,
            "layer": event.layer,
            "phase": event.phase,
            "shape": list(array.shape),
            "dims": [{"symbol": d.symbol, "label": d.label, "size": d.size} for d in dims],
            "named_shape": "[" + ", ".join(named_dims(dims)) + "]",
            "dtype": str(array.dtype),
            "stats": figures,
            "histogram": {"counts": counts.tolist(), "lo": exact(edges[0].item(), integers),
                          "hi": exact(edges[-1].item(), integers)},  # the bins' outer edges
            "corners": {"first": [exact(v, integers) for v in first], "last": [exact(v, integers) for v in last]},
            **({"patched": True} if event.patched else {}),  # a --patch replaced it (unpatched rows as before)
        }


PICTURES = ("attention", "routing", "hist", "scales")


class Pictures:
    """Sink drawing pictures after the tensors they belong to (`stepper run --show`).

    attention: each layer's attention weights as per-head heat maps; routing: the router's token x
    expert map and per-expert load, drawn when topk_idx or topk_weight is shown; hist: a histogram
    of every shown tensor; scales: the FP8 block scales of each shown layer's weights, where the
    layer uses them (`scale_grids`). The sink sees every tensor; `is_shown` says which ones the run shows.
    """

    def __init__(self, console: Console, cfg: Config, kinds: set[str], weights=None, tokens: Tokens | None = None,
                 is_shown: Callable[[Event], bool] = lambda event: True):
        self.console = console
        self.cfg = cfg
        self.kinds = kinds
        self.weights = weights
        self.tokens = tokens  # the texts of a text prompt's tokens, for the pictures' labels
        self.is_shown = is_shown
        self.topk_idx: tuple[np.ndarray, bool] | None = None  # the last one, and whether it was shown
        self.scales = ScaleGrids(cfg, weights, lambda picture: print_picture(console, picture)) \
            if "scales" in kinds and hasattr(weights, "stored") else None
        self.index_mask: np.ndarray | None = None  # DeepSeek-V3.2's: drawn beside the attention weights
        self.group_mask: np.ndarray | None = None  # a grouped router's kept groups: drawn under the routing map

    def __call__(self, event: Event) -> None:
        shown, key = self.is_shown(event), catalog.key_of(event.key)  # key: LongCat's sub0./sub1. left out
        if key == "mlp.gate.topk_idx":
            self.topk_idx = (event.array, shown)
        if key == "self_attn.indexer.mask":  # shown or not, it belongs beside the attention weights
            self.index_mask = event.array
        if key == "mlp.gate.group_mask":
            self.group_mask = event.array
        if self.scales is not None:
            self.scales.seen(event)
        if "routing" in self.kinds and key == "mlp.gate.topk_weight" and self.topk_idx is not None:
            self.draw_routing(event, shown)
        if not shown:
            return
        if "hist" in self.kinds:
            print_picture(self.console, histogram_picture.histogram(event.array, title=event.name))
        if "attention" in self.kinds and key == "self_attn.attn_weights":
            print_picture(self.console, attention_map.attention_heatmap(event.array, title=event.name,
                                                                   token_labels=key_labels(self.tokens, event.array)))
            if self.index_mask is not None and self.index_mask.shape[1:] == event.array.shape[2:]:
                print_picture(self.console,
                              attention_map.indexer_map(self.index_mask, event.array, title=event.name + " · indexer"))
        if self.scales is not None:
            self.scales.draw_for(event)


    def draw_routing(self, weights: Event, shown: bool) -> None:
        """The routing map of the router's choice (topk_idx, then these topk_weight), and under it,
        for a grouped router, the groups each token kept (views.group_map)."""
        idx, idx_shown = self.topk_idx
        if not (shown or idx_shown):
            return
        rows = token_rows(self.tokens, weights.phase, len(idx))
        print_picture(self.console, routing_map.routing_map(idx, weights.array, self.cfg.router_experts, rows,
                                                           self.cfg.zero_experts))
        if self.group_mask is not None and self.cfg.n_group > 1 and len(self.group_mask) == len(idx):
            print_picture(self.console, group_map(self.group_mask, idx, self.cfg))


def key_labels(tokens: Tokens | None, weights: np.ndarray) -> list[str] | None:
    """The texts of attention weights' S key tokens, with a text prompt."""
    return None if tokens is None else tokens.labels(range(weights.shape[-1]))


def token_rows(tokens: Tokens | None, phase: str | None, n: int) -> list[str] | None:
    """The routing map's row labels, with a text prompt: each token's position and text."""
    return None if tokens is None else tokens.numbered(tokens.of_step(phase, n))


@dataclass
class Loop:
    """A long loop reported by progress(): when it began, how far it is, whether it has a bar."""

    started: float
    done: int = 0
    total: int = 0
    shown: bool = False


class ProgressBars:
    """Sink showing long loops (experts, layers) as transient progress bars on a terminal.

    A bar appears only once its task has run for a second (STEPPER_PROGRESS_DELAY seconds, if
    set), and never when stderr is not a terminal, so piped output stays clean. Consoles given to
    `beside` (the run's rows) take the bars off the screen before they print, so that no line is
    printed onto a bar's; the next progress puts the bars back below what was printed (a fresh
    Rich Progress each time: one that was stopped would erase lines above it when started again).
    """

    DELAY = 1.0

    def __init__(self, console: Console):
        self.console = console
        self.loops: dict[str, Loop] = {}
        self.bars: Any = None  # the rich.progress.Progress on screen, or None
        self.ids: dict[str, Any] = {}  # its task id for each loop it shows
        self.delay = delay_from_env(self.DELAY)

    def __call__(self, event: Event) -> None:
        """Tensor events are for other sinks."""

    def wants(self, _event: Event) -> bool:
        return False

    def beside(self, console: Console) -> None:
        """Make the console take the bars off the screen before each thing it prints."""
        console.push_render_hook(HideFirst(self.hide))

    def progress(self, task: str, done: int, total: int) -> None:
        if not self.console.is_terminal:
            return
        now = time.monotonic()
        loop = self.loops.setdefault(task, Loop(now))
        loop.done, loop.total = done, total
        if done >= total:
            del self.loops[task]
            if task in self.ids:
                self.bars.remove_task(self.ids.pop(task))
            if not self.ids:
                self.hide()
            return
        loop.shown = loop.shown or now - loop.started >= self.delay
        if any(loop.shown for loop in self.loops.values()):
            self.show()

    def show(self) -> None:
        """The bars of the loops that have them, on screen and up to date."""
        if self.bars is None:
            from rich.progress import Progress

            self.bars = Progress(console=self.console, transient=True, redirect_stdout=False)
        for task, loop in self.loops.items():
            if loop.shown and task not in self.ids:
                self.ids[task] = self.bars.add_task(task, total=loop.total, completed=loop.done)
            if task in self.ids:
                self.bars.update(self.ids[task], completed=loop.done, total=loop.total)
        if not self.bars.live.is_started:
            self.bars.start()

    def hide(self) -> None:
        """Take the bars off the screen (before a prompt, a question or a row); the next progress puts them back."""
        if self.bars is not None:
            self.bars.stop()
            self.bars, self.ids = None, {}


class HideFirst(RenderHook):
    """A console's render hook running `hide` before the console prints anything."""

    def __init__(self, hide: Callable[[], None]):
        self.hide = hide

    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        self.hide()
        return renderables


def delay_from_env(default: float) -> float:
    """STEPPER_PROGRESS_DELAY: seconds a loop runs before its bar appears (0: at once), else `default`."""
    try:
        return max(0.0, float(os.environ.get("STEPPER_PROGRESS_DELAY", default)))
    except ValueError:
        return default
