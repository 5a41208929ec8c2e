"""stepper as a library: run a model, patch it, compare two runs.

    import stepper
    run = stepper.run("tiny", ids=[1, 2, 3], decode=1)    # the options of `stepper run`, as keywords
    run["prefill.layers.1.self_attn.compressed_kv"]       # a NumPy array (read-only), or a LazyTensor
    run.names                                             # the kept names, in execution order
    run.explain("k_pe")                                   # the catalogue entry, as a dict
    run.generated, run.config                             # the decoded tokens, the model's Config
    run.notes                                             # what `stepper run` says before the run

    patched = stepper.run("tiny", ids=[1, 2, 3], patch=stepper.zero_expert(1, 5))
    stepper.diff(run, patched).first                      # where the two runs part

A run keeps the tensors matching `keep=` (globs such as "*.mlp.gate.*", or a function of the name
that says True; every tensor by default, refused before it starts when they would not fit in
memory). `patch=` maps globs to functions `fn(array, name)`: at each tensor a glob matches, the
model continues with the function's result (same shape and dtype; None leaves it as it was). Bad
arguments raise `StepperError` with one sentence naming the argument and what was expected.

`run[name]` is a read-only NumPy array when the run holds the tensor, else a `LazyTensor`
(stepper.tensors.tensor), made when read: a long prompt's attention scores and weights (made a tile at a
time), every tensor over the positions of a prefill run in chunks (chunk=). `np.asarray(t)` or
`t.numpy()` reads one and `t.cost` says first what that makes: a chunked run's first read replays
its chunks once and makes all its chunked tensors, kept for the next reads.

In a notebook, one call is one display: a run (a summary: its steps and layers, what each kept),
`run.show(name)` (the tensor's row), `run.picture(kind, name)` and a diff are values that display
themselves once, as a cell's last value or through `display(...)`, with what the terminal shows;
nothing displays while they are made.

A run is planned as the command line plans one (`stepper.planning`: its auto choices, its names
checked, its memory estimated, its patches applied), so both behave alike.
"""

from __future__ import annotations

import difflib
import inspect
import numbers
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence, Sized
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from stepper import catalog
from stepper.config import Config
from stepper.errors import StepperError
from stepper.fixtures import candidate, run_diff
from stepper.fixtures.implementation_names import explained
from stepper.kernels import parallel
from stepper.lessons import overrides
from stepper.planning import Wording
from stepper.planning.names import picture_tensors
from stepper.planning.record import Recorded, record
from stepper.presets import PRESETS
from stepper.seams.experiments import force_experts, zero_expert, zero_head, zero_router_bias
from stepper.seams.patching import PatchFn, as_patches, raised_in_patch
from stepper.seams.trace import Event, did_you_mean, matches
from stepper.session import ATTN_CHOICES, INDEX_SCORING_CHOICES, RunSpec, api_keyword, check_choice
from stepper.tensors.tensor import LazyTensor, Tensor, held
from stepper.untrusted import cut, said, shown
from stepper.views import notebook
from stepper.views.explain import looked_up, own_words
from stepper.views.summary import token_ids
from stepper.weights.remote import without_credentials
from stepper.weights.source import WeightSource

__all__ = ["Diff", "LazyTensor", "LongRunWarning", "Run", "StepperError", "diff", "force_experts", "load", "run",
           "zero_expert", "zero_head", "zero_router_bias"]

API_WORDING = Wording(keep="keep=", patch="patch=", spell=api_keyword, options={
    "--prompt-len": "prompt_len= (a shorter prompt)", "--attn absorb": "attn='absorb'", "--layer N": "layer=N",
    "--weight-cache-mb": "weight_cache_mb=",
})


