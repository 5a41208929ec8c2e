"""A long prefill in chunks of positions: the step (one layer, or the model) runs on the prompt's
first `chunk` positions, then on the next ones with the cache the first left, and so on, so
memory is the cache and one chunk's tensors, never the whole prompt's. (A prefill of T positions
equals prefills of consecutive chunks with the cache: tests/model/test_cache.py.)

Every named tensor is still shown once, over all T positions, with the figures of the whole
prompt's tensor (a `stepper.tensors.chunked.Chunked`): each chunk's tensors are gathered exactly as they
come (statistics, histogram counts, corners), so no chunk runs twice. A histogram's bins grow with
the range seen so far and merge exactly when it grows (`stepper.tensors.statistics.Lattice`): a
tensor whose range grows to the last chunk (the attention's scores, made a tile at a time, too large
to keep) is binned in the pass that makes it. Reading the values of one (`np.asarray`) replays the
chunks and makes every chunked tensor at once (`Replay`). The scores and weights made a tile at a
time are gathered together, tile by tile, so each tile of scores is made once for both.

A chunk's rows of a tensor over the attended positions S (the attention scores and weights, the
indexer's scores, choices and mask) stop at the chunk's last position; the whole prompt's tensor
holds the masked future there, and so does the shown one (`masked`: the value of each such
tensor, as the layer's code makes it: stepper.families.derive.masked_future). A tensor over the
attended positions alone (the naive path's key and value states, the indexer's keys) is the last
chunk's: the cache of every position.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from stepper import catalog
from stepper.kernels import parallel
from stepper.model.cache import KVCache, LayerCache
from stepper.seams.trace import Emitter, Event
from stepper.tensors.chunked import Chunked
from stepper.tensors.statistics import CORNER, Gather, chunks, corners, gather_held, integral
from stepper.tensors.tensor import Figures, held, mib
from stepper.tensors.tiled import Tiled

# run the prompt's positions `span` with a cache -> the step's result
Step = Callable[[slice, KVCache, Emitter], object]

POSITIONS = ("T", "N", "chunks")  # the dims along which the chunks follow each other (chunks: the delta rule's,
# each prefill chunk a whole number of them: families.family.Family.chunk_multiple)
WIDTHS = ("S", "Ki")  # the dims a chunk's rows have fewer of than the whole prompt's


def in_chunks(step: Step, length: int, chunk: int, cache: KVCache, emit: Emitter,
              masked: Mapping[str, float] | None = None) -> object:
    """Run `step` on the positions [0, length), `chunk` at a time, each named tensor shown once,
    whole; masked: name -> the value a tensor over the attended positions holds at a masked
    future position (families.derive.masked_future). -> what the last chunk's step returns"""
    spans = [slice(start, min(start + chunk, length)) for start in range(0, length, chunk)]
    if len(spans) == 1 or not emit.listening:
        for span in spans:
            result = step(span, cache, emit)
        return result
    return shown(step, spans, cache, emit, Gathered(emit, masked or {}))


def shown(step: Step, spans: list[slice], cache: KVCache, emit: Emitter, gathered: Gathered) -> object:
    """in_chunks of more than one chunk, every tensor gathered chunk by chunk (`gathered`), each
    shown once after the last."""
    before = []  # the cache's lengths before each chunk
    for k, span in enumerate(spans):
        emit.progress("prefill chunks", k, len(spans))
        before.append([layer.length for layer in cache.layers])
        result = step(span, cache, emit.to([gathered]))
        gathered.flush()
    emit.progress("prefill chunks", len(spans), len(spans))
    replay = Replay(step, spans, [layer.first(layer.length) for layer in cache.layers], before, emit)
    parts = list(gathered.parts.values())
    replay.parts = {part.name: part for part in parts if part.axis is not None}
    for part in parts:
        emit.deliver(part.event(replay))
    return result


