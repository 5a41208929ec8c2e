"""The pictures of a DeepSeek-V4 run, drawn after their tensors (`stepper run --show hc,reach`):

- hc: after each hyper-connection's comb matrix (`hc_attn.comb`, `hc_ffn.comb`), the matrix at the
  last position with the pre and post weights and the streams it mixes (views.hyper_connections);
- reach: after a compressed layer's choice of entries (`attn.chosen`), what the last query sees:
  the window, the entries kept and dropped (views.compressed_attention_picture);
- hist: a histogram of every shown tensor, as MLA's runs draw it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from rich.console import Console

from stepper.seams.trace import Event
from stepper.views import histogram_picture
from stepper.views.compressed_attention_picture import compressed_attention_map
from stepper.views.hyper_connections import hyper_connection_map
from stepper.views.sinks import print_picture

V4_PICTURES = ("hc", "reach", "hist")


class V4Pictures:
    """Sink drawing the chosen pictures; it keeps the tensors a picture needs from earlier events."""

    def __init__(self, console: Console, cfg, kinds: set[str], prompt_len: int,
                 shows: Callable[[Event], bool] = lambda event: True):
        self.console, self.cfg, self.kinds, self.prompt_len = console, cfg, kinds, prompt_len
        self.shows = shows  # whether a tensor is shown (--only): its picture is drawn only then
        self.seen: dict[str, np.ndarray] = {}  # the last pre, post and input streams of each site

    def __call__(self, event: Event) -> None:
        key, array = event.key, np.asarray(event.array)
        if key in ("streams", "attn_streams", "hc_attn.pre", "hc_attn.post", "hc_ffn.pre", "hc_ffn.post"):
            self.seen[key] = array
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

    def last_position(self, phase: str | None, new: int) -> int:
        """The position of a step's last query: the prompt's last, or the prompt length plus k for decode k."""
        if phase is None or phase == "prefill":
            return new - 1
        return self.prompt_len + int(phase.removeprefix("decode"))