def run(model: str | Path | None = None, *, ids: Sequence[int] | None = None, prompt_len: int | None = None,
        layer: int | None = None, layers: tuple[int, int | None] | str | None = None, start_pos: int = 0,
        decode: int = 0, seed: int = 0, input: str | Path | None = None, attn: str = "auto",
        weight_cache_mb: int = 0, keep: str | Sequence[str] | Callable[[str], bool] | None = None,
        patch: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        use: str | Path | Sequence[str | Path] | None = None, weights: WeightSource | None = None,
        index_scoring: str = "exact", cache_len: int = 0, chunk: int | str = "auto") -> Run:
    """Run a model as `stepper run` does and keep its tensors.

    model: a preset (a name of stepper.presets.PRESETS: tiny, kimi-k2, deepseek-v3.2, ...), a
    checkpoint directory or a config.json (default: tiny, or the model of `weights`).
    ids or prompt_len: the prompt (default 7 ids drawn from the seed); start_pos: its first position;
    decode: greedy decode steps (names then start with prefill. / decode{k}.); layer: run that
    layer alone (on `input`, a safetensors file, or the prompt's embeddings); layers: (A, B) or
    "A:B", the model up to layer B-1 showing A..B-1; attn: naive, absorb or auto (absorbed
    throughout where naive attention would not fit in memory or the prompt attends over a longer
    cache: run.spec.attn is then "absorb"); seed: of the
    synthetic weights and prompt; weight_cache_mb: decoded weights kept between decode steps;
    keep: globs of the tensors to keep, or a function of a name saying whether to keep it
    (default every one); patch: glob -> fn(array, name) (or an expression of x, "x*0.5"), or a
    list of such dicts; use: lesson files whose exercise functions replace stepper's; weights: a
    weight source (e.g. `SyntheticWeights`, `ArrayWeights`) in place of the model's, to run on
    changed weights; index_scoring: DeepSeek-V3.2's indexer scores exactly (float32) or as
    DeepSeek's inference code does ("fp8": Hadamard-rotated FP8 q and k); cache_len: a lone layer's
    cache starts with this many synthetic positions (with layer= only); chunk: the prefill runs this
    many positions at a time, each tensor still kept once over every position (a LazyTensor: the
    first read replays the chunks once for all of them); 0: the whole prompt at once; "auto", the
    default: the whole prompt where it fits in memory, else chunks that fit (run.spec.chunk is
    what ran).
    """
    model = _model_of(model, weights)
    if layer is not None and layers is not None:  # the command line refuses both; layers= was dropped
        raise StepperError("give layer= or layers=, not both")
    spec = RunSpec(
        model=without_credentials(str(_path_or_name("model", model))), layer=_count("layer", layer, none=True),
        layers=_layers(layers),
        ids=_ids(ids, prompt_len), prompt_len=7 if prompt_len is None else _count("prompt_len", prompt_len, 1),
        start_pos=_count("start_pos", start_pos), decode=_count("decode", decode), seed=_count("seed", seed),
        input=None if input is None else Path(_path_or_name("input", input, INPUT_EXPECTED)),
        attn=check_choice("attn=", attn, ATTN_CHOICES), weight_cache_mb=_count("weight_cache_mb", weight_cache_mb),
        index_scoring=check_choice("index_scoring=", index_scoring, INDEX_SCORING_CHOICES),
        cache_len=_count("cache_len", cache_len),
    )
    asked = _chunk(chunk)
    if asked and patch is not None:
        raise StepperError("chunk= with patch=: a patch changes tensors as the prefill makes them, "
                           "so the prompt must run whole")
    if asked and use is not None:  # a chunked tensor is made again when read, after run() returned
        raise StepperError("chunk= with use=: a chunked run's tensors are made again when read, without your "
                           "functions, so the prompt must run whole (chunk=0)")
    kept = _globs("keep", keep)
    uses = [use] if isinstance(use, (str, Path)) else use
    if uses is not None and not isinstance(uses, (list, tuple)):
        raise StepperError(f"use= expects a file path or a list of them, got {type(use).__name__}")
    files = [] if use is None else [Path(_path_or_name("use", u)) for u in uses]
    if weights is not None and not all(hasattr(weights, a) for a in ("config", "get", "matrix", "has", "check")):
        raise StepperError("weights= expects a weight source (config, get, matrix, has, check), "
                           f"got {type(weights).__name__}")
    patches = [(p, _two_arguments(p, fn)) for p, fn in as_patches(patch)]
    chosen = 0 if asked is None and (patches or files) else asked  # auto with a patch or use: the whole prompt
    with np.errstate(all="ignore"):  # as `stepper run`: the NaN or inf a run makes is in its figures, not in warnings
        try:
            recorded = record(spec, kept, patches, lambda: overrides.use(files), API_WORDING, weights=weights,
                              chunk=chosen, forewarn=long_run_warning)
        except StepperError as error:  # said from this call, as the command line says it in one line: not from
            raise error.with_traceback(None) from None  # the model's depths, where a patch's result was refused
        except Exception as error:  # a patch function's own error: from its frames, not the model's around them
            if (frames := raised_in_patch(error)) is None:
                raise
            raise error.with_traceback(frames)
    return Run(recorded)


