"""The router's choices: a token x expert grid of the chosen experts, shaded by their routing
weights, with the load of each expert (how many tokens chose it)."""

from __future__ import annotations

import numpy as np
from rich.cells import cell_len
from rich.console import RenderableType
from rich.style import Style
from rich.text import Text

from stepper.untrusted import shown
from stepper.views.pictures import (
    DIM,
    EMPTY,
    MAX_COLS,
    TOKEN_ROWS,
    Picture,
    bad_legend,
    bar_up,
    caption,
    ceil_div,
    heat,
    legend_shades,
    line,
    pad_left,
    shade_cell,
    short,
    ticks,
)
from stepper.views.summary import number

BY_SCORE = "by choice score (a bias in it can put a smaller weight first)"  # how a top-k router orders its picks


def routing_map(topk_idx: np.ndarray, topk_weight: np.ndarray, n_experts: int,
                token_labels: list[str] | None = None, zero_experts: int = 0, order: str = BY_SCORE) -> RenderableType:
    """The router's choices, topk_idx / topk_weight [N tokens, k], as a token x expert grid.

    A chosen expert's cell is shaded by its weight (relative to the largest weight), others are
    '·'; when there is room the chosen experts and weights are listed after each row, in rank
    order. Below: the load of each expert (how many tokens chose it) and a summary line. More
    experts than fit are grouped in bins (a cell then counts the token's experts in the bin); more
    tokens than TOKEN_ROWS are cut, and the load still counts them all. The last `zero_experts` of
    the n_experts (LongCat's identity experts) are listed as z0, z1, ... and counted apart. The
    legend says the picks' `order` (a hash-routed layer's are its table's).
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
    return Picture(lambda width: draw_routing(idx.astype(np.int64), weight, load, labels, width, zero_experts, order),
                   whole_off_screen=True)


def expert_bin(n_experts: int, budget: int) -> int:
    """Experts per column: 1, or the smallest power of two that makes the columns fit."""
    size = 1
    while ceil_div(n_experts, size) > budget:
        size *= 2
    return size


def draw_routing(idx: np.ndarray, weight: np.ndarray, load: np.ndarray, labels: list[str], width: int,
                 zero_experts: int = 0, order: str = BY_SCORE) -> list[Text]:
    n_tokens, k = idx.shape
    n_experts = load.size
    shown = min(n_tokens, TOKEN_ROWS)
    margin = max([len("load #"), *(cell_len(short(x)) for x in labels[:shown])]) + 1
    size = expert_bin(n_experts, max(1, min(MAX_COLS, width - margin)))
    n_cols = ceil_div(n_experts, size)
    top = float(weight[np.isfinite(weight)].max(initial=0.0))  # the scale: NaN and inf are drawn apart
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
    out.append(routing_legend(top, size, k, order))
    out += bad_legend(weight) if size == 1 else []
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
        return [shade_cell(scaled(weight_of[c], top), 1) if c in weight_of else (EMPTY, DIM)
                for c in range(n_cols)]
    counts = np.bincount(experts // size, minlength=n_cols)
    return [(EMPTY, DIM) if n == 0 else (str(n) if n < 10 else "+", heat(n / k)) for n in counts]


def scaled(w: float, top: float) -> float:
    """A chosen expert's weight as a fraction of the largest finite one (1 when none is above 0);
    NaN or inf stays so, drawn as such (a NaN weight was a full cell when every weight was NaN)."""
    if not np.isfinite(w):
        return w
    return w / top if top > 0 else 1.0


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


def routing_legend(top: float, size: int, k: int, order: str = BY_SCORE) -> Text:
    if size == 1:
        return line((EMPTY, DIM), (" not chosen  ", ""), *legend_shades(),
                    (f" of the largest weight ({number(top)}); picks in the router's order, {order}", ""), wrap=True)
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
