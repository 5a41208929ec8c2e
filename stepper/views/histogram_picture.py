"""A tensor's histogram as horizontal bars, its NaN and infinities counted apart."""

from __future__ import annotations

import numpy as np
from rich.console import RenderableType
from rich.text import Text

from stepper.tensors.tensor import Tensor
from stepper.views import summary
from stepper.views.pictures import (
    ALARM,
    DIM,
    Picture,
    bar_right,
    heading,
    line,
)
from stepper.views.summary import number


def histogram(array: Tensor, bins: int = 24, width: int = 40, title: str = "") -> RenderableType:
    """A horizontal-bar histogram of the finite values: per bin its range, a bar and the count.

    Bins are the views' (views.summary: equal runs of the exact lattice bins, from a round point at
    or below the min; an integer tensor's a value each where they fit, else runs of whole
    integers), gathered a batch of values at a time; NaN, +Inf and -Inf are counted in the
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
    """'[lo, hi)' for every bin, '[lo, hi]' for the last, the numbers aligned in columns; an integer
    tensor's bins (integer edges) by their values (`integer_labels`)."""
    if edges.dtype.kind == "i":
        return integer_labels(edges)
    lo = [number(float(x)) for x in edges[:-1]]
    hi = [number(float(x)) for x in edges[1:]]
    lw, hw = max(map(len, lo)), max(map(len, hi))
    return [f"[{a.rjust(lw)}, {b.rjust(hw)}{']' if i == len(lo) - 1 else ')'}" for i, (a, b) in enumerate(zip(lo, hi))]


def integer_labels(edges: np.ndarray) -> list[str]:
    """Each bin of whole integers by its value ('7'), or by its first and last ('[0, 3]'), aligned."""
    if edges[1] - edges[0] == 1:
        labels = [str(int(x)) for x in edges[:-1]]
        return [label.rjust(max(map(len, labels))) for label in labels]
    lo, hi = [str(int(x)) for x in edges[:-1]], [str(int(x) - 1) for x in edges[1:]]
    lw, hw = max(map(len, lo)), max(map(len, hi))
    return [f"[{a.rjust(lw)}, {b.rjust(hw)}]" for a, b in zip(lo, hi)]


def bin_width(edges: np.ndarray) -> str:
    """The bins' width, as the caption says it: an integer tensor's in values."""
    if edges.dtype.kind == "i":
        values = int(edges[1] - edges[0])
        return f"{values} value{'s' if values > 1 else ''}{' each' if len(edges) > 2 else ''}"
    return f"width {number(float(edges[1] - edges[0]))}"


def zero_bin(edges: np.ndarray) -> int | None:
    """The bin holding 0, if one does: the last bin holds its right edge, but an integer tensor's (its
    edges integers) ends one short of it."""
    if not edges[0] <= 0 <= edges[-1] or (edges.dtype.kind == "i" and edges[-1] == 0):
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
        text.append(f" · {counts.size} bin{plural} of {bin_width(edges)}", style="dim")
    out.append(text)
    return out