class LongRunWarning(UserWarning):
    """A run that makes many named tensors, warned of before it starts (its note is in run.notes too)."""


def long_run_warning(line: str) -> None:
    """The plan's note that the run is long, as a warning: said when the call starts, not when it returns."""
    warnings.warn(line.removeprefix("note: "), LongRunWarning, stacklevel=4)


class Run(Mapping):
    """A finished run: its kept tensors by name (a read-only Mapping, in execution order), what it
    ran on and what it produced."""

    def __init__(self, recorded: Recorded):
        self._recorded = recorded
        self._events = {name: replace(e, array=read_only(e.array)) for name, e in recorded.events.items()}

    @property
    def names(self) -> list[str]:
        """The kept tensors' names, in execution order."""
        return list(self._events)

    @property
    def emitted(self) -> list[str]:
        """Every name the run emits, kept or not, in execution order (one made only when kept, as a
        delta rule's state after every token, is named here all the same)."""
        return list(self._recorded.names)

    @property
    def config(self) -> Config:
        return self._recorded.plan.config

    @property
    def spec(self) -> RunSpec:
        return self._recorded.plan.spec

    @property
    def prompt(self) -> tuple[int, ...]:
        return self._recorded.result.prompt

    @property
    def generated(self) -> tuple[int, ...]:
        """The decode steps' tokens: greedy for the model, drawn from the seed for a lone layer."""
        return self._recorded.result.generated

    @property
    def notes(self) -> tuple[str, ...]:
        """What the command line says of the same run before it: its auto choices (attn=, chunk=) and
        its notes (a lone layer of a checkpoint without an embedding table runs on seeded vectors, its
        ids= only counting positions; tensors the config gives no use), in the API's words."""
        return self._recorded.said

    @property
    def patched(self) -> dict[str, list[str]]:
        """Each patch glob -> the names it was applied to."""
        return {k: list(v) for k, v in self._recorded.patched.items()}

    def event(self, name: str) -> Event:
        """The kept tensor `name` (a full name, or a glob or dotted tail matching one kept name) with its scope."""
        if not isinstance(name, str):  # (run.show(3) was a TypeError from inside fnmatch)
            raise NotFound(f"tensors are looked up by name (a string), got {type(name).__name__}")
        if name in self._events:
            return self._events[name]
        found = [n for n in self._events if matches(n, [name])]
        if len(found) == 1:
            return self._events[found[0]]
        if found:
            raise NotFound(f"'{cut(name)}' matches {len(found)} kept tensors ({', '.join(found[:3])}"
                               f"{', ...' if len(found) > 3 else ''}): give the full name")
        if any(matches(n, [name]) for n in self._recorded.names):
            raise NotFound(f"'{cut(name)}' was emitted but not kept: add it to keep=")
        near = difflib.get_close_matches(name, list(self._events), n=3, cutoff=0.8)  # a full name, mistyped
        hint = f"; did you mean {', '.join(near)}?" if near else did_you_mean(name, self._recorded.names)
        raise NotFound(f"no tensor '{cut(name)}' in this run{hint}")

    def __getitem__(self, name: str) -> Tensor:
        """The kept tensor `name`: a read-only array, or a LazyTensor made when read (see `cost`)."""
        return self.event(name).array

    def __iter__(self) -> Iterator[str]:
        return iter(self._events)

    def __len__(self) -> int:
        return len(self._events)

    def __eq__(self, other: object) -> bool:
        """Not defined between two runs: a Mapping's == compared the arrays' truth (a NumPy ValueError)."""
        if other is self or not isinstance(other, Mapping):
            return other is self
        raise StepperError("runs are compared tensor by tensor with stepper.diff(a, b), not with == "
                           "(diff(a, b).first is None when no tensor differs beyond round-off)")

    __hash__ = None  # a Mapping, as before

    def explain(self, name: str) -> dict[str, Any]:
        """The catalogue entry of a tensor (a full name, a catalogue name, a dotted tail or another
        implementation's name), as a dict: description, formula, dims, reference lines, aliases; and
        for a tensor this run's model never emits (DeepSeek-V4's hc_attn.comb asked of tiny),
        emitted_by: a preset whose layers do, as `stepper explain` names it."""
        if not isinstance(name, str):
            raise StepperError(f"explain expects a tensor name (a str), got {type(name).__name__}")
        try:  # as `stepper explain` reads it
            found = looked_up(self.config, name, explained, "a run of model='{}' has it")
        except StepperError as error:  # no catalogue's name, or a parameter the layer has not
            raise NotFound(str(error)) from None
        entries = [e for e in found.entries if any(catalog.key_of(n) == e["name"] for n in self.names)]
        entries = entries if len(entries) == 1 else found.entries  # k_pe of this run's family, not another's
        if not entries:  # another implementation's name for what stepper does not name
            raise NotFound("; ".join(one.note() for one in found.named))
        if len(entries) > 1:
            listed = ", ".join(e["name"] for e in entries[:4])
            raise NotFound(f"'{name}' names {len(entries)} catalogue entries ({listed}); give one of them")
        entry = own_words(found.cat, entries[0], found.sizes, found.layer)  # as `stepper explain` words it
        entry["reference"] = {source: cited for source, cited in entry["reference"].items() if cited is not None}
        if found.elsewhere:  # a tensor this run's model never emits: the preset that does
            return {**_copy(entry), "emitted_by": found.sizes.name if found.sizes else None}
        return _copy(entry)

    @parallel.one_blas_thread()  # a lazy tensor's figures: its tiles made on stepper's own thread beside them
    def show(self, name: str) -> notebook.Shown:
        """One tensor as the terminal shows it (its row): a value that displays itself once in a
        notebook (its repr is the row as text)."""
        return notebook.tensor_view(self.event(name), self.config)

    def picture(self, kind: str, name: str) -> notebook.Shown:
        """A picture of `stepper run --show`, displayed once in a notebook: "attention" of an
        attn_weights, "routing" of a router's topk_idx or topk_weight (both kept; DeepSeek-V4's
        ffn.gate.weights and its hash_idx or topk_idx), "hist" of any tensor; DeepSeek-V4's "hc" of an
        hc_attn.comb or hc_ffn.comb and "reach" of an attn.chosen; Kimi Linear's "state" of a KDA
        layer's self_attn.state (`pictures()`: those this run's tensors draw)."""
        drawn_from = self._drawn_from()
        if kind not in drawn_from:
            raise StepperError(f"picture: kind expects one of {', '.join(self.pictures())} (what this run's kept "
                               f"tensors draw), got {_given(kind)}")
        event = self.event(name)
        if drawn_from[kind] and catalog.key_of(event.key) not in drawn_from[kind]:  # LongCat's sub0. left out
            raise StepperError(f"picture: {kind} draws a {' or a '.join(drawn_from[kind])}, and {event.name} is not "
                               f"one (this run's tensors draw {', '.join(self.pictures())})")
        return notebook.picture(kind, event, self.config, self.__getitem__)

    def __repr__(self) -> str:
        patched = ", ".join(shown(glob) for glob in self._recorded.patched)
        at = f", patched at {patched}" if patched else ""
        noted = sum(line.startswith("note:") for line in self.notes)
        told = f"; {noted} note{'s' if noted > 1 else ''} in run.notes" if noted else ""
        return (f"<stepper.Run {self.config.name}{at}: {len(self)} tensors kept of {len(self._recorded.names)}, "
                f"prompt {token_ids(self.prompt)}, generated {token_ids(self.generated)}{told}>")

    def _repr_html_(self) -> str:
        """A summary (its steps and layers and the names each kept), not every tensor: `show` one."""
        notes = [line for line in self.notes if line.startswith("note:")]
        return notebook.run_html(list(self._events.values()), self.config, repr(self), self.pictures(), notes)

    def pictures(self) -> tuple[str, ...]:
        """The kinds of `picture` this run's kept tensors can draw ("hist": any tensor)."""
        keys = {catalog.key_of(event.key) for event in self._events.values()}
        return (*(kind for kind, drawn in self._drawn_from().items() if drawn and keys & set(drawn)), "hist")

    def _drawn_from(self) -> dict[str, tuple[str, ...]]:
        """Each picture and the tensors it draws, in this run's names (as `--show` takes them; hist: any)."""
        return {**picture_tensors(self.config), "hist": ()}


