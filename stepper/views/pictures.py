"""Pictures of tensors: Rich renderables for people who would rather look than read. This module
holds what every picture is drawn with (the renderable laid out for its width, shades, colours,
bars, pooling, ticks, legends); each picture is a module of its own: attention_map (one heat map
per head, the Lightning Indexer's choices), routing_map (the router's token x expert grid and
the per-expert load), histogram_picture, scale_grids (an FP8 weight's block scales), and the
families' own (v4_pictures, kda_state, group_map, hyper_connections, compressed_attention_picture).
None does model math; each only draws arrays it is given.

Every picture reads without colour: values are drawn with shade characters (░▒▓█, eighth blocks
for bars) and a legend says what each one means; colour, when the console has it, adds a finer
gradation on top. A picture is laid out when it is printed, for the width it is given: at most
MAX_COLS cells across and MAX_ROWS down, a bigger tensor is max-pooled in blocks and a long token
list is cut, and the caption says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import lru_cache

import numpy as np
from rich.cells import cell_len
from rich.color import Color
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.style import Style
from rich.text import Text

from stepper.untrusted import shown

MAX_COLS = 60  # cells across one picture (or one head's map)
MAX_ROWS = 24  # cell rows down one picture
MIN_COLS = 24  # a head's map is not squeezed below this to fit the heads side by side
MIN_ROWS = 12  # nor made shorter than this when the heads are stacked
TOKEN_ROWS = 20  # tokens shown in a routing map before the rest are hidden
GAP = "   "  # between heads side by side
OFF_SCREEN_WIDTH = 1000  # the width a picture that keeps its lines whole is drawn for, off a terminal

SHADES = "░▒▓█"  # a fraction of the scale in (0, 1/4], (1/4, 1/2], (1/2, 3/4], (3/4, 1]
SHADE_BOUNDS = ("¼", "½", "¾", "1")
EMPTY = "·"  # an exactly-zero (masked) attention weight, an expert not chosen
KEPT, DROPPED = "█", "×"  # a position the indexer kept for a query, one in its past it dropped
BAD = "!"  # NaN (or, for scales, a value with no logarithm)
BARS_UP = " ▁▂▃▄▅▆▇█"  # eighths of a cell's height
BARS_RIGHT = " ▏▎▍▌▋▊▉█"  # eighths of a cell's width
TICK_STEPS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)

# The colour ramp under the shades (viridis-like, its darkest end lifted to show on black).
RAMP = ((72, 40, 120), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))
DIM = Style(dim=True)
ALARM = Style(color="red", bold=True)


# ---------------------------------------------------------------------------------------------
# The renderable, and the pieces every picture is drawn with


class Picture:
    """A renderable that draws itself when printed, so it can fit the width the console offers.

    draw(width) returns the lines of the picture: grid lines never wrap, captions may.
    """

    def __init__(self, draw: Callable[[int], list[Text]], whole_off_screen: bool = False):
        self.draw = draw
        self.whole_off_screen = whole_off_screen  # to a pipe or a file: its lines are not cut at a width

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if not self.whole_off_screen or getattr(console.file, "isatty", lambda: False)():
            yield from self.draw(options.max_width)
            return
        for drawn in self.draw(OFF_SCREEN_WIDTH):
            if drawn.no_wrap:
                drawn.overflow = "ignore"
            yield drawn

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        widest = max((line.cell_len for line in self.draw(options.max_width)), default=0)
        widest = min(widest, options.max_width)
        return Measurement(widest, widest)


def line(*parts: str | tuple[str, Style | str], wrap: bool = False) -> Text:
    """One line of a picture: a grid line never wraps (anything past the width is cropped), a
    legend may (wrap=True)."""
    text = Text() if wrap else Text(no_wrap=True, overflow="crop")
    for part in parts:
        if isinstance(part, str):
            text.append(part)
        else:
            text.append(*part)
    return text


def legend(items: list[Text], width: int) -> list[Text]:
    """A legend's items on one line where they fit in `width`, else one item a line: never an item
    split between two lines with the next one run on after it."""
    joined = Text("  ").join(items)
    return [joined] if joined.cell_len <= width else items


def caption(text: str) -> Text:
    return Text(text, style="dim")


def heading(title: str) -> list[Text]:
    """A picture's title (a tensor's or a weight's name, which may come from a file), escaped."""
    return [Text(shown(title), style="bold")] if title else []


def sci(x: float) -> str:
    """A number in 3 significant digits, in exponent form when it is small or large."""
    return f"{x:.2e}" if x != 0 and not 1e-2 <= abs(x) < 1e4 else f"{x:.3g}"


@lru_cache(maxsize=64)
def ramp_style(step: int) -> Style:
    """The colour of step / 32 along RAMP."""
    f = step / 32 * (len(RAMP) - 1)
    i = min(int(f), len(RAMP) - 2)
    t = f - i
    rgb = (round(a + (b - a) * t) for a, b in zip(RAMP[i], RAMP[i + 1]))
    return Style(color=Color.from_rgb(*rgb))


def heat(f: float) -> Style:
    """The colour of a fraction f in [0, 1] of the scale."""
    return ramp_style(round(min(max(f, 0.0), 1.0) * 32))


def shade(f: float) -> str:
    """The shade of a fraction f of the scale: ░ up to 1/4, ▒ up to 1/2, ▓ up to 3/4, █ above."""
    return SHADES[min(max(math.ceil(f * 4) - 1, 0), 3)]


