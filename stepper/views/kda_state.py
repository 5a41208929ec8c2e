"""Pictures of a KDA layer's memory: the state S [K, Kv] of each head, what each token wrote into it
and how fast each key channel forgets. Draws arrays it is given (stepper.model.kda emits them);
no model math beyond summaries.

- `state_statistics`: per head, the state's norm, its largest entry, how much of its energy the
  first singular direction holds, and its rank at 1% of the largest singular value.
- `state_heatmap`: one head's S as a heat map of |S| (rows: key channels, columns: value
  channels); the caption says how many entries are negative.
- `write_norms`: per head a bar per token of ||delta_t||, how much that token changed the memory.
- `decay_per_channel`: per head and key channel the mean decay factor exp(g) over the tokens, and
  the half-life in tokens it gives, -ln 2 / mean(g).
"""

from __future__ import annotations

import math

import numpy as np
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from stepper.views.pictures import (
    Picture,
    bad_legend,
    bar_up,
    caption,
    finite_top,
    heading,
    legend_shades,
    line,
    pool_max,
    pooled_note,
    shade_cell,
)
from stepper.views.summary import number

ENERGY_RANK = 0.01  # a singular value counts toward the rank when at least this fraction of the largest
STATISTICS_NOTE = ("σ₁² share: how much of S's energy (the sum of its squared singular values) its first singular "
                   "direction holds; rank@1%: how many singular values reach 1% of the largest. Each token writes a "
                   "rank-one change (a key times its delta) into a decayed S, so the rank is at most the tokens "
                   "written, and at most min(K, Kv).")


def per_head(state: np.ndarray) -> np.ndarray:
    """[B, Hk, K, Kv] or [Hk, K, Kv] -> [Hk, K, Kv] (batch 0)."""
    state = np.asarray(state, dtype=np.float64)
    return state[0] if state.ndim == 4 else state


def state_statistics(state: np.ndarray, title: str = "") -> RenderableType:
    """A table, one row per head: ||S||_F, max |S|, the first singular direction's share of the
    energy (sigma_1^2 / sum sigma^2) and the rank at 1% of sigma_1."""
    heads = per_head(state)
    table = Table(title=title or None, title_justify="left", box=None, padding=(0, 2))
    for column in ("head", "‖S‖", "max |S|", "σ₁² share", "rank@1%"):
        table.add_column(column, justify="right")
    for h, S in enumerate(heads):
        table.add_row(str(h), *head_figures(S))
    return Group(table, Text(STATISTICS_NOTE, style="dim"))  # the note wraps at the console's width, not the table's


def head_figures(S: np.ndarray) -> tuple[str, str, str, str]:
    """One head's ||S||_F, max |S|, sigma_1^2 share and rank@1%; a state holding NaN or infinities
    has no singular values: its count of them instead."""
    bad = int(np.size(S) - np.count_nonzero(np.isfinite(S)))
    if bad:
        return number(float(np.sqrt(np.sum(S**2)))), number(float(np.abs(S).max())), f"{bad} NaN/Inf", "—"
    sigma = np.linalg.svd(S, compute_uv=False)  # [min(K, Kv)]
    energy = float(np.sum(sigma**2))
    share = float(sigma[0] ** 2 / energy) if energy > 0 else 0.0
    rank = int(np.sum(sigma >= ENERGY_RANK * sigma[0])) if sigma[0] > 0 else 0
    return number(float(np.sqrt(energy))), number(float(np.abs(S).max())), f"{share:.2f}", str(rank)


def state_heatmap(S: np.ndarray, title: str = "", rows: int = 24, cols: int = 48) -> RenderableType:
    """One head's state [K, Kv] as a heat map of |S|: key channels down, value channels across, each
    cell's shade its |value| as a fraction of the largest (max-pooled when S is larger than the grid)."""
    S = np.asarray(S, dtype=np.float64)
    if S.ndim != 2 or min(S.shape) == 0:
        raise ValueError(f"a state heat map needs one head's [K, Kv] state, got shape {list(S.shape)}")
    pooled, rb, cb = pool_max(np.abs(S), rows, cols)
    top = finite_top(pooled)
    negative = int(np.sum(S < 0))

    def draw(width: int) -> list[Text]:
        cell = 2 if pooled.shape[1] * 2 + 6 <= width else 1
        out = heading(title)
        for r, row in enumerate(pooled):
            parts = [f"{r * rb:>4}  "] + [shade_cell(v / top, cell) for v in row]
            out.append(line(*parts))
        out.append(line("      ", *legend_shades(), wrap=True))
        out += bad_legend(pooled)
        note = (f"|S| by key channel (down) × value channel (across); max |S| {number(float(pooled.max()))}; "
                f"{negative} of {S.size} negative")
        if (rb, cb) != (1, 1):
            note += "; " + pooled_note("|S|", (rb, cb), S.shape, pooled.shape, ("rows", "cols"))
        out.append(caption(note))
        return out

    return Picture(draw)


