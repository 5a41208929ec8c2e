"""The pictures of a DeepSeek-V4 run, drawn after their tensors (`stepper run --show hc,reach`):

- hc: after each hyper-connection's comb matrix (`hc_attn.comb`, `hc_ffn.comb`), the matrix at the
  last position with the pre and post weights and the streams it mixes (views.hyper_connections);
- reach: after a compressed layer's choice of entries (`attn.chosen`), what the last query sees:
  the window, the entries kept and dropped (views.compressed_attention_picture);
- routing: after a router's weights (`ffn.gate.weights`), its choice (`ffn.gate.hash_idx` or
  `topk_idx`) as MLA's routing map draws it, under a line saying which way the layer routes;
- hist: a histogram of every shown tensor, as MLA's runs draw it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from rich.console import Console, Group
from rich.text import Text

from stepper.seams.trace import Event
from stepper.untrusted import shown
from stepper.views import histogram_picture
from stepper.views.compressed_attention_picture import compressed_attention_map
from stepper.views.hyper_connections import hyper_connection_map
from stepper.views.routing_map import routing_map
from stepper.views.sinks import print_picture, token_rows

V4_PICTURES = ("hc", "reach", "routing", "hist")
CHOICES = ("ffn.gate.hash_idx", "ffn.gate.topk_idx")  # a hash-routed layer's choice, a score-routed one's


class V4Pictures:
    """Sink drawing the chosen pictures; it keeps the tensors a picture needs from earlier events."""

    def __init__(self, console: Console, cfg, kinds: set[str], prompt_len: int,
                 shows: Callable[[Event], bool] = lambda event: True, tokens=None):
        self.console, self.cfg, self.kinds, self.prompt_len = console, cfg, kinds, prompt_len
        self.shows = shows  # whether a tensor is shown (--only): its picture is drawn only then
        self.tokens = tokens  # a text prompt's tokens, the routing map's row labels
        self.seen: dict[str, np.ndarray] = {}  # the last pre, post and input streams of each site
        self.chosen: tuple[Event, bool] | None = None  # the router's last choice, and whether it was shown

    def __call__(self, event: Event) -> None:
        key, array = event.key, np.asarray(event.array)
        if key in ("streams", "attn_streams", "hc_attn.pre", "hc_attn.post", "hc_ffn.pre", "hc_ffn.post"):
            self.seen[key] = array
        if key in CHOICES:
            self.chosen = (event, self.shows(event))
        if key == "ffn.gate.weights" and "routing" in self.kinds and self.chosen is not None:
            self.draw_routing(event)
        if not self.shows(event):
            return
        if "hist" in self.kinds and event.array.size:
            print_picture(self.console, histogram_picture.histogram(event.array, title=event.name))
        if key in ("hc_attn.comb", "hc_ffn.comb") and "hc" in self.kinds:
            site = key.removesuffix(".comb")
            streams = self.seen.get("streams" if site == "hc_attn" else "attn_streams")
            first = self.last_position(event.phase, array.shape[1]) - (array.shape[1] - 1)
            print_picture(self.console, hyper_connection_map(array, self.seen.get(f"{site}.pre"),
                                                             self.seen.get(f"{site}.post"), streams, title=event.name,
                                                             first=first))
        elif key == "attn.chosen" and "reach" in self.kinds and event.layer is not None:
            ratio = self.cfg.compress_ratio(event.layer)
            if ratio:
                position = self.last_position(event.phase, array.shape[1])
                print_picture(self.console, compressed_attention_map(
                    position, self.cfg.sliding_window, ratio, array[0, -1],
                    title=f"{event.name}: the query at position {position}",
                    indexer=self.cfg.layer_kind(event.layer) == "csa"))

    def draw_routing(self, weights: Event) -> None:
        """The layer's choice (the last hash_idx or topk_idx) with these weights, if either is shown."""
        chosen, chosen_shown = self.chosen
        if chosen_shown or self.shows(weights):
            rows = token_rows(self.tokens, weights.phase, len(weights.array))
            print_picture(self.console, routing_picture(chosen.name, chosen.array, weights.array,
                                                        self.cfg.router_experts, rows))

    def last_position(self, phase: str | None, new: int) -> int:
        """The position of a step's last query: the prompt's last, or the prompt length plus k for decode k."""
        if phase is None or phase == "prefill":
            return new - 1
        return self.prompt_len + int(phase.removeprefix("decode"))


def choice_of(cfg, layer: int) -> str:
    """The tensor holding a layer's chosen experts: its hash's, or its scores' top k."""
    return CHOICES[0] if cfg.is_hash_layer(layer) else CHOICES[1]


def routing_picture(name: str, chosen: np.ndarray, weights: np.ndarray, experts: int,
                    labels: list[str] | None = None) -> Group:
    """A layer's router choice `name` (ffn.gate.hash_idx or topk_idx [N, k]) with its weights [N, k]
    as a token x expert map (views.routing_map), under a line saying how the layer chose: by the
    token's id, which no hidden state changes, or by the top k of its scores plus the bias."""
    hashed, k = name.endswith("hash_idx"), np.shape(chosen)[-1]
    how = (f"hash-routed: each token's {k} experts are tid2eid's row for its token id, a fixed table, so a token gets "
           "the same experts in any context, whatever its hidden state; the gate's scores only weigh them" if hashed
           else f"score-routed: each token's top {k} of sqrt(softplus(logits)) + bias, so its hidden state chooses; "
                "the weights are the chosen scores without the bias")
    order = "as tid2eid lists them (no score chose them)" if hashed else "by score + bias (the bias can put a " \
        "smaller weight first)"
    return Group(Text(shown(name), style="bold") + Text(f" · weights: {how}"),
                 routing_map(chosen, weights, experts, labels, order=order))