def shade_cell(f: float, width: int) -> tuple[str, Style]:
    """A cell shaded by the fraction f of the scale; BAD in ALARM where f is NaN or infinite."""
    if not math.isfinite(f):
        return BAD * width, ALARM
    return shade(f) * width, heat(f)


def finite_top(values: np.ndarray) -> float:
    """The largest finite value, the scale of a picture's shades and bars; 1.0 when there is none
    above 0 (NaN and infinities are drawn BAD, apart from the scale)."""
    finite = np.asarray(values, dtype=np.float64)[np.isfinite(values)]
    return float(finite.max(initial=0.0)) or 1.0


def bad_legend(values: np.ndarray) -> list[Text]:
    """The line that says what BAD stands for, where any value is NaN or infinite."""
    return [] if np.isfinite(values).all() else [line((BAD, ALARM), " NaN or infinite")]


def legend_shades(bounds: Sequence[str] = SHADE_BOUNDS, prefix: str = "≤") -> list[tuple[str, Style | str]]:
    """The four shades with the upper bound each one stands for, coloured as in the picture."""
    parts: list[tuple[str, Style | str]] = []
    for i, bound in enumerate(bounds):
        parts.append((SHADES[i], heat((i + 1) / 4)))
        parts.append((f" {prefix}{bound}" + ("  " if i < len(bounds) - 1 else ""), ""))
    return parts


def bar_up(value: float, top: float) -> str:
    """A cell whose height is value / top in eighths; a non-zero value is at least one eighth, a
    NaN or infinite one BAD."""
    if not math.isfinite(value):
        return BAD
    if value <= 0 or top <= 0:
        return " "
    return BARS_UP[min(8, max(1, round(value / top * 8)))]


def bar_right(value: float, top: float, width: int) -> str:
    """A horizontal bar of value / top times width cells, in eighths; non-zero shows at least ▏, a
    NaN or infinite value BAD."""
    if not math.isfinite(value):
        return BAD
    if value <= 0 or top <= 0:
        return ""
    eighths = max(1, round(value / top * width * 8))
    full, rest = divmod(eighths, 8)
    return "█" * full + (BARS_RIGHT[rest] if rest else "")


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def pool_max(a: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, int, int]:
    """The max over blocks of a 2-D array so that at most rows x cols cells remain.

    Returns the pooled array and the block size (rows, cols); (1, 1) means nothing was pooled.
    A NaN anywhere in a block makes the block NaN.
    """
    rb, cb = ceil_div(a.shape[0], max(rows, 1)), ceil_div(a.shape[1], max(cols, 1))
    return pool_blocks(a, rb, cb), rb, cb


def pool_blocks(a: np.ndarray, rb: int, cb: int) -> np.ndarray:
    """The max over blocks of rb rows x cb cols of a 2-D array (the last ones may be smaller)."""
    if rb == 1 and cb == 1:
        return a
    nr, nc = ceil_div(a.shape[0], rb), ceil_div(a.shape[1], cb)
    padded = np.full((nr * rb, nc * cb), -np.inf)
    padded[: a.shape[0], : a.shape[1]] = a
    return padded.reshape(nr, rb, nc, cb).max(axis=(1, 3))


def pooled_note(what: str, block: tuple[int, int], before: tuple[int, int], after: tuple[int, int],
                names: tuple[str, str]) -> str:
    """'max-pooled: each cell is the largest <what> in a block of 25 rows x 10 cols (600x600 -> 24x60 cells)'."""
    return (f"max-pooled: each cell is the largest {what} in a block of {block[0]} {names[0]} × "
            f"{block[1]} {names[1]} ({before[0]}×{before[1]} → {after[0]}×{after[1]} cells)")


def tick_step(label_width: int, cell_width: int) -> int:
    return next((s for s in TICK_STEPS if s * cell_width >= label_width + 1), TICK_STEPS[-1])


def ticks(n_cells: int, cell_width: int, start: Callable[[int], int]) -> str:
    """An axis line: the index start(c) written above every few cells c, left-aligned to the cell."""
    chars = [" "] * (n_cells * cell_width)
    step = tick_step(len(str(start(n_cells - 1))), cell_width)
    for c in range(0, n_cells, step):
        label, at = str(start(c)), c * cell_width
        if at + len(label) <= len(chars):
            chars[at:at + len(label)] = label
    return "".join(chars)


def labelled_rows(n_rows: int) -> set[int]:
    """The rows that get an index label: all of a short grid, every few of a tall one."""
    if n_rows <= 12:
        return set(range(n_rows))
    step = next(s for s in TICK_STEPS if n_rows / s <= 8)
    return set(range(0, n_rows, step))


def side_by_side(blocks: list[list[Text]], gap: str = GAP) -> list[Text]:
    """Blocks of lines placed next to each other, each padded to its own widest line."""
    widths = [max(t.cell_len for t in block) for block in blocks]
    height = max(len(block) for block in blocks)
    out = []
    for r in range(height):
        text = Text(no_wrap=True, overflow="crop")
        for i, (block, w) in enumerate(zip(blocks, widths)):
            cell = block[r] if r < len(block) else Text()
            text.append_text(cell)
            if i < len(blocks) - 1:
                text.append(" " * (w - cell.cell_len) + gap)
        text.rstrip()
        out.append(text)
    return out


def pad_left(text: str, width: int) -> str:
    """text right-aligned in `width` terminal cells (a Han character takes two)."""
    return " " * max(0, width - cell_len(text)) + text


def short(label: str, width: int = 10) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"