def write_norms(delta: np.ndarray, title: str = "", max_tokens: int = 60) -> RenderableType:
    """||delta_t|| per head and token [B, H, T, V] as a row of bars per head, each scaled to the
    largest write of all heads; the last `max_tokens` tokens when there are more."""
    norms = np.linalg.norm(np.asarray(delta, dtype=np.float64)[0], axis=-1)  # [H, T]
    T = norms.shape[1]
    first = max(0, T - max_tokens)
    shown_norms = norms[:, first:]
    top = finite_top(shown_norms)

    def draw(width: int) -> list[Text]:
        out = heading(title)
        for h, row in enumerate(shown_norms):
            bars = "".join(bar_up(float(v), top) for v in row)
            out.append(line(f"head {h:>2}  ", bars, f"  max {number(float(norms[h].max()))}"))
        tallest = number(float(shown_norms.max(initial=0.0)))  # NaN where a write is: said, not scaled to
        note = f"‖delta_t‖ per token (tallest bar {tallest}), tokens {first}..{T - 1}"
        out.append(caption(note + (f"; {first} earlier tokens not shown" if first else "")))
        return out + bad_legend(shown_norms)

    return Picture(draw)


def decay_per_channel(forget_gate: np.ndarray, title: str = "") -> RenderableType:
    """The mean decay factor exp(g) per head and key channel over the tokens [B, H, T, K], drawn as
    bars (a tall bar: the channel keeps what it holds), with each head's fastest and slowest half-life."""
    g = np.asarray(forget_gate, dtype=np.float64)[0]  # [H, T, K]
    mean_g = g.mean(axis=1)  # [Hk, K]
    factor = np.exp(mean_g)  # [Hk, K] in (0, 1]

    def draw(width: int) -> list[Text]:
        out = heading(title)
        for h in range(factor.shape[0]):
            bars = "".join(bar_up(float(v), 1.0) for v in factor[h])
            fast, slow = half_life(mean_g[h].min()), half_life(mean_g[h].max())
            out.append(line(f"head {h:>2}  ", bars, f"  half-life {fast}..{slow} tokens"))
        out.append(caption("mean exp(g) per key channel (a full bar keeps everything); half-life = -ln 2 / mean g"))
        return out

    return Picture(draw)


def half_life(mean_g: float) -> str:
    """Tokens until a channel keeps half of what it held: -ln 2 / g (g <= 0); never, at g = 0."""
    return "∞" if mean_g >= 0 else number(-math.log(2) / mean_g)


def state_pictures(state: np.ndarray, title: str, delta: np.ndarray | None = None,
                   forget_gate: np.ndarray | None = None, head: int = 0) -> list[RenderableType]:
    """What `s state` draws: one head's [K, Kv] state alone; a whole state [B, Hk, K, Kv] as the heads'
    statistics and one head's heat map, then the writes (delta) and decays (forget_gate) given."""
    if np.ndim(state) not in (2, 4):  # asked before reading it: every token's states may be made only when read
        raise ValueError(f"{title}: a state is [B, Hk, K, Kv] or one head's [K, Kv], got shape {list(state.shape)}")
    state = np.asarray(state)
    if state.ndim == 2:
        return [state_heatmap(state, title)]
    drawn = [state_statistics(state, title), state_heatmap(state[0, head], f"{title}[0, {head}]")]
    if delta is not None:
        drawn.append(write_norms(delta, "what each token wrote: ‖delta‖"))
    if forget_gate is not None:
        drawn.append(decay_per_channel(forget_gate, "how fast each key channel forgets"))
    return drawn
