"""`--show scales`: each FP8 weight's block-scale grid (`scale_grid`: log2 of each 128 x 128 block's
scale as a heat map), drawn where the layer uses the weight.

A layer's attention weights (q_a_proj .. o_proj, the indexer's) are drawn at its first shown
attention tensor (`self_attn.*`); its MLP's at its first shown MLP tensor (`mlp.*`, `mlp_output`):
a dense layer's gate, up and down projections, or a MoE layer's shared experts; a MoE layer's
routed experts at its first shown MLP tensor once the router has chosen (at or after topk_idx).
Of the routed experts only those the tokens chose, as the router's topk_idx says, and
of those only the EXPERT_GRIDS chosen by the most tokens (a line names how many were chosen):
Kimi K2 has 384 of them, three weights each. A weight's grid is drawn once per run (the weights
are the same at every step), the chosen experts' once per layer and step (each step chooses anew).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from rich.console import RenderableType
from rich.text import Text

from stepper.config import Config
from stepper.seams.trace import Event
from stepper.views.pictures import (
    ALARM,
    BAD,
    DIM,
    MAX_COLS,
    MAX_ROWS,
    SHADES,
    Picture,
    caption,
    heading,
    heat,
    labelled_rows,
    legend_shades,
    line,
    pool_max,
    pooled_note,
    sci,
    shade_cell,
    ticks,
)
from stepper.weights.names import layer_prefix, layer_shapes, storage_dtype

EXPERT_GRIDS = 2  # routed experts whose grids are drawn per layer and step
PARTS = (("attention", "self_attn."), ("mlp", "mlp"))  # a tensor's part of the layer, by its key's start


def part_of(key: str) -> str | None:
    """'attention' or 'mlp': the part of the layer a tensor (by catalog key) belongs to."""
    return next((part for part, start in PARTS if key.startswith(start)), None)


def chosen_experts(topk_idx: np.ndarray, limit: int) -> tuple[list[int], int]:
    """The `limit` experts chosen by the most tokens (ties: the lower index first), and how many
    experts were chosen at all."""
    experts, counts = np.unique(np.asarray(topk_idx).reshape(-1), return_counts=True)
    order = sorted(range(len(experts)), key=lambda i: (-counts[i], experts[i]))
    return [int(experts[i]) for i in order[:limit]], len(experts)


class ScaleGrids:
    """Draws the grids of each shown layer's weights, part by part, through `draw(picture)`."""

    def __init__(self, cfg: Config, weights, draw: Callable[[RenderableType], None]):
        self.cfg = cfg
        self.weights = weights
        self.draw = draw
        self.drawn: set[tuple[str | None, int, str]] = set()  # (phase: the experts' only, layer, part)
        self.topk: dict[tuple[str | None, int], np.ndarray] = {}  # the router's choice, per step and layer

    def seen(self, event: Event) -> None:
        """Every event, shown or not: the router's choice is kept for its layer's MLP."""
        if event.key == "mlp.gate.topk_idx" and event.layer is not None:
            self.topk[event.phase, event.layer] = event.array

    def draw_for(self, event: Event) -> None:
        """A shown event: the grids of its part of the layer, the first time that part shows."""
        part = part_of(event.key) if event.layer is not None else None
        if part == "attention":
            self.once((None, event.layer, part), lambda: self.weights_of(event.layer, ".self_attn."))
        elif part == "mlp":
            if self.cfg.is_moe_layer(event.layer) and (event.phase, event.layer) in self.topk:
                self.once((event.phase, event.layer, "experts"), lambda: self.experts(event.phase, event.layer))
            self.once((None, event.layer, part), lambda: self.weights_of(event.layer, ".mlp.", but=".mlp.experts."))

    def once(self, scope: tuple[str | None, int, str], names: Callable[[], list[str]]) -> None:
        if scope not in self.drawn:
            self.drawn.add(scope)
            for name in names():
                self.grid(name)

    def weights_of(self, layer: int, within: str, but: str | None = None) -> list[str]:
        """The layer's FP8 weights whose names hold `within` (and not `but`), in the model's order."""
        return [name for name in layer_shapes(self.cfg, layer) if within in name and not (but and but in name)
                and self.fp8(name)]

    def experts(self, phase: str | None, layer: int) -> list[str]:
        """The chosen routed experts' FP8 weights, after a line saying which are drawn (if any is FP8)."""
        drawn, chosen = chosen_experts(self.topk[phase, layer], EXPERT_GRIDS)
        prefix = f"{layer_prefix(layer)}mlp.experts."
        names = [f"{prefix}{e}.{proj}_proj.weight" for e in drawn for proj in ("gate", "up", "down")
                 if self.fp8(f"{prefix}{e}.{proj}_proj.weight")]
        if names:  # INT4 or BF16 experts have no grid
            self.draw(Text(f"layer {layer}: {chosen} of {self.cfg.n_routed_experts} routed experts chosen; grids of "
                           f"the {len(drawn)} chosen most: {', '.join(map(str, drawn))}", style="dim"))
        return names

    def fp8(self, name: str) -> bool:
        return self.weights.has(name) and storage_dtype(self.cfg, name) == "F8_E4M3"

    def grid(self, name: str) -> None:
        stored = self.weights.stored(name)
        if stored.scale_inv is not None:
            self.draw(scale_grid(np.asarray(stored.scale_inv, dtype=np.float32), title=name))


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