class NotFound(StepperError, KeyError):
    """A tensor or entry not found: a KeyError (a Run is a Mapping) with a readable message."""

    def __str__(self) -> str:
        return str(self.args[0])


class Diff(run_diff.Diff):
    """Two runs compared, tensor by tensor (rows in execution order, `first` where they part)."""

    def __repr__(self) -> str:
        first = self.first
        where = f"first difference {shown(first.name)}" if first else "no tensor differs beyond round-off"
        apart = ", ".join(f"{len(names)} only in {side}" for side, names in (("A", self.only_a), ("B", self.only_b))
                          if names)  # (two models' runs share few names: their logits, say)
        return f"<stepper.Diff {len(self.rows)} tensors: {self.count('same')} same, {self.count('close')} close, " \
               f"{self.count('differs')} differ{'; ' + apart if apart else ''}; {where}>"

    def __rich_console__(self, console, options):
        """The table, the growth per layer and the summary `stepper diff` prints (`rich.print(d)`),
        fitted to the console's width as the command's are on a terminal (a notebook shows the
        whole table through _repr_html_)."""
        yield notebook.diff_table.render(self, options.max_width)

    def _repr_html_(self) -> str:
        return notebook.diff_html(self)


def diff(a: Run | Mapping[str, np.ndarray] | str | Path, b: Run | Mapping[str, np.ndarray] | str | Path) -> Diff:
    """Compare two runs tensor by tensor: each a `Run`, a dict of name -> array, a `--dump` file,
    a fixture folder or the name of one of the repository's fixtures ("tiny-prefill-decode").
    Every tensor both have, in A's execution order, with max |b - a|, the relative error, the
    cosine and the experts whose choice changed; `.first` is the first tensor that differs beyond
    the tolerance `fixtures verify` uses."""
    (ta, la), (tb, lb) = _side("a", a), _side("b", b)
    try:
        found = run_diff.diff_tensors(ta, tb, la, lb)
    finally:
        run_diff.release(ta, tb)
    return Diff(**vars(found))


