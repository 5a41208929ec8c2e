"""DeepSeek-V4's hyper-connections as a picture: the comb matrix that mixes the residual streams
at one position, with its row and column sums, the pre and post weights of each stream, and each
stream's size (RMS) along the positions.

Read row j of comb as where stream j's content goes: the new stream k takes comb[j, k] of the old
stream j (hc_post: X'_k = post_k y + sum_j comb[j, k] X_j). After Sinkhorn every row and column
sums to about 1, which the sums beside the matrix show. Cells are shaded by value (░▒▓█, a
quarter of the largest entry each) and carry the value, so the picture reads without colour.
"""

from __future__ import annotations

import numpy as np
from rich.text import Text

from stepper.views.pictures import (
    Picture,
    bad_legend,
    bar_right,
    bar_up,
    caption,
    finite_top,
    heading,
    line,
    shade_cell,
)

CELL = 8  # characters per matrix cell: a shade, a space, a value like 0.412 and a space
BAR = 12  # characters of a weight's bar


def hyper_connection_map(comb: np.ndarray, pre: np.ndarray | None = None, post: np.ndarray | None = None,
                         streams: np.ndarray | None = None, position: int = -1, title: str = "",
                         first: int = 0) -> Picture:
    """comb [B, T, n, n] (pre, post [B, T, n], streams [B, T, n, d] optional) at one position of batch row 0;
    `first`: the position of the step's first token (a decode step's is the prompt's length and more)."""
    comb = np.asarray(comb)
    if comb.ndim != 4 or comb.shape[-1] != comb.shape[-2]:
        raise ValueError(f"need a comb matrix [B, T, n, n], got shape {list(comb.shape)}")
    t = range(comb.shape[1])[position]

    def draw(width: int) -> list[Text]:
        lines = heading(title) + [caption(f"position {first + t} of {first}..{first + comb.shape[1] - 1}: row j says "
                                          "where stream j goes (X'_k = post_k y + sum_j comb[j, k] X_j)")]
        lines += matrix_lines(comb[0, t])
        drawn = [comb[0, t].ravel()]
        for label, weights in (("pre ", pre), ("post", post)):
            if weights is not None:
                lines += weight_lines(label, np.asarray(weights)[0, t])
                drawn.append(np.asarray(weights)[0, t])
        if streams is not None:
            lines += stream_lines(np.asarray(streams)[0], width, first)
            drawn.append(np.asarray(streams)[0].ravel())
        return lines + bad_legend(np.concatenate(drawn))

    return Picture(draw)


def matrix_lines(m: np.ndarray) -> list[Text]:
    """The n x n matrix, shaded, with each row's sum at its end and the column sums below."""
    n, top = m.shape[0], finite_top(m)
    right = CELL - 1  # a value ends one character before its cell does: headings and column sums end there too
    rows = [line("          ", *(f"to {k}".rjust(right).ljust(CELL) for k in range(n)), " row sum")]
    for j in range(n):
        cells = []
        for k in range(n):
            cells += [shade_cell(float(m[j, k]) / top, 1), f" {m[j, k]:.3f}".rjust(right - 1).ljust(CELL - 1)]
        rows.append(line(f"from {j:<5}", *cells, f" {m[j].sum():.4f}"))
    rows.append(line("col sum   ", *(f"{s:.4f}".rjust(right).ljust(CELL) for s in m.sum(axis=0))))
    rows.append(caption(f"shades: a quarter of the largest entry ({top:.3f}) each"))
    return rows


def weight_lines(label: str, weights: np.ndarray) -> list[Text]:
    """One bar per stream: pre in (0, 1] reads how much of the stream the block takes in, post in
    (0, 2) how strongly the block's output is written back into it."""
    top = 2.0 if label.strip() == "post" else 1.0
    return [line(f"{label} stream {k}  ", bar_right(float(w), top, BAR).ljust(BAR), f" {w:.3f}")
            for k, w in enumerate(weights)] + [caption(f"{label.strip()}: a full bar is {top:g} ("
                                                       + ("how much of the stream the block reads: 0 to 1)" if top == 1
                                                          else "how strongly the block's output is written back: "
                                                               "0 to 2)"))]


def stream_lines(streams: np.ndarray, width: int, first: int = 0) -> list[Text]:
    """Each stream's RMS over the hidden size at every position (the last positions when they do
    not fit), as bars up to the largest."""
    rms = np.sqrt(np.mean(np.square(streams.astype(np.float64)), axis=-1))  # [T, n]
    room = max(width - 16, 8)
    shown_rms = rms[-room:]
    top = finite_top(shown_rms)
    lines = [caption(f"RMS of each stream at positions {first + len(rms) - len(shown_rms)}..{first + len(rms) - 1} "
                     f"(█ = {top:.3g})")]
    for k in range(rms.shape[1]):
        bars = "".join(bar_up(float(v), top) for v in shown_rms[:, k])
        lines.append(line(f"stream {k:<3} ", bars))
    return lines
