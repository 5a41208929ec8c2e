"""Pictures of tensors: Rich renderables for people who would rather look than read.

This module owns how an emitted array becomes a picture: attention weights as one heat map per
head, the router's choices as a token x expert grid with the per-expert load, a histogram with
horizontal bars, and the FP8 block scales of a weight as a heat map. It does no model math; it
only draws arrays it is given.

Every picture reads without colour: values are drawn with shade characters (░▒▓█, eighth blocks
for bars) and a legend says what each one means; colour, when the console has it, adds a finer
gradation on top. A picture is laid out when it is printed, for the width it is given: at most
MAX_COLS cells across and MAX_ROWS down, a bigger tensor is max-pooled in blocks and a long token
list is cut, and the caption says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import lru_cache, partial

import numpy as np
from rich.cells import cell_len
from rich.color import Color
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.style import Style
from rich.text import Text

from stepper.tensors.tensor import LazyTensor, Tensor, held
from stepper.tensors.tiled import TILE_VALUES
from stepper.untrusted import shown
from stepper.views import summary
from stepper.views.summary import number

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
    return shade(f) * width, heat(f)


def legend_shades(bounds: Sequence[str] = SHADE_BOUNDS, prefix: str = "≤") -> list[tuple[str, Style | str]]:
    """The four shades with the upper bound each one stands for, coloured as in the picture."""
    parts: list[tuple[str, Style | str]] = []
    for i, bound in enumerate(bounds):
        parts.append((SHADES[i], heat((i + 1) / 4)))
        parts.append((f" {prefix}{bound}" + ("  " if i < len(bounds) - 1 else ""), ""))
    return parts


def bar_up(value: float, top: float) -> str:
    """A cell whose height is value / top in eighths; a non-zero value is at least one eighth."""
    if value <= 0 or top <= 0:
        return " "
    return BARS_UP[min(8, max(1, round(value / top * 8)))]


def bar_right(value: float, top: float, width: int) -> str:
    """A horizontal bar of value / top times width cells, in eighths; non-zero shows at least ▏."""
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


# ---------------------------------------------------------------------------------------------
# Attention weights


def attention_heatmap(weights: np.ndarray, heads: list[int] | None = None, max_heads: int = 4,
                      title: str = "", token_labels: list[str] | None = None) -> RenderableType:
    """Attention weights [B, H, T, S] (or [H, T, S]) as a heat map per head, batch 0.

    Query positions t run down, key positions s across; an exactly-zero weight (a masked, future
    key) is drawn '·', any other weight a shade of its size. A decode step (T = 1) is drawn as a
    bar of S keys per head. heads: which heads (default the first max_heads; at most max_heads
    are drawn either way). token_labels: the text of each of the S key tokens (the queries are
    the last T of them); the rows are then labelled with their tokens and the keys listed below.
    """
    w = np.asarray(weights) if held(weights) else weights
    if w.ndim == 3:
        w = w[None]
    if w.ndim != 4 or min(w.shape) == 0:
        raise ValueError(f"attention weights must be a non-empty [B, H, T, S] array, got shape {list(w.shape)}")
    shape = w.shape
    chosen, asked = pick_heads(shape[1], heads, max_heads)
    notes = attention_caption(shape, chosen, asked, heads is None)
    if token_labels is not None and len(token_labels) != shape[3]:
        raise ValueError(f"{len(token_labels)} token labels for {shape[3]} keys")
    keys = [] if token_labels is None else [shown(x) for x in token_labels]
    if shape[2] == 1:
        rows = np.stack([np.asarray(w[0, h, 0], dtype=np.float64) for h in chosen])  # [h, S]
        return Picture(lambda width: heading(title) + decode_bars(rows, chosen, notes, width) + key_list(keys, width))
    if not held(w):  # made and pooled a block of query rows at a time
        pool = partial(pool_max_lazy, w)
    else:
        maps = np.asarray(w[0, chosen], dtype=np.float64)  # [h, T, S]
        pool = partial(pool_head, maps, chosen)
    labels = keys[shape[3] - shape[2]:] or None
    return Picture(lambda width: heading(title) + head_maps(pool, shape[2:], chosen, notes, width, labels)
                   + key_list(keys, width))


def pool_head(maps: np.ndarray, chosen: list[int], head: int, rows: int, cols: int) -> tuple[np.ndarray, int, int]:
    """pool_max of one chosen head's map [T, S]."""
    return pool_max(maps[chosen.index(head)], rows, cols)