def load(path: str | Path) -> dict[str, np.ndarray]:
    """The tensors of a `--dump` file, a fixture folder or a repository fixture's name, in execution order."""
    side = run_diff.read_side(run_diff.side_path(str(_path_or_name("path", path)), "load"))
    try:  # arrays of their own, writable (a fixture's and a safetensors file's are read-only views of the file)
        return {name: array if array.flags.writeable else array.copy() for name, array in side.items()}
    finally:
        run_diff.release(side)


def _side(which: str, side: Any) -> tuple[Mapping[str, np.ndarray], str]:
    """One side of a diff: a run's tensors, a file's or fixture's (a file's each read when compared)."""
    if isinstance(side, Run):
        return dict(side.items()), f"{which.upper()} (a run of {side.config.name})"
    if isinstance(side, (str, Path)):
        path = run_diff.side_path(str(_path_or_name(which, side)), f"diff {which}", "a stepper.Run")
        return run_diff.read_side(path), str(side)
    if isinstance(side, Mapping):  # a run's dict holds LazyTensors too: they are read as a Run's are
        bad = next(((k, v) for k, v in side.items()
                    if not (isinstance(k, str) and isinstance(v, (np.ndarray, LazyTensor)))), None)
        if bad is not None:
            raise StepperError(f"diff: {which} is a dict of name -> array, but its {_given(bad[0])} is "
                               f"{type(bad[1]).__name__}, not a NumPy array")
        odd = next(((k, v) for k, v in side.items() if isinstance(v, np.ndarray) and not _numbers(v)), None)
        if odd is not None:  # (complex ones were compared by their real parts, objects a TypeError)
            raise StepperError(f"diff: {which} is a dict of name -> array, but its {_given(odd[0])} has dtype "
                               f"{odd[1].dtype}; expected integers or floats")
        return dict(side), f"{len(side)} tensors"
    raise StepperError(f"diff: {which} must be a stepper.Run, a dict of name -> NumPy array, a --dump file or a "
                       f"fixture folder, got {type(side).__name__}")


