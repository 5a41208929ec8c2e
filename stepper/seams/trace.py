"""The one seam between the model and everything that watches it.

Model code writes `k_pe = emit("self_attn.k_pe", k_pe)` at each catalogued point and knows
nothing else. An `Emitter` qualifies the name with its scope (phase, layer) and hands an `Event`
to each sink: the terminal view, a recorder for dumps and fixtures, filters, the step debugger.
emit returns the array the model continues with: the one it was given, or what a sink returned
in its place (an array of the same shape and dtype; the sinks after it see the replacement).
A tensor too large to hold (a long prompt's attention scores) is emitted as a `Tiled`, made a
tile at a time by whoever looks at it, and a chunked prefill's as a `Chunked` (both
`stepper.tensors.tensor.LazyTensor`s); such a tensor cannot be replaced.
An emitter with no sinks does nothing, so silent layers cost nothing.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from stepper.errors import StepperError
from stepper.tensors.tensor import Tensor, held

Sink = Callable[["Event"], "np.ndarray | None"]  # None: the tensor goes on as it was


@dataclass(frozen=True)
class Choice:
    """What a tensor of indices chooses among (Emitter.choice): `count` things (`what`: experts,
    positions, entries), -1 for none where `none`."""

    count: int
    what: str
    none: bool = False

    def problem(self, chosen: np.ndarray) -> str | None:
        """What is wrong with a replaced choice, said after its name (None: every index in
        0..count-1, or -1 where `none`, and no row naming one twice)."""
        bad = chosen[(chosen < (-1 if self.none else 0)) | (chosen >= self.count)]
        if bad.size:
            allowed = f"{self.what} 0..{self.count - 1}" if self.count else f"no {self.what}"
            one = "entry" if self.what == "entries" else self.what.removesuffix("s")
            return f"names {one} {int(bad[0])}; the layer has {allowed}" + (" (-1: none)" if self.none else "")
        ordered = np.sort(chosen, axis=-1)
        if np.any((ordered[..., 1:] == ordered[..., :-1]) & (ordered[..., 1:] >= 0)):
            return f"names one of its {self.what} twice in one row; each row's must differ"
        return None


@dataclass(frozen=True)
class Event:
    """One named tensor as the model produced it.

    `name` is the full name (`decode0.layers.3.self_attn.k_pe`); `key` the catalogue name
    (`self_attn.k_pe`); `layer` and `phase` the scope it came from (None for global tensors or
    a run without decode steps).
    """

    name: str
    key: str
    array: Tensor  # a held array, or a LazyTensor made when read (stepper.tensors.tensor)
    layer: int | None = None
    phase: str | None = None
    patched: bool = False  # a sink before (a --patch) replaced the array the model made
    read: bool = True  # False: shown only (Emitter.shown), the model does not go on with it
    choice: Choice | None = None  # indices into other things (Emitter.choice): what a replacement must name


class Emitter:
    """Callable handed to model code; `layer(i)` and `phase(p)` give scoped children."""

    def __init__(self, sinks: Iterable[Sink] = (), layer: int | None = None, phase: str | None = None,
                 sublayer: int | None = None):
        self.sinks = tuple(sinks)
        self._layer = layer
        self._phase = phase
        self._sublayer = sublayer  # LongCat-Flash's sublayer: keys `sub1.self_attn.q` (catalogue: `self_attn.q`)

    def __call__(self, key: str, array: np.ndarray, choice: Choice | None = None) -> np.ndarray:
        """Show `array` as `key` to every sink; return the array the model continues with."""
        if not self.sinks:
            return array
        key = self._scoped(key)
        event = Event(self._qualify(key), key, array, self._layer, self._phase, choice=choice)
        for sink in self.sinks:
            replacement = sink(event)
            if replacement is not None:
                event = Event(event.name, key, checked_replacement(event, replacement), self._layer,
                              self._phase, patched=True, choice=choice)
        return event.array

    def shown(self, key: str, array: np.ndarray) -> None:
        """Show `array` as `key`, a figure the model does not go on with (how many values were
        clamped, the sink's share, each token's write): no sink may replace it."""
        if not self.sinks:
            return
        key = self._scoped(key)
        event = Event(self._qualify(key), key, array, self._layer, self._phase, read=False)
        for sink in self.sinks:
            if sink(event) is not None:
                raise ValueError(f"{event.name} is shown only; the model does not read it back")

    def choice(self, key: str, chosen: np.ndarray, count: int, what: str, none: bool = False) -> np.ndarray:
        """Show indices into `count` things (`what`: experts, positions, entries; -1 none where
        `none`) as `key`; a replacement (a patch) is checked before the model reads it: each index
        one of the things, none twice in one row.  [..., k] int -> same"""
        choice = Choice(count, what, none)
        result = self(key, chosen, choice)
        problem = None if result is chosen else choice.problem(result)
        if problem:
            raise StepperError(f"patched {self._qualify(self._scoped(key))} {problem}")
        return result

    @property
    def listening(self) -> bool:
        """Whether any sink receives the tensors: without one, an array made only to be shown
        (the whole attention scores of a prefill, in groups of heads otherwise) need not be made."""
        return bool(self.sinks)

    def deliver(self, event: Event) -> None:
        """Hand an event made elsewhere (a chunked prefill's tensor, shown whole) to every sink."""
        for sink in self.sinks:
            replacement = sink(event)
            if replacement is not None:
                checked_replacement(event, replacement)  # refuses: such a tensor is never held

    def wants(self, event: Event) -> bool:
        """Whether some sink would look at an event: a sink with a `wants` method says; others
        look at every event."""
        return any(getattr(sink, "wants", None) is None or sink.wants(event) for sink in self.sinks)

    def wants_key(self, key: str) -> bool:
        """Whether some sink would look at a tensor named `key` in this scope (asked before making
        one too large to make for nothing: every state of a long prompt's delta rule)."""
        return self.listening and self.wants(Event(self._qualify(key), key, np.empty(0, np.float32), self._layer,
                                                   self._phase))

    def to(self, sinks: Iterable[Sink]) -> Emitter:
        """The same scope, other sinks."""
        return Emitter(sinks, self._layer, self._phase, self._sublayer)

    def progress(self, task: str, done: int, total: int) -> None:
        """Report progress of a long loop (experts, layers) to the sinks that show it."""
        for sink in self.sinks:
            report = getattr(sink, "progress", None)
            if report is not None:
                report(task, done, total)

    def layer(self, index: int) -> Emitter:
        return Emitter(self.sinks, index, self._phase)

    def sublayer(self, index: int) -> Emitter:
        return Emitter(self.sinks, self._layer, self._phase, index)

    def phase(self, name: str | None) -> Emitter:
        return Emitter(self.sinks, self._layer, name, self._sublayer)

    def silent(self) -> Emitter:
        return Emitter((), self._layer, self._phase, self._sublayer)

    def _scoped(self, key: str) -> str:
        """The key of a tensor of LongCat-Flash's sublayer k: `subk.` and the key (its own)."""
        return key if self._sublayer is None else f"sub{self._sublayer}.{key}"

    def _qualify(self, key: str) -> str:
        name = key if self._layer is None else f"layers.{self._layer}.{key}"
        return name if self._phase is None else f"{self._phase}.{name}"


def checked_replacement(event: Event, replacement: object) -> np.ndarray:
    """A sink's replacement for a tensor: an array of the tensor's shape and dtype, or an error."""
    old = event.array
    if not held(old):
        raise ValueError(f"{event.name}: {old.dtype}{list(old.shape)} is made {old.made} and never held; "
                         f"it cannot be replaced ({old.whole} holds it whole)")
    if not isinstance(replacement, np.ndarray) or replacement.shape != old.shape or replacement.dtype != old.dtype:
        got = (f"{replacement.dtype}{list(replacement.shape)}" if isinstance(replacement, np.ndarray)
               else type(replacement).__name__)
        raise ValueError(f"{event.name}: a sink returned {got} in place of {old.dtype}{list(old.shape)}")
    return replacement


class Recorder:
    """Sink that keeps every event, in order."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, event: Event) -> None:
        self.events.append(event)

    def tensors(self) -> dict[str, np.ndarray]:
        return {e.name: e.array for e in self.events}


def unphased(name: str) -> str:
    """`decode0.layers.1.output` -> `layers.1.output`; names without a phase are returned as is."""
    head, _, rest = name.partition(".")
    if head == "prefill" or (head.startswith("decode") and head[6:].isdigit()):
        return rest
    return name


def matches(name: str, patterns: Iterable[str]) -> bool:
    """True if a glob matches the full name, the name without its phase, or a dotted tail of it:
    `k_pe` and `self_attn.k_pe` both match `decode0.layers.1.self_attn.k_pe`."""
    short = unphased(name)
    return any(fnmatch.fnmatchcase(n, p) or fnmatch.fnmatchcase(short,
                                                                "*." + p) for p in patterns for n in (name, short))


def did_you_mean(pattern: str, names: Iterable[str]) -> str:
    """"; did you mean A, B?" with the names (or their dotted tails) nearest a pattern; "" if none is near."""
    tails = {tail for name in names for tail in dotted_tails(unphased(name))}
    near = difflib.get_close_matches(pattern.strip("*?"), sorted(tails), n=3, cutoff=0.6)
    return f"; did you mean {', '.join(near)}?" if near else ""


def dotted_tails(name: str) -> list[str]:
    """`layers.1.self_attn.k_pe` -> itself, `self_attn.k_pe`, `k_pe` (no tail starts at a number)."""
    parts = name.split(".")
    return [".".join(parts[i:]) for i in range(len(parts)) if not parts[i].isdigit()]


class Filter:
    """Sink wrapper passing on only the events a predicate accepts."""

    def __init__(self, accept: Callable[[Event], bool], sinks: Iterable[Sink]):
        self.accept = accept
        self.sinks = tuple(sinks)

    def __call__(self, event: Event) -> None:
        if self.accept(event):
            for sink in self.sinks:
                sink(event)

    def wants(self, event: Event) -> bool:
        return self.accept(event) and Emitter(self.sinks).wants(event)

    def progress(self, task: str, done: int, total: int) -> None:
        Emitter(self.sinks).progress(task, done, total)
