"""The attention weights as one heat map per head (pooled where a head's map is larger than the
picture), and DeepSeek-V3.2's Lightning Indexer's choices: the positions it kept for each query
against those in its past it dropped."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import numpy as np
from rich.cells import cell_len
from rich.console import RenderableType
from rich.style import Style
from rich.text import Text

from stepper.tensors.tensor import LazyTensor, Tensor, held
from stepper.tensors.tiled import TILE_VALUES
from stepper.untrusted import shown
from stepper.views.pictures import (
    ALARM,
    BAD,
    DIM,
    DROPPED,
    EMPTY,
    GAP,
    KEPT,
    MAX_COLS,
    MAX_ROWS,
    MIN_COLS,
    MIN_ROWS,
    Picture,
    caption,
    ceil_div,
    heading,
    labelled_rows,
    legend_shades,
    line,
    pad_left,
    pool_blocks,
    pool_max,
    pooled_note,
    shade_cell,
    short,
    side_by_side,
    ticks,
)
from stepper.views.summary import number


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