class Replay:
    """The chunks of the prefill run again, against the cache as it was before each: the `Source`
    of the run's chunked tensors. The tensors a holder keeps (`keep`: a `stepper.run`'s) are made
    together: reading one replays every chunk once and makes all of them, kept, so reading the
    others replays nothing. Any other is made alone when read (a dump writes it and lets it go)."""

    def __init__(self, step: Step, spans: list[slice], final: list[LayerCache], before: list[list[int]], emit: Emitter):
        self.step, self.spans, self.final, self.before, self.emit = step, spans, final, before, emit
        self.parts: dict[str, Part] = {}  # the chunked tensors, by name (set once the prefill has run)
        self.together: set[str] = set()  # the names made together on the first read, and kept
        self.made: dict[str, np.ndarray] = {}  # those, once made

    def run(self, k: int, sinks: list) -> None:
        cache = KVCache(0)
        cache.layers = [layer.first(n) for layer, n in zip(self.final, self.before[k])]
        self.step(self.spans[k], cache, self.emit.to(sinks))

    def keep(self, name: str) -> None:
        self.together.add(name)

    def whole(self, name: str) -> np.ndarray:
        if name in self.made:
            return self.made[name]
        if name not in self.together:
            return self.make([name])[name]
        self.made.update(self.make(sorted(self.together - self.made.keys())))
        return self.made[name]

    @parallel.one_blas_thread()
    def make(self, names: list[str]) -> dict[str, np.ndarray]:
        """These chunked tensors over all positions, each chunk replayed once for all of them
        (BLAS on one thread meanwhile, as in the run)."""
        made: dict[str, list[np.ndarray]] = {name: [] for name in names}

        def keep(event: Event) -> None:
            if event.name in made:
                made[event.name].append(np.asarray(self.parts[event.name].widened(event.array)))

        for k in range(len(self.spans)):
            self.run(k, [keep])
        wholes = {name: np.concatenate(p, axis=self.parts[name].axis) for name, p in made.items()}
        for array in wholes.values():
            array.flags.writeable = False  # one array for every reader
        return wholes

    def cost(self, name: str) -> str:
        chunks = f"the prefill's {len(self.spans)} chunks"
        if name in self.made:
            return "held since a tensor of its run was read (no cost)"
        if name not in self.together:
            return f"reading it replays {chunks} for it alone ({mib(self.parts[name].nbytes)}, not kept)"
        together = [self.parts[n] for n in self.together - self.made.keys()]
        return (f"reading it replays {chunks} once and makes the {len(together)} chunked tensors the run keeps "
                f"({mib(sum(p.nbytes for p in together))}): the next reads cost nothing")


class Gathered:
    """Sink of the chunks' events: each wanted name's `Part`, in the order the names first come.
    Tensors made a tile at a time (`Tiled`) wait for the next event: the attention's scores and
    weights come one after the other, the same tiles, and are gathered together (`flush`), so
    each tile's scores, kept a while by the attention, are made once for both, a block of each
    in turn."""

    def __init__(self, outer: Emitter, masked: Mapping[str, float]):
        self.outer, self.masked = outer, masked
        self.parts: dict[str, Part] = {}
        self.waiting: list[tuple[Part, Tiled]] = []  # tiled tensors of one shape, to gather together

    def __call__(self, event: Event) -> None:
        if event.name not in self.parts:
            if not self.outer.wants(event):
                return
            self.parts[event.name] = Part(event, self.masked)
        part = self.parts[event.name]
        if isinstance(event.array, Tiled) and part.axis is not None:
            if self.waiting and self.waiting[0][1].shape != event.array.shape:
                self.flush()
            self.waiting.append((part, event.array))
            if len(self.waiting) > 1:  # the weights after their scores: gathered now, so the attention's
                self.flush()  # output is made with them (kernels.attention.Softmaxed) before the step goes on
            return
        self.flush()
        part.add(event.array)

    def flush(self) -> None:
        """Gather the waiting tiled tensors, a block of each in turn, on this thread (threads
        sharing them, or processes, ran no faster: docs/performance.md, 12-07)."""
        waiting, self.waiting = self.waiting, []
        for blocks in zip(*(chunks(tiled) for _, tiled in waiting)):
            for (part, _), block in zip(waiting, blocks):
                part.gather.add(block)
        for part, tiled in waiting:
            part.end(tiled)

    def progress(self, task: str, done: int, total: int) -> None:
        self.outer.progress(task, done, total)


