"""The pictures `stepper run --show` draws for a model: those of its family's tensors. MLA's
(views.sinks.Pictures: attention heat maps, routing, histograms, scale grids) unless the family
draws its own (DeepSeek-V4's hyper-connection and reach pictures: views.v4_pictures)."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console

from stepper.seams.trace import Sink
from stepper.session import Plan
from stepper.views.sinks import PICTURES, Pictures
from stepper.views.v4_pictures import V4_PICTURES, V4Pictures

Keep = Callable[[str], bool]  # whether a name is shown (--only)

OWN = {  # a family's model_type -> its pictures, and the sink drawing them
    "deepseek_v4": (V4_PICTURES, lambda console, plan, kinds, keep: V4Pictures(
        console, plan.config, kinds, plan.prompt_len, lambda e: keep(e.name))),
}


def every_picture() -> tuple[str, ...]:
    """Every picture any family draws."""
    return tuple(dict.fromkeys([*PICTURES, *(kind for kinds, _ in OWN.values() for kind in kinds)]))


def pictures_of(cfg) -> tuple[str, ...]:
    own = OWN.get(cfg.model_type)
    return PICTURES if own is None else own[0]


def picture_sink(console: Console, plan: Plan, kinds: set[str], keep: Keep) -> Sink:
    own = OWN.get(plan.config.model_type)
    if own is not None:
        return own[1](console, plan, kinds, keep)
    return Pictures(console, plan.config, kinds, plan.weights, plan.tokens, lambda e: keep(e.name))
