"""A run recorded: planned (stepper.planning.plan_run: its auto choices, its patterns checked
against the names it will emit, its memory estimated with what it keeps), its patches applied, the
tensors asked for kept. `stepper diff` runs its two sides with it, and so does the Python API
(`stepper.run`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import numpy as np

from stepper.errors import StepperError
from stepper.planning import COMMAND_LINE, Wording, plan_run
from stepper.planning.names import check_patterns
from stepper.seams.patching import Patches
from stepper.seams.trace import Event, Filter, Sink, matches
from stepper.session import Plan, RunResult, RunSpec
from stepper.tensors.tensor import held
from stepper.weights.source import WeightSource


@dataclass
class Recorded:
    plan: Plan
    result: RunResult
    events: dict[str, Event]  # the kept tensors, in execution order
    names: list[str]  # every name the run emits, in execution order (the plan's: a tensor made only when a sink
    # looks, every state of a delta rule, is not made unless kept, and is named all the same)
    patched: dict[str, list[str]]  # each patch pattern -> the names it applied to
    said: tuple[str, ...] = ()  # the plan's lines: its auto choices and notes, as `stepper run` prints them


class Keeper:
    """Sink keeping the events it is given, by name."""

    def __init__(self) -> None:
        self.events: dict[str, Event] = {}

    def __call__(self, event: Event) -> None:
        self.events[event.name] = event


def record(spec: RunSpec, keep: Sequence[str] | Callable[[str], bool] | None = None, patches: Patches = (),
           swapped: Callable[[], AbstractContextManager] = nullcontext, wording: Wording = COMMAND_LINE,
           weights: WeightSource | None = None, chunk: int | None = 0,
           forewarn: Callable[[str], None] = lambda line: None) -> Recorded:
    """Run `spec` keeping the tensors matching `keep` (globs, or a function of the name; None:
    every one), with `patches` applied (each must match a name of the run), inside `swapped()`
    (entered once the run is planned: e.g. lesson files' exercises swapped in); `weights`: in
    place of the spec's model (the same config, e.g. some tensors changed); `chunk`: the
    prefill's positions per chunk, None auto (stepper.planning.plan_run); `forewarn`: given the
    plan's line saying the run is long, if it is, before the run starts."""
    lower = f"{wording.keep} (fewer tensors)"

    def kept_of(plan: Plan, names: list[str]) -> list[str]:
        return [n for n in names if wanted(keep, n)]

    planned = plan_run(spec, kept_of, lower, chunk, weights, wording, looked=kept_of)  # looks at what it keeps
    keeps = kept_by(wording.keep, keep, planned.names)
    patcher = planned.patcher(patches)
    planned.check_fits([n for n in planned.names if keeps(n)], lower)
    if planned.long:
        forewarn(planned.long)
    keeper = Keeper()
    sinks: list[Sink] = [*patcher, keeper if keep is None else Filter(lambda e: keeps(e.name), [keeper])]
    with swapped():
        result = planned.execute(sinks)
    for event in keeper.events.values():
        if not held(event.array):
            event.array.keep_when_read()  # a chunked run's: one replay makes them all, never one per read
    return Recorded(planned.plan, result, keeper.events, list(planned.names), patcher[0].applied if patcher else {},
                    planned.said)


def wanted(keep: Sequence[str] | Callable[[str], bool] | None, name: str) -> bool:
    """Whether `keep` keeps a name (unchecked: for an estimate before the names are final)."""
    return keep is None or bool(keep(name) if callable(keep) else matches(name, keep))


def kept_by(option: str, keep: Sequence[str] | Callable[[str], bool] | None, names: list[str]) -> Callable[[str], bool]:
    """Whether a name is kept: every one (None), those a glob matches, or those the function says
    (one that keeps none of the run's names is refused, as a glob that matches none is)."""
    if callable(keep) and not any(keep(name) for name in names):
        raise StepperError(f"{option} {getattr(keep, '__qualname__', type(keep).__name__)}: keeps no tensor of "
                           f"this run (it is given full names, e.g. {names[-1]})")
    if keep is not None and not callable(keep):
        check_patterns(option, keep, names)
    return lambda name: wanted(keep, name)


def tensors(recorded: Recorded) -> dict[str, np.ndarray]:
    """The kept tensors as arrays (a chunked run's made by one replay of its chunks)."""
    return {name: np.asarray(e.array) for name, e in recorded.events.items()}