class Part:
    """One name's tensor over the chunks: figures gathered chunk by chunk, as the whole tensor's."""

    def __init__(self, event: Event, masked: Mapping[str, float]):
        self.name, self.key, self.layer, self.phase = event.name, event.key, event.layer, event.phase
        entry = catalog.load().entry(event.key)
        dims = entry["dims"] if entry is not None and len(entry["dims"]) == event.array.ndim else []
        self.axis = next((i for i, d in enumerate(dims) if d in POSITIONS), None)  # None: the last chunk's is the whole
        self.width = next((i for i, d in enumerate(dims) if d in WIDTHS), None) if self.axis is not None else None
        if self.width is not None and event.key not in masked:
            raise ValueError(f"{event.key}: no value for the positions past a chunk (families.derive.masked_future)")
        self.pad = masked.get(event.key, 0.0)
        self.dtype, self.shapes, self.latest = event.array.dtype, [], None
        self.gather, self.first, self.last = Gather(integral(self.dtype)), [], []

    def add(self, array: np.ndarray | Tiled) -> None:
        """A chunk's tensor: a held one's figures, merged into the whole tensor's (a tiled one's are
        gathered by `Gathered.flush`); the last chunk's, kept whole, of one without positions."""
        if self.axis is None:
            self.latest = array
            return
        self.gather.merge(gather_held(array))
        self.end(array)

    def end(self, array: np.ndarray | Tiled) -> None:
        """After a chunk's blocks: its corners and shape."""
        first, last = corners(array, CORNER)
        if self.axis == array.ndim - 1:  # rows along the positions ([B, T]): a corner may span chunks
            self.first, self.last = (self.first + first)[:CORNER], (self.last + last)[-CORNER:]
        else:
            self.first, self.last = first if not self.shapes else self.first, last
        self.shapes.append(array.shape)

    @property
    def shape(self) -> tuple[int, ...]:
        shape = list(self.shapes[-1])  # the last chunk's rows are the widest
        shape[self.axis] = sum(s[self.axis] for s in self.shapes)
        return tuple(shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize

    @property
    def padding(self) -> int:
        """Entries of the whole tensor that no chunk has: the masked future past each chunk's rows."""
        return int(np.prod(self.shape)) - sum(int(np.prod(s)) for s in self.shapes)

    def event(self, replay: Replay) -> Event:
        """The whole tensor, as one event: the last chunk's, or a `Chunked` over every chunk."""
        if self.axis is None:
            return Event(self.name, self.key, self.latest, self.layer, self.phase)
        self.gather.add_repeated(float(self.pad), self.padding)
        first = self.first
        if self.width == len(self.shape) - 1:  # the first row, past chunk 0's attended positions
            first = first + [float(self.pad)] * (min(CORNER, self.shape[-1]) - len(first))
        figures = Figures(self.gather.stats(), self.gather.bins.kept(), first, self.last)
        tensor = Chunked(self.name, self.shape, self.dtype, self.axis, len(self.shapes), replay, figures)
        return Event(self.name, self.key, tensor, self.layer, self.phase)

    def widened(self, part: np.ndarray | Tiled) -> np.ndarray | Tiled:
        """A chunk's tensor as the whole tensor has it: its rows widened with the masked future."""
        if self.width is None or part.shape[self.width] == self.shape[self.width]:
            return part
        if not held(part):  # a Tiled [B, H, t, S]: widened a tile at a time
            shape = (*part.shape[:3], self.shape[3])
            return Tiled(shape, lambda heads, queries: widen(part.tile(heads, queries), 3, shape[3], self.pad),
                         part.dtype)
        return widen(part, self.width, self.shape[self.width], self.pad)


def widen(array: np.ndarray, axis: int, width: int, value: float) -> np.ndarray:
    """array with entries equal to `value` appended along `axis`, up to `width`."""
    shape = list(array.shape)
    shape[axis] = width - shape[axis]
    return np.concatenate([array, np.full(shape, value, array.dtype)], axis=axis)