def pool_max_lazy(w: LazyTensor, head: int, rows: int, cols: int) -> tuple[np.ndarray, int, int]:
    """pool_max of batch 0's map [T, S] of one head of a lazy [B, H, T, S] tensor, read a block
    of whole pooling rows at a time (a Tiled makes only those rows): the same cells as pooling
    the whole map."""
    b_len, _, t_len, s_len = w.shape
    rb, cb = ceil_div(t_len, max(rows, 1)), ceil_div(s_len, max(cols, 1))
    step = rb * max(1, min(t_len, TILE_VALUES // max(1, b_len * s_len)) // rb)
    grids = [pool_blocks(np.asarray(w[0, head, t:t + step], np.float64), rb, cb) for t in range(0, t_len, step)]
    return np.concatenate(grids), rb, cb


def key_list(labels: list[str], width: int) -> list[Text]:
    """The key tokens by position, 's: 0 <bos> · 1 hello · …', as many as fit in two lines."""
    if not labels:
        return []
    text, room = "keys s: ", 2 * width - 12
    for s, label in enumerate(labels):
        item = f"{s} {short(label, 12)}" + (" · " if s < len(labels) - 1 else "")
        if cell_len(text + item) > room:
            return [caption(text + f"… ({len(labels) - s} more)")]
        text += item
    return [caption(text)]


def pick_heads(n_heads: int, heads: list[int] | None, max_heads: int) -> tuple[list[int], int]:
    """The heads to draw (at most max_heads) and how many were asked for."""
    wanted = list(range(n_heads)) if heads is None else [int(h) for h in heads]
    bad = [h for h in wanted if not 0 <= h < n_heads]
    if bad or not wanted:
        raise ValueError(f"heads must be in 0..{n_heads - 1}, got {heads}")
    return wanted[: max(1, max_heads)], len(wanted)


def attention_caption(shape: tuple[int, ...], chosen: list[int], asked: int, default: bool) -> str:
    b, h, t, s = shape
    text = f"attention weights [B={b}, H={h}, T={t}, S={s}]"
    if b > 1:
        text += f", batch 0 of {b}"
    text += f"; head{'s' if len(chosen) > 1 else ''} {', '.join(map(str, chosen))} of {h}"
    if asked > len(chosen):
        text += (f" (max_heads={len(chosen)})" if default else
                 f" (the first {len(chosen)} of the {asked} asked for; max_heads={len(chosen)})")
    return text


def attention_cells(row: np.ndarray, cell_width: int) -> list[tuple[str, Style | str]]:
    """Cells of one row of weights: '!' NaN, '·' exactly 0 (masked), else a shade of the weight."""
    cells: list[tuple[str, Style | str]] = []
    for v in row:
        if math.isnan(v):
            cells.append((BAD.ljust(cell_width), ALARM))
        elif v == 0:
            cells.append((EMPTY.ljust(cell_width), DIM))
        else:
            cells.append(shade_cell(float(v), cell_width))
    return cells


def attention_legend(maps: np.ndarray) -> Text:
    parts: list[tuple[str, Style | str]] = [(EMPTY, DIM), (" exactly 0 (masked)  ", "")]
    parts += legend_shades()
    parts.append((" (weight)", ""))
    if np.isnan(maps).any():
        parts += [("  ", ""), (BAD, ALARM), (" NaN", "")]
    return line(*parts, wrap=True)


def fit_side_by_side(n: int, width: int, margin: int, natural: int) -> tuple[int, int]:
    """How many head maps go on one line, and the cell budget of each, for a console this wide."""
    smallest = margin + min(natural, MIN_COLS) + len(GAP)
    most = max(1, min(n, (width + len(GAP)) // smallest))
    per_line = ceil_div(n, ceil_div(n, most))  # as even as the lines allow
    budget = (width + len(GAP)) // per_line - len(GAP) - margin
    return per_line, max(1, min(MAX_COLS, budget))


def head_maps(pool: Callable[[int, int, int], tuple[np.ndarray, int, int]], size: tuple[int, int], chosen: list[int],
              notes: str, width: int, tokens: list[str] | None = None) -> list[Text]:
    """One heat map per head (query t down, key s across), as many side by side as fit;
    pool(head, rows, cols) gives a head's map max-pooled to at most rows x cols cells. With
    tokens (one per query), the rows say whose they are while the rows are not pooled."""
    t_len, s_len = size
    labels = [str(t) for t in range(t_len)] if tokens is None or t_len > MAX_ROWS else \
        [f"{t} {short(x, 8)}" for t, x in enumerate(tokens)]
    margin = max(max(cell_len(x) for x in labels), 3) + 1
    per_line, col_budget = fit_side_by_side(len(chosen), width, margin, s_len)
    stacked = ceil_div(len(chosen), per_line)
    row_budget = MAX_ROWS if stacked == 1 else max(MIN_ROWS, MAX_ROWS // stacked)
    blocks, grids, block = [], [], (1, 1)
    for h in chosen:
        pooled, rb, cb = pool(h, row_budget, col_budget)
        block = (rb, cb)
        grids.append(pooled)
        cell_width = 2 if cb == 1 and 2 * s_len <= col_budget else 1
        blocks.append(one_head_map(h, pooled, rb, cb, margin, cell_width, labels if rb == 1 else None))
    out = []
    for i in range(0, len(blocks), per_line):
        out += side_by_side(blocks[i:i + per_line])
    out.append(attention_legend(np.concatenate([g.ravel() for g in grids])))  # a NaN stays NaN when pooled
    out.append(caption(notes + "; query t down, key s across"))
    if block != (1, 1):
        after = (ceil_div(t_len, block[0]), ceil_div(s_len, block[1]))
        out.append(caption(pooled_note("weight", block, (t_len, s_len), after, ("queries", "keys"))))
    return out


def one_head_map(h: int, grid: np.ndarray, rb: int, cb: int, margin: int, cell_width: int,
                 labels: list[str] | None = None) -> list[Text]:
    n_rows, n_cols = grid.shape
    lines = [line((f"head {h}", "bold")), line("t\\s".rjust(margin - 1) + " ",
                                               (ticks(n_cols, cell_width, lambda c: c * cb), DIM))]
    labelled = labelled_rows(n_rows)
    for r in range(n_rows):
        label = labels[r] if labels is not None and r in labelled else str(r * rb) if r in labelled else ""
        lines.append(line((pad_left(label, margin - 1) + " ", DIM), *attention_cells(grid[r], cell_width)))
    return lines


def pad_left(text: str, width: int) -> str:
    """text right-aligned in `width` terminal cells (a Han character takes two)."""
    return " " * max(0, width - cell_len(text)) + text


def decode_bars(rows: np.ndarray, chosen: list[int], notes: str, width: int) -> list[Text]:
    """A decode step: the one query's weights over the S keys, a bar of cells per head."""
    s_len = rows.shape[1]
    margin = len(f"head {max(chosen)}") + 1
    note_width = len(f"  max {number(1 / 3)} at s={s_len - 1}")
    budget = max(1, min(MAX_COLS, width - margin - note_width, width - margin))
    if budget < MIN_COLS:
        budget, note_width = max(1, min(MAX_COLS, width - margin)), 0
    pooled, _, cb = pool_max(rows, len(chosen), budget)
    cell_width = 2 if cb == 1 and 2 * s_len <= budget else 1
    out = [line(" " * margin, (ticks(pooled.shape[1], cell_width, lambda c: c * cb), DIM))]
    for h, bar, full in zip(chosen, pooled, rows):
        parts = [(f"head {h}".ljust(margin), "bold"), *attention_cells(bar, cell_width)]
        if note_width:
            best = int(np.nanargmax(full)) if not np.isnan(full).all() else 0
            parts.append((f"  max {number(float(full[best]))} at s={best}", DIM))
        out.append(line(*parts))
    out.append(attention_legend(rows))
    out.append(caption(notes + "; a decode step: the one query (T=1) over the keys s, a row per head"))
    if cb > 1:
        out.append(caption(f"max-pooled: each cell is the largest weight of {cb} keys "
                           f"({s_len} → {pooled.shape[1]} cells)"))
    return out


# ---------------------------------------------------------------------------------------------
# The router's choices


def routing_map(topk_idx: np.ndarray, topk_weight: np.ndarray, n_experts: int,
                token_labels: list[str] | None = None, zero_experts: int = 0) -> RenderableType:
    """The router's choices, topk_idx / topk_weight [N tokens, k], as a token x expert grid.

    A chosen expert's cell is shaded by its weight (relative to the largest weight), others are
    '·'; when there is room the chosen experts and weights are listed after each row, in rank
    order. Below: the load of each expert (how many tokens chose it) and a summary line. More
    experts than fit are grouped in bins (a cell then counts the token's experts in the bin); more
    tokens than TOKEN_ROWS are cut, and the load still counts them all. The last `zero_experts` of
    the n_experts (LongCat's identity experts) are listed as z0, z1, ... and counted apart.
    """
    idx = np.asarray(topk_idx)
    weight = np.asarray(topk_weight, dtype=np.float64)
    if idx.ndim != 2 or idx.shape != weight.shape:
        raise ValueError(f"topk_idx and topk_weight must both be [N, k], got {list(idx.shape)} and "
                         f"{list(weight.shape)}")
    if idx.size and not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(f"topk_idx must hold integers, got {idx.dtype}")
    if idx.size and (idx.min() < 0 or idx.max() >= n_experts):
        raise ValueError(f"expert ids must be in 0..{n_experts - 1}, got {idx.min()}..{idx.max()}")
    if token_labels is not None and len(token_labels) != idx.shape[0]:
        raise ValueError(f"{len(token_labels)} token labels for {idx.shape[0]} tokens")
    labels = [str(i) for i in range(idx.shape[0])] if token_labels is None else [shown(str(x)) for x in token_labels]
    load = np.bincount(idx.ravel().astype(np.int64), minlength=n_experts)
    return Picture(lambda width: draw_routing(idx.astype(np.int64), weight, load, labels, width, zero_experts),
                   whole_off_screen=True)


def expert_bin(n_experts: int, budget: int) -> int:
    """Experts per column: 1, or the smallest power of two that makes the columns fit."""
    size = 1
    while ceil_div(n_experts, size) > budget:
        size *= 2
    return size


def short(label: str, width: int = 10) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"


def draw_routing(idx: np.ndarray, weight: np.ndarray, load: np.ndarray, labels: list[str], width: int,
                 zero_experts: int = 0) -> list[Text]:
    n_tokens, k = idx.shape
    n_experts = load.size
    shown = min(n_tokens, TOKEN_ROWS)
    margin = max([len("load #"), *(cell_len(short(x)) for x in labels[:shown])]) + 1
    size = expert_bin(n_experts, max(1, min(MAX_COLS, width - margin)))
    n_cols = ceil_div(n_experts, size)
    top = float(np.nanmax(weight)) if weight.size and not np.isnan(weight).all() else 0.0
    out = [line("tok\\e".rjust(margin - 1) + " ", (ticks(n_cols, 1, lambda c: c * size), DIM))]
    for t in range(shown):
        cells = token_cells(idx[t], weight[t], top, n_cols, size, k)
        picks = [f"{expert_label(e, n_experts, zero_experts)} {w:.2f}" for e, w in zip(idx[t], weight[t])]
        picks = picks if size == 1 else []
        out.append(line((pad_left(short(labels[t]), margin - 1) + " ", DIM), *cells,
                        *fitting(picks, width - margin - n_cols)))
    if shown < n_tokens:
        out.append(caption(f"… {n_tokens - shown} more tokens not shown (N={n_tokens}); the load counts all of them"))
    out += load_rows(load, size, margin)
    out.append(routing_legend(top, size, k))
    out += routing_summary(load, n_tokens, k, size, zero_experts)
    if zero_experts:
        out.append(zero_expert_summary(load, n_tokens, k, zero_experts))
    return out


def expert_label(e: int, n_experts: int, zero_experts: int) -> str:
    """e12 for a routed expert, z3 for the fourth zero (identity) expert."""
    first_zero = n_experts - zero_experts
    return f"z{e - first_zero}" if e >= first_zero else f"e{e}"


def zero_expert_summary(load: np.ndarray, n_tokens: int, k: int, zero_experts: int) -> Text:
    """How many of the choices went to zero experts, which return their input and compute nothing."""
    first_zero = load.size - zero_experts
    chosen = int(load[first_zero:].sum())
    return caption(f"zero experts z0-z{zero_experts - 1} (columns {first_zero}-{load.size - 1}, identity: no compute) "
                   f"took {chosen} of the {n_tokens * k} choices")


def token_cells(experts: np.ndarray, weights: np.ndarray, top: float, n_cols: int, size: int,
                k: int) -> list[tuple[str, Style | str]]:
    """One token's row: its chosen experts shaded by weight, or with bins, how many fall in each."""
    if size == 1:
        weight_of = {int(e): float(w) for e, w in zip(experts, weights)}
        return [shade_cell(weight_of[c] / top if top > 0 else 1.0, 1) if c in weight_of else (EMPTY, DIM)
                for c in range(n_cols)]
    counts = np.bincount(experts // size, minlength=n_cols)
    return [(EMPTY, DIM) if n == 0 else (str(n) if n < 10 else "+", heat(n / k)) for n in counts]


def fitting(picks: list[str], room: int) -> list[tuple[str, Style | str]]:
    """As many of a token's 'e12 0.61' picks as fit in room columns, with … if some do not."""
    text = "  "
    for i, pick in enumerate(picks):
        more = ("  " if i else "") + pick
        if len(text) + len(more) + 2 > room:
            return [(text + " …", DIM)] if i else []
        text += more
    return [(text, DIM)] if picks else []


def load_rows(load: np.ndarray, size: int, margin: int) -> list[Text]:
    """The load of each column as a bar of eighths, and as digits when every load is below 10."""
    per_col = np.add.reduceat(load, np.arange(0, load.size, size)) if size > 1 else load
    top = int(per_col.max()) if per_col.size else 0
    spark = "".join(bar_up(int(n), top) for n in per_col)
    rows = [line("load".rjust(margin - 1) + " ", (spark, "green"))]
    if top < 10:
        digits = "".join(EMPTY if n == 0 else str(int(n)) for n in per_col)
        rows.append(line(("load #".rjust(margin - 1) + " ", DIM), digits))
    return rows


def routing_legend(top: float, size: int, k: int) -> Text:
    if size == 1:
        return line((EMPTY, DIM), (" not chosen  ", ""), *legend_shades(),
                    ((f" of the largest weight ({number(top)}); picks in the router's order, by choice score "
                      "(a bias in it can put a smaller weight first)"), ""), wrap=True)
    return line((EMPTY, DIM), (f" none of the token's {k} experts in the bin  ", ""),
                (f"1..{k}", heat(1.0)), (" how many are", ""), wrap=True)


def routing_summary(load: np.ndarray, n_tokens: int, k: int, size: int, zero_experts: int = 0) -> list[Text]:
    used = int((load > 0).sum())
    busiest = int(load.argmax()) if load.size else 0
    busiest_name = expert_label(busiest, load.size, zero_experts).removeprefix("e")
    lines = [Text(f"experts used {used}/{load.size} · max load {int(load.max(initial=0))} (expert {busiest_name}) · "
                  f"{n_tokens} token{'s' if n_tokens != 1 else ''} × top-{k} · balanced would be "
                  f"{number(n_tokens * k / max(load.size, 1))} each")]
    order = [e for e in sorted(range(load.size), key=lambda e: (-load[e], e))[:8] if load[e] > 0]
    if order:
        lines.append(caption("busiest: " + ", ".join(f"{expert_label(e, load.size, zero_experts)} {int(load[e])}"
                                                     for e in order)))
    if size > 1:
        lines.append(caption(f"experts grouped in {ceil_div(load.size, size)} bins of {size} "
                             f"(e0-{size - 1}, e{size}-{2 * size - 1}, …): a cell counts the token's experts in "
                             f"the bin, the load adds up the bin"))
    return lines


# ---------------------------------------------------------------------------------------------
# Histogram


def histogram(array: Tensor, bins: int = 24, width: int = 40, title: str = "") -> RenderableType:
    """A horizontal-bar histogram of the finite values: per bin its range, a bar and the count.

    Bins are the views' (views.summary: equal runs of the exact lattice bins, from a round point at
    or below the min), gathered a batch of values at a time; NaN, +Inf and -Inf are counted in the
    caption, and the bin holding 0 is marked '← 0'.
    """
    gathered = summary.gather(array)
    st = gathered.stats()
    bins = max(1, bins)
    if st.finite:
        counts, edges = gathered.bins.view(bins)
    else:
        counts, edges = np.zeros(0, int), np.zeros(1)
    bad = (st.nan, gathered.pos_inf, st.inf - gathered.pos_inf)
    total = st.nan + st.inf + st.finite
    return Picture(lambda cols: heading(title) + draw_histogram(counts, edges, bad, total, width, cols))


def bin_labels(edges: np.ndarray) -> list[str]:
    """'[lo, hi)' for every bin, '[lo, hi]' for the last, the numbers aligned in columns."""
    lo = [number(float(x)) for x in edges[:-1]]
    hi = [number(float(x)) for x in edges[1:]]
    lw, hw = max(map(len, lo)), max(map(len, hi))
    return [f"[{a.rjust(lw)}, {b.rjust(hw)}{']' if i == len(lo) - 1 else ')'}" for i, (a, b) in enumerate(zip(lo, hi))]


def zero_bin(edges: np.ndarray) -> int | None:
    if not edges[0] <= 0 <= edges[-1]:
        return None
    return min(int(np.searchsorted(edges, 0.0, side="right")) - 1, len(edges) - 2)


def draw_histogram(counts: np.ndarray, edges: np.ndarray, bad: tuple[int, int, int], total: int, width: int,
                   cols: int) -> list[Text]:
    out = []
    if counts.size:
        labels = bin_labels(edges)
        count_width = len(str(int(counts.max())))
        zero_at = zero_bin(edges)
        mark = "  ← 0" if zero_at is not None else ""
        bar_width = max(4, min(width, cols - len(labels[0]) - count_width - 4 - len(mark)))
        top = int(counts.max())
        for i, (label, n) in enumerate(zip(labels, counts)):
            bar = bar_right(int(n), top, bar_width).ljust(bar_width)
            out.append(line((label, DIM), " ", (bar, "cyan"), " ", (str(int(n)).rjust(count_width), "" if n else DIM),
                            (mark if i == zero_at else "", "bold")))
    finite = int(counts.sum())
    text = Text(f"{finite} finite values of {total}" if counts.size else f"no finite values among {total}",
                style="dim")
    for name, n in zip(("NaN", "+Inf", "-Inf"), bad):
        text.append(" · ")
        text.append(f"{name} {n}", style=ALARM if n else DIM)
    if counts.size:
        plural = "s" if counts.size > 1 else ""
        text.append(f" · {counts.size} bin{plural} of width {number(float(edges[1] - edges[0]))}", style="dim")
    out.append(text)
    return out


# ---------------------------------------------------------------------------------------------
# FP8 block scales


def scale_grid(scale_inv: np.ndarray, title: str = "") -> RenderableType:
    """The FP8 block scales of one weight, scale_inv [ceil(out/128), ceil(in/128)], as a heat map.

    Shades follow log2 of the scale between its min and max; a scale that is not a positive
    finite number is drawn '!'. Grids bigger than the budget are max-pooled.
    """
    s = np.asarray(scale_inv).astype(np.float64)
    if s.ndim != 2 or s.size == 0:
        raise ValueError(f"scale_inv must be a non-empty 2-D array, got shape {list(s.shape)}")
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.where(np.isfinite(s) & (s > 0), np.log2(np.where(s > 0, s, 1.0)), np.nan)
    return Picture(lambda width: heading(title) + draw_scales(s, logs, width))


def draw_scales(s: np.ndarray, logs: np.ndarray, width: int) -> list[Text]:
    n_rows, n_cols = s.shape
    margin = max(len(str(n_rows - 1)), 3) + 1
    budget = max(1, min(MAX_COLS, width - margin))
    pooled, rb, cb = pool_max(logs, MAX_ROWS, budget)
    cell_width = 2 if cb == 1 and 2 * n_cols <= budget else 1
    valid = logs[~np.isnan(logs)]
    lo, hi = (float(valid.min()), float(valid.max())) if valid.size else (0.0, 0.0)
    out = [line("r\\c".rjust(margin - 1) + " ", (ticks(pooled.shape[1], cell_width, lambda c: c * cb), DIM))]
    labelled = labelled_rows(pooled.shape[0])
    for r, row in enumerate(pooled):
        cells = [(BAD.ljust(cell_width), ALARM) if math.isnan(v) else
                 shade_cell((v - lo) / (hi - lo) if hi > lo else 1.0, cell_width) for v in row]
        out.append(line(((str(r * rb) if r in labelled else "").rjust(margin - 1) + " ", DIM), *cells))
    out += scale_notes(s, logs, lo, hi, (rb, cb), pooled.shape)
    return out


def scale_notes(s: np.ndarray, logs: np.ndarray, lo: float, hi: float, block: tuple[int, int],
                pooled_shape: tuple[int, ...]) -> list[Text]:
    """Legend (the scale each shade reaches, log spaced), min and max with their blocks, caption."""
    notes = []
    if hi > lo:
        bounds = [sci(2 ** (lo + (hi - lo) * (i + 1) / 4)) for i in range(4)]
        notes.append(line(("log scale: ", ""), *legend_shades(bounds), wrap=True))
    elif not np.isnan(logs).all():
        notes.append(line((SHADES[-1], heat(1.0)), (f" every scale is {sci(2 ** hi)}", ""), wrap=True))
    if not np.isnan(logs).all():
        at_min = np.unravel_index(np.nanargmin(logs), logs.shape)
        at_max = np.unravel_index(np.nanargmax(logs), logs.shape)
        notes.append(caption(f"min {sci(2 ** lo)} at block [{at_min[0]}, {at_min[1]}] · "
                             f"max {sci(2 ** hi)} at block [{at_max[0]}, {at_max[1]}]"))
    n_bad = int(np.isnan(logs).sum())
    if n_bad:
        notes.append(Text(f"{n_bad} scales are not positive finite numbers ({BAD})", style=ALARM))
    rows, cols = s.shape
    notes.append(caption(f"scale_inv [{rows}, {cols}]: one float32 scale per 128×128 block of the FP8 weight, "
                         f"out/128 blocks r down, in/128 blocks c across"))
    if block != (1, 1):
        notes.append(caption(pooled_note("scale", block, (rows, cols), pooled_shape[:2], ("rows", "cols"))))
    return notes


# ---------------------------------------------------------------------------------------------
# DeepSeek-V3.2's Lightning Indexer

KEPT, DROPPED = "█", "×"  # a position the indexer kept for a query, one in its past it dropped


def indexer_map(mask: np.ndarray, weights: Tensor, head: int = 0, title: str = "") -> RenderableType:
    """The indexer's choice, mask [B, T, S] (0 kept, -inf dropped), beside the attention weights
    [B, H, T, S] of one head, batch 0: for each query (down, by its position among the S), which
    positions s (across) it kept, and how attention spread over them. Both are pooled a block of
    query rows at a time, so a long prompt's map never makes a second [T, S] array whole."""
    kept = np.asarray(mask)
    w = np.asarray(weights) if held(weights) else weights
    if kept.ndim != 3 or w.ndim != 4 or tuple(kept.shape[1:]) != tuple(w.shape[2:]) or not 0 <= head < w.shape[1]:
        raise ValueError(f"need a mask [B, T, S] and weights [B, H, T, S] of the same T, S and a head of H, "
                         f"got {list(kept.shape)}, {list(w.shape)} and head {head}")
    if not held(w):
        pool = partial(pool_max_lazy, w, head)
    else:
        pool = partial(pool_max, w[0, head])
    return Picture(lambda width: heading(title) + draw_indexer(kept[0], pool, head, width))


def pooled_marks(mask: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, int, int]:
    """The indexer's mark of each query and position, 2 kept, 1 dropped (in its past), 0 future,
    max-pooled to at most rows x cols cells, a block of whole pooling rows at a time.  mask [T, S]"""
    t_len, s_len = mask.shape
    rb, cb = ceil_div(t_len, max(rows, 1)), ceil_div(s_len, max(cols, 1))
    step = rb * max(1, TILE_VALUES // max(1, rb * s_len))
    grids = []
    for t in range(0, t_len, step):
        queries = np.arange(t, min(t + step, t_len))
        past = np.arange(s_len)[None, :] <= (s_len - t_len) + queries[:, None]  # [t, S]
        marks = np.where(mask[queries] == 0, 2.0, np.where(past, 1.0, 0.0))
        grids.append(pool_blocks(marks, rb, cb))
    return np.concatenate(grids), rb, cb


def draw_indexer(mask: np.ndarray, pool: Callable[[int, int], tuple[np.ndarray, int, int]], head: int,
                 width: int) -> list[Text]:
    t_len, s_len = mask.shape
    first = s_len - t_len  # the position of query 0 among the S
    margin = max(len(str(s_len - 1)), 3) + 1
    per_line, col_budget = fit_side_by_side(2, width, margin, s_len)
    rows = MAX_ROWS if per_line == 2 else MIN_ROWS
    marks, rb, cb = pooled_marks(mask, rows, col_budget)
    pooled_w, _, _ = pool(rows, col_budget)
    cell_width = 2 if cb == 1 and 2 * s_len <= col_budget else 1
    chosen = [line(("indexer kept", "bold")),
              line("t\\s".rjust(margin - 1) + " ", (ticks(marks.shape[1], cell_width, lambda c: c * cb), DIM))]
    labelled = labelled_rows(marks.shape[0])
    for r, row in enumerate(marks):
        label = str(first + r * rb) if r in labelled else ""
        cells = [((KEPT, DROPPED, EMPTY)[2 - int(v)].ljust(cell_width), ("bold", "red", DIM)[2 - int(v)]) for v in row]
        chosen.append(line((label.rjust(margin - 1) + " ", DIM), *cells))
    attention = one_head_map(head, pooled_w, rb, cb, margin, cell_width,
                             [str(first + r * rb) for r in range(marks.shape[0])])
    blocks = [chosen, attention]
    out = side_by_side(blocks) if per_line == 2 else blocks[0] + blocks[1]
    kept_per_query = np.count_nonzero(mask == 0, axis=1)  # [T]
    out.append(line((KEPT, "bold"), " kept  ", (DROPPED, "red"), " dropped by the indexer  ", (EMPTY, DIM),
                    " future", wrap=True))
    out.append(attention_legend(pooled_w))
    past = t_len * first + t_len * (t_len + 1) // 2  # query-position pairs in the past, over all queries
    out.append(caption(f"{int(kept_per_query.max())} of up to {s_len} positions kept per query "
                       f"(the last, at position {s_len - 1}: {int(kept_per_query[-1])}), {int(kept_per_query.sum()):,} "
                       f"of the {past:,} in the queries' past; rows are the queries by position; head {head}'s "
                       "weights beside, exactly 0 wherever the indexer dropped a position"))
    if (rb, cb) != (1, 1):
        out.append(caption(pooled_note("mark (kept, then dropped, then future) and weight", (rb, cb), (t_len, s_len),
                                       marks.shape, ("queries", "keys"))))
    return out