def _numbers(array: np.ndarray) -> bool:
    """Whether an array holds numbers a diff compares: integers or floats (BF16 and FP8 too), as a
    dump's tensors are (fixtures.candidate.widen)."""
    return array.dtype.kind in "biuf" or array.dtype.name in candidate.WIDENED


def read_only(array: Tensor) -> Tensor:
    """A view that cannot be written (the array itself keeps its flags); a tensor made when read
    (stepper.tensors.tiled: long attention; stepper.tensors.chunked: a chunked prefill's) is read-only already
    and is kept as it is."""
    if not held(array):
        return array
    view = array.view()
    view.flags.writeable = False
    return view


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------
# Arguments checked: one sentence naming the argument and what was expected


def _count(name: str, value: Any, minimum: int = 0, none: bool = False) -> Any:
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise StepperError(f"{name}= expects an integer >= {minimum}{' or None' if none else ''}, got {_given(value)}")
    return int(value)


def _ids(ids: Any, prompt_len: Any) -> tuple[int, ...] | None:
    """One prompt's ids ([[...]], a batch of one, is that one). A run is one sequence (its tensors'
    batch axis B is 1): a batch of prompts is refused, not flattened into one prompt."""
    if ids is None:
        return None
    if prompt_len is not None:
        raise StepperError("give ids= or prompt_len=, not both")
    if isinstance(ids, np.ndarray) and ids.dtype.kind not in "iu":  # (millions of floats were listed first: 9 s)
        raise StepperError(f"ids= expects a list of token ids (integers), got {_short(ids)}")
    prompt = list(ids) if _is_list(ids) else None
    if prompt is not None and len(prompt) == 1 and _is_list(prompt[0]):
        prompt = list(prompt[0])
    if prompt is not None and any(_is_list(i) for i in prompt):
        raise StepperError(f"ids= expects one prompt, a flat list of token ids; got a batch of {len(prompt)} "
                           f"({_short(ids)}): a run is one sequence (B=1), so run each prompt on its own")
    if prompt is None or not all(isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in prompt):
        raise StepperError(f"ids= expects a list of token ids (integers), got {_short(ids)}")
    if not prompt:
        raise StepperError("ids= is empty: give at least one token id")
    return tuple(int(i) for i in prompt)


