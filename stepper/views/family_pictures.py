"""The pictures `stepper run --show` draws for a model: those of its family's tensors. MLA's
(views.sinks.Pictures: attention heat maps, routing, histograms, scale grids) unless the family
draws its own (DeepSeek-V4's hyper-connection and reach pictures: views.v4_pictures)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from rich.console import Console

from stepper.seams.trace import Event, Sink
from stepper.session import Plan
from stepper.views import kda_state
from stepper.views.sinks import PICTURES, Pictures, print_picture
from stepper.views.v4_pictures import V4_PICTURES, V4Pictures

Keep = Callable[[str], bool]  # whether a name is shown (--only)


class KdaPictures(Pictures):
    """MLA's pictures, and after a KDA layer's state (`self_attn.state`, shown) the state per head,
    one head's heat map, the writes and the decays (views.kda_state), as the debugger's `s state`."""

    WITH_STATE = ("self_attn.delta", "self_attn.forget_gate")  # kept from the layer's events before its state

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.before: dict[str, np.ndarray] = {}

    def __call__(self, event: Event) -> None:
        super().__call__(event)
        if "state" not in self.kinds:
            return
        if event.key in self.WITH_STATE:
            self.before[event.key] = event.array
        elif event.key == "self_attn.state" and self.is_shown(event):
            for picture in kda_state.state_pictures(event.array, event.name, *map(self.before.get, self.WITH_STATE)):
                print_picture(self.console, picture)


OWN = {  # a family's model_type -> its pictures, and the sink drawing them
    "deepseek_v4": (V4_PICTURES, lambda console, plan, kinds, keep: V4Pictures(
        console, plan.config, kinds, plan.prompt_len, lambda e: keep(e.name))),
    "kimi_linear": ((*PICTURES, "state"), lambda console, plan, kinds, keep: KdaPictures(
        console, plan.config, kinds, plan.weights, plan.tokens, lambda e: keep(e.name))),
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
