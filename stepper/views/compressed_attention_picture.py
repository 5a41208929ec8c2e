"""DeepSeek-V4's attention for one query, as a picture: what of the context it sees.

A query at position p sees the last `sliding_window` tokens (its own included) and compressed
entries: entry w pools the tokens of window w (positions w*m .. w*m + m - 1; a CSA entry also
those of window w - 1, in the first half of its channels) and is visible iff w < (p+1)//m. An HCA
layer (m = 128) attends every visible entry; a CSA layer (m = 4) only those its indexer kept. The picture draws the
positions 0..p left to right, each cell marked by the best way the query reaches it (in the
window, through a kept entry, through an entry the indexer dropped, not yet pooled), the entries
strip below it, and, given a head's weights, how its probability splits between the window, the
entries and the sink. Like stepper.views.pictures, it does no model math and reads without colour.
"""

from __future__ import annotations

import numpy as np
from rich.console import RenderableType
from rich.text import Text

from stepper.views.pictures import (
    DIM,
    DROPPED,
    EMPTY,
    KEPT,
    MAX_COLS,
    Picture,
    caption,
    ceil_div,
    heading,
    legend,
    line,
    shade,
)

WINDOW = "W"
MARKS = (EMPTY, DROPPED, KEPT, WINDOW)  # 0 not pooled yet, 1 dropped entry, 2 kept entry, 3 window
STYLES = (DIM, "red", "bold", "bold cyan")


def reach(position: int, sliding_window: int, ratio: int, chosen: np.ndarray,
          overlap: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """How the query at `position` reaches each position 0..p (MARKS' index) and each entry made
    so far (2 kept, 1 visible but dropped). With `overlap` (CSA), entry w also reads window w - 1,
    so a window is reached through its own entry or the next one, the better of the two.
    chosen [K] (-1: none) -> [p + 1], [(p+1)//m]"""
    visible = (position + 1) // ratio if ratio else 0
    entries = np.ones(visible, np.int64)  # every visible entry: dropped unless chosen
    kept = chosen[(chosen >= 0) & (chosen < visible)]
    entries[kept] = 2
    tokens = np.zeros(position + 1, np.int64)
    if ratio:
        windows = np.maximum(entries, np.append(entries[1:], 0)) if overlap else entries
        tokens[: visible * ratio] = np.repeat(windows, ratio)
    tokens[max(position - sliding_window + 1, 0):] = 3
    return tokens, entries


def compressed_attention_map(position: int, sliding_window: int, ratio: int, chosen: np.ndarray,
                             title: str = "", indexer: bool = False) -> RenderableType:
    """The picture of one query: position p, the layer's window and ratio (0 sliding, 4, 128),
    chosen [K] the entries it attends (attn.chosen of the query; -1 none), `indexer` whether the
    layer's indexer chooses them (CSA) or every visible one is kept (HCA)."""
    chosen = np.asarray(chosen).reshape(-1).astype(np.int64)
    if position < 0 or sliding_window < 1 or ratio < 0:
        raise ValueError(f"need a position >= 0, a window >= 1 and a ratio >= 0, got {position}, "
                         f"{sliding_window} and {ratio}")
    tokens, entries = reach(position, sliding_window, ratio, chosen, overlap=indexer)
    return Picture(lambda width: heading(title) + draw(position, sliding_window, ratio, tokens, entries, indexer,
                                                       width), whole_off_screen=True)  # a pipe: the legend on one line


def strip(marks: np.ndarray, budget: int) -> tuple[list[tuple[str, str]], int]:
    """One line of at most `budget` cells, each a block of marks: W if the block touches the
    window; else, if it holds kept entries, a shade of the share of them kept (█ all of them
    when a cell is one mark); else × (dropped) or · (not pooled). (char, style) each, and the block."""
    if marks.size == 0:
        return [], 1
    block = ceil_div(marks.size, max(budget, 1))
    cells = []
    for start in range(0, marks.size, block):
        part = marks[start:start + block]
        kept = np.count_nonzero(part == 2) / part.size
        if (part == 3).any():
            cells.append((WINDOW, STYLES[3]))
        elif kept:
            cells.append((KEPT if kept == 1 else shade(kept), STYLES[2]))
        else:
            cells.append((MARKS[int(part.max())], STYLES[int(part.max())]))
    return cells, block


def counted(n: int, noun: str) -> str:
    """'1 key', '8 keys'."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def draw(position: int, sliding_window: int, ratio: int, tokens: np.ndarray, entries: np.ndarray, indexer: bool,
         width: int) -> list[Text]:
    margin = 10
    budget = max(min(MAX_COLS, width - margin - 1), 8)
    token_cells, token_block = strip(tokens, budget)
    entry_cells, entry_block = strip(entries, budget)
    window = min(sliding_window, position + 1)
    kind = "sliding window only" if not ratio else f"CSA (m = {ratio}, indexer)" if indexer else f"HCA (m = {ratio})"
    kept = int(np.count_nonzero(entries == 2))
    axis = f"{'':{margin}}0 … {position:,}" + (f"  ({token_block} positions a cell)" if token_block > 1 else "")
    out = [line((f"query at position {position:,} · {kind}", "bold")),
           line(("positions".ljust(margin - 1) + " ", DIM), *token_cells),
           line(("", DIM), axis)]
    if ratio:
        out.append(line(("entries".ljust(margin - 1) + " ", DIM), *entry_cells))
        if entry_block > 1:
            out.append(line(f"{'':{margin}}({entry_block} entries a cell; ░▒▓ the share of them kept: ≤¼ ≤½ ≤¾)"))
    items = [((WINDOW, "bold cyan"), " window"),
             ((KEPT, "bold"), " read by a kept entry (a CSA entry reads its window and the one before)" if indexer
              else " through a kept entry"),
             *([((DROPPED, "red"), " read only by entries the indexer dropped")] if indexer else []),
             ((EMPTY, DIM), " not pooled yet")]
    out += legend([line(*item, wrap=True) for item in items], width)
    sees = (f"{counted(window + kept, 'key')}: the window's {counted(window, 'token')} "
            f"(positions {position - window + 1:,}..{position:,})")
    if ratio:
        visible = "visible entry" if entries.size == 1 else "visible entries"
        sees += f" + {kept:,} of the {entries.size:,} {visible} ((p+1)//m = ({position:,}+1)//{ratio})"
    out.append(caption(sees))
    return out