def _is_list(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return value.ndim > 0
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _model_of(model: Any, weights: Any) -> Any:
    """The model a run names: `model`, else the model of `weights` (its config's), else tiny. A
    preset named beside weights of another model is refused: the weights' config is what runs."""
    name = getattr(getattr(weights, "config", None), "name", None)
    if model is None:
        return name or "tiny"
    if name is not None and isinstance(model, str) and model in PRESETS and model != name:
        raise StepperError(f"model={_given(model)} with weights= of {name}: the weights' model is what runs; "
                           f"give model={name!r} or leave model= out")
    return model


def _layers(layers: Any) -> tuple[int, int | None] | None:
    if layers is None:
        return None
    chosen = None
    if isinstance(layers, str):
        first, sep, stop = layers.partition(":")
        if sep and (first or "0").isdigit() and (stop == "" or stop.isdigit()):
            chosen = int(first or 0), int(stop) if stop else None
    elif isinstance(layers, (tuple, list)) and len(layers) == 2 and all(
            isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in layers[:1]) and (
            layers[1] is None or isinstance(layers[1], numbers.Integral)):
        chosen = int(layers[0]), None if layers[1] is None else int(layers[1])
    if chosen is None:
        raise StepperError(f"layers= expects (A, B) or 'A:B' (layers A to B-1), got {_given(layers)}")
    start, end = chosen
    if end is not None and end <= start:  # as the command line says it
        raise StepperError(f"layers={_given(layers)} is {'reversed' if end < start else 'empty'}: (A, B) runs "
                           f"layers A to B-1, so A comes first and B past it (layers=({start}, {start + 1}) for "
                           f"layer {start})")
    return chosen


def _chunk(chunk: Any) -> int | None:
    """chunk=: positions per chunk of the prefill (0: the whole prompt), or None for "auto"."""
    if isinstance(chunk, str) and chunk == "auto":
        return None
    if isinstance(chunk, bool) or not isinstance(chunk, numbers.Integral) or chunk < 0:
        raise StepperError("chunk= expects an integer >= 0 (0: the whole prompt at once) or 'auto', "
                           f"got {_given(chunk)}")
    return int(chunk)


def _globs(name: str, value: Any) -> list[str] | Callable[[str], bool] | None:
    if value is None or callable(value):
        return value
    globs = [value] if isinstance(value, str) else value
    if not isinstance(globs, (list, tuple)) or not globs or not all(isinstance(g, str) and g for g in globs):
        raise StepperError(f"{name}= expects a glob, a list of globs or a function of the name, e.g. '*compressed_kv' "
                           f"or lambda name: 'attn' in name, got {_given(value)}")
    return list(globs)


def _two_arguments(pattern: str, fn: PatchFn) -> PatchFn:
    """A patch function takes the array and its name: one that cannot is refused before the run."""
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError:
        name = getattr(fn, "__qualname__", type(fn).__name__)
        raise StepperError(f"patch= {pattern}: {name}{inspect.signature(fn)} cannot take (array, name); expected "
                           "fn(array, name), e.g. lambda a, name: a * 0.5") from None
    except ValueError:  # no signature to read (some built-ins): it is called as it is
        pass
    return fn


def _short(value: Any, limit: int = 60) -> str:
    """Token ids as an error shows them: a few of them (never the repr of a whole list, nor of an
    array of millions: a large array by its shape and dtype)."""
    if isinstance(value, np.ndarray):
        return said(value.tolist(), limit) if value.size <= limit else _given(value)
    return said(value, limit)


INPUT_EXPECTED = "the path of a safetensors file holding the layer's input (a --dump, say)"


def _given(value: Any, limit: int = 60) -> str:
    """What was given to an argument, for its error: its repr when short, else its type (an array's
    shape and dtype, another object's shape or length), never a whole array."""
    if isinstance(value, np.ndarray):  # its shape and dtype, as untrusted.said shows a file's arrays
        return f"an array of shape {value.shape} ({value.dtype})"
    text = repr(value)
    if len(text) <= limit and "array(" not in text:
        return text
    shape = getattr(value, "shape", None)
    size = (f" of shape {tuple(shape)}" if isinstance(shape, Sequence) else
            f" of length {len(value)}" if isinstance(value, Sized) else "")
    return f"a {type(value).__name__}{size}"


def _path_or_name(name: str, value: Any, expected: str = "a name or a path") -> str | Path:
    if not isinstance(value, (str, Path)) or not str(value):
        raise StepperError(f"{name}= expects {expected}, got {_given(value)}")
    return value
