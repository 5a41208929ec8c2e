"""A run recorded: its patterns checked against the names it will emit, its memory estimated with
what it keeps, its patches applied, the tensors asked for kept. `stepper diff` runs its two sides
with it, and so does the Python API (`stepper.run`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from stepper.cli.memory import available_bytes, check_fits, choose_attn, needs
from stepper.cli.names import check_patterns, planned_names
from stepper.errors import StepperError
from stepper.lessons import overrides
from stepper.patching import Patcher, Patches
from stepper.session import Plan, RunResult, RunSpec, execute, prepare
from stepper.trace import Event, Filter, Sink, matches
from stepper.weights.source import WeightSource


@dataclass(frozen=True)
class Wording:
    """How the messages name the options: the command line's (`--only`) or the API's keywords."""

    keep: str = "--only"
    patch: str = "--patch"
    options: dict[str, str] = field(default_factory=dict)  # an option the memory estimate names -> its name here


@dataclass
class Recorded:
    plan: Plan
    result: RunResult
    events: dict[str, Event]  # the kept tensors, in execution order
    names: list[str]  # every name the run emitted, in execution order
    patched: dict[str, list[str]]  # each patch pattern -> the names it applied to


class Names:
    """Sink listing the names, in order."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def __call__(self, event: Event) -> None:
        self.names.append(event.name)


class Keeper:
    """Sink keeping the events it is given, by name."""

    def __init__(self) -> None:
        self.events: dict[str, Event] = {}

    def __call__(self, event: Event) -> None:
        self.events[event.name] = event


def record(spec: RunSpec, keep: Sequence[str] | Callable[[str], bool] | None = None, patches: Patches = (),
           use: Iterable[Path] = (), wording: Wording = Wording(), extra: Sequence[Sink] = (), announce=None,
           weights: WeightSource | None = None) -> Recorded:
    """Run `spec` keeping the tensors matching `keep` (globs, or a function of the name; None:
    every one), with `patches` applied (each must match a name of the run) and the `use` files'
    exercises swapped in; `weights`: in place of the spec's model (the same config, e.g. some
    tensors changed)."""
    lower = f"{wording.keep} (fewer tensors)"
    plan, _ = choose_attn(prepare(spec, weights), lambda p: needs(p, [n for n in planned_names(p) if wanted(keep, n)], lower),
                          available_bytes())  # attn auto as the command line chooses it
    names = planned_names(plan)
    keeps = kept_by(wording.keep, keep, names)
    check_patterns(wording.patch, [pattern for pattern, _ in patches], names)
    kept = [n for n in names if keeps(n)]
    check_fits([replace(n, lower=wording.options.get(n.lower, n.lower)) for n in needs(plan, kept, lower)],
               available_bytes())
    patcher, listed, keeper = Patcher(patches, plan.config.n_routed_experts), Names(), Keeper()
    sinks: list[Sink] = [patcher, listed, keeper if keep is None else Filter(lambda e: keeps(e.name), [keeper])]
    with overrides.use(list(use), announce=announce):
        result = execute(plan, [*sinks, *extra])
    return Recorded(plan, result, keeper.events, listed.names, patcher.applied)


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
    return {name: e.array for name, e in recorded.events.items()}
