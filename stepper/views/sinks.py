"""The sinks that show a run: a Rich row per tensor (colour or plain), JSON Lines, pictures after
the tensors they belong to (`--show`), and progress bars for long loops.

A row reads, on three lines: the name with its named shape and dtype; its statistics with a
histogram sparkline; its corner values (the first values of the first row, the last of the last).
"""

from __future__ import annotations

import json
import time
from typing import IO, Any

import numpy as np
from rich.console import Console
from rich.text import Text

from stepper import catalog
from stepper.config import Config
from stepper.trace import Event
from stepper.views import pictures, summary
from stepper.views.summary import finite_or_none, number
from stepper.weights.names import storage_dtype


class TensorRows:
    """Sink printing one row per tensor to a Rich console (colour unless the console is plain)."""

    def __init__(self, console: Console, cfg: Config):
        self.console = console
        self.cfg = cfg
        self.catalog = catalog.load()
        self.scope: tuple[str | None, int | None] | None = None

    def __call__(self, event: Event) -> None:
        scope = (event.phase, event.layer)
        if scope != self.scope:
            self.scope = scope
            self.console.rule(self.heading(event), style="dim", align="left")
        self.console.print(self.render(event), soft_wrap=True)

    def heading(self, event: Event) -> str:
        parts = [] if event.phase is None else [event.phase]
        if event.layer is None:
            parts.append("model")
        else:
            kind = "MoE" if self.cfg.is_moe_layer(event.layer) else "dense"
            parts.append(f"layer {event.layer} ({kind})")
        return " · ".join(parts)

    def render(self, event: Event) -> Text:
        array = event.array
        dims = self.catalog.dims(event.key, array.shape, self.cfg)
        st = summary.stats(array)
        counts, _, _ = summary.histogram(array, known=st)
        first, last = summary.corners(array)

        text = Text()
        phase, _, rest = event.name.rpartition(event.key)
        text.append(phase, style="dim")
        text.append(event.key, style="bold cyan")
        text.append(rest)
        text.append(f"  {catalog.format_shape(dims)}", style="yellow")
        text.append(f"  {array.dtype}\n", style="dim")

        text.append("    ")
        for label, value in (
            ("min", st.min), ("max", st.max), ("mean", st.mean), ("std", st.std),
            ("absmax", st.absmax), ("sum", st.sum),
        ):
            text.append(f"{label} ", style="dim")
            text.append(f"{number(value)}  ")
        for label, value in (("nan", st.nan), ("inf", st.inf)):
            text.append(f"{label} ", style="dim")
            text.append(f"{value}  ", style="bold red" if value else "")
        text.append(summary.sparkline(counts), style="green")
        text.append("\n    ")
        text.append("corners ", style="dim")
        text.append(" ".join(number(v) for v in first) + " … " + " ".join(number(v) for v in last))
        return text


class JsonLines:
    """Sink writing one JSON object per tensor, one per line (non-finite numbers become null)."""

    def __init__(self, stream: IO[str], cfg: Config):
        self.stream = stream
        self.cfg = cfg
        self.catalog = catalog.load()

    def __call__(self, event: Event) -> None:
        self.stream.write(json.dumps(self.record(event), allow_nan=False) + "\n")
        self.stream.flush()

    def record(self, event: Event) -> dict[str, Any]:
        array = event.array
        dims = self.catalog.dims(event.key, array.shape, self.cfg)
        st = summary.stats(array)
        counts, lo, hi = summary.histogram(array, known=st)
        first, last = summary.corners(array)
        return {
            "name": event.name,
            "key": event.key,
            "layer": event.layer,
            "phase": event.phase,
            "shape": list(array.shape),
            "dims": [{"symbol": d.symbol, "label": d.label, "size": d.size} for d in dims],
            "named_shape": catalog.format_shape(dims),
            "dtype": str(array.dtype),
            "stats": {k: finite_or_none(v) for k, v in st.as_dict().items()},
            "histogram": {"counts": counts, "min": finite_or_none(lo), "max": finite_or_none(hi)},
            "corners": {"first": [finite_or_none(v) for v in first], "last": [finite_or_none(v) for v in last]},
        }


PICTURES = ("attention", "routing", "hist", "scales")
ATTENTION_WEIGHTS = ("q_a_proj", "q_b_proj", "q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")


class Pictures:
    """Sink drawing pictures after the tensors they belong to (`stepper run --show`).

    attention: each layer's attention weights as per-head heat maps; routing: the router's token x
    expert map and per-expert load; hist: a histogram of every shown tensor; scales: the FP8 block
    scales of each shown layer's attention projections.
    """

    def __init__(self, console: Console, cfg: Config, kinds: set[str], weights=None):
        self.console = console
        self.cfg = cfg
        self.kinds = kinds
        self.weights = weights
        self.topk_idx: np.ndarray | None = None

    def __call__(self, event: Event) -> None:
        if "hist" in self.kinds:
            self.console.print(pictures.histogram(event.array, title=event.name))
        if "attention" in self.kinds and event.key == "self_attn.attn_weights":
            self.console.print(pictures.attention_heatmap(event.array, title=event.name))
        if event.key == "mlp.gate.topk_idx":
            self.topk_idx = event.array
        if "routing" in self.kinds and event.key == "mlp.gate.topk_weight" and self.topk_idx is not None:
            self.console.print(pictures.routing_map(self.topk_idx, event.array, self.cfg.n_routed_experts))
        if "scales" in self.kinds and event.key == "hidden_states" and hasattr(self.weights, "stored"):
            self.draw_scales(event.layer)

    def draw_scales(self, layer: int) -> None:
        for short in ATTENTION_WEIGHTS:
            name = f"model.layers.{layer}.self_attn.{short}.weight"
            if not self.weights.has(name) or storage_dtype(self.cfg, name) != "F8_E4M3":
                continue
            stored = self.weights.stored(name)
            if stored.scale_inv is not None:
                self.console.print(pictures.scale_grid(np.asarray(stored.scale_inv, dtype=np.float32), title=name))


class ProgressBars:
    """Sink showing long loops (experts, layers) as transient progress bars on a terminal.

    A bar appears only once its task has run for a second, and never when stderr is not a
    terminal, so piped output stays clean.
    """

    DELAY = 1.0

    def __init__(self, console: Console):
        from rich.progress import Progress

        self.console = console
        self.bars = Progress(console=console, transient=True)
        self.tasks: dict[str, tuple[float, int | None]] = {}

    def __call__(self, event: Event) -> None:
        """Tensor events are for other sinks."""

    def progress(self, task: str, done: int, total: int) -> None:
        if not self.console.is_terminal:
            return
        now = time.monotonic()
        started, bar = self.tasks.setdefault(task, (now, None))
        if bar is None and now - started >= self.DELAY and done < total:
            if not self.bars.live.is_started:
                self.bars.start()
            bar = self.bars.add_task(task, total=total)
            self.tasks[task] = (started, bar)
        if bar is not None:
            self.bars.update(bar, completed=done)
        if done >= total:
            if bar is not None:
                self.bars.remove_task(bar)
            del self.tasks[task]
            if not self.tasks and self.bars.live.is_started:
                self.bars.stop()
