"""The pictures `stepper run --show` draws for a model: those of its family's tensors. MLA's
(views.sinks.Pictures: attention heat maps, routing, histograms, scale grids) unless the family
draws its own (DeepSeek-V4's hyper-connection, reach and routing pictures: views.v4_pictures)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from rich.console import Console

from stepper.seams.trace import Event, Sink
from stepper.session import Plan
from stepper.untrusted import shown
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


KDA = ((*PICTURES, "state"), lambda console, plan, kinds, keep: KdaPictures(
    console, plan.config, kinds, plan.weights, plan.tokens, lambda e: keep(e.name)))
OWN = {  # a family's model_type -> its pictures, and the sink drawing them
    "deepseek_v4": (V4_PICTURES, lambda console, plan, kinds, keep: V4Pictures(
        console, plan.config, kinds, plan.prompt_len, lambda e: keep(e.name), plan.tokens)),
    "kimi_linear": KDA,
    "bailing_hybrid": KDA,  # Ling 3's KDA layers
}


def every_picture() -> tuple[str, ...]:
    """Every picture any family draws."""
    return tuple(dict.fromkeys([*PICTURES, *(kind for kinds, _ in OWN.values() for kind in kinds)]))


def pictures_of(cfg) -> tuple[str, ...]:
    own = OWN.get(cfg.model_type)
    return PICTURES if own is None else own[0]


def undrawable(kind: str, cfg) -> str | None:
    """Why this model has nothing a picture of its family draws (None when it has): no router for
    routing, no FP8 block scales for scales."""
    if kind == "routing" and not any(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers)):
        return f"model {shown(cfg.name)} has no router: every layer's MLP is dense"
    if kind == "scales" and getattr(cfg, "quantization", None) is None:  # FP8 blocks (names.storage_dtype)
        return f"model {shown(cfg.name)} stores no FP8 weights, so there is no block-scale grid to draw"
    return None


def drawn_pictures(cfg) -> tuple[str, ...]:
    """The pictures this model draws: its family's, but those it has nothing for (`--show` takes these)."""
    return tuple(kind for kind in pictures_of(cfg) if undrawable(kind, cfg) is None)


def picture_sink(console: Console, plan: Plan, kinds: set[str], keep: Keep) -> Sink:
    own = OWN.get(plan.config.model_type)
    if own is not None:
        return own[1](console, plan, kinds, keep)
    return Pictures(console, plan.config, kinds, plan.weights, plan.tokens, lambda e: keep(e.name))
