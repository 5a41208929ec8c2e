"""`--show scales`: each FP8 weight's block-scale grid, drawn where the layer uses the weight.

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

from collections.abc import Callable

import numpy as np
from rich.console import RenderableType
from rich.text import Text

from stepper.config import Config
from stepper.seams.trace import Event
from stepper.views import pictures
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
            self.draw(pictures.scale_grid(np.asarray(stored.scale_inv, dtype=np.float32), title=name))
