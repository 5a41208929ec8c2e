"""`stepper lesson check`: a learner's exercise file against the golden tensors of the lesson's runs.

The golden tensors are stepper's own: the lesson's runs with the reference functions. A check
has two parts, and stops at the first mismatch, showing both values and where:

1. For the small pure functions (softmax, rms_norm, decode, dequantize, rope_inv_freq,
   apply_rope, causal_mask, index_scores, gated_pool, sinkhorn), the learner's function is
   called on the very inputs the reference got in the golden run (captured by a spy, one call
   per place it is used, each named by the tensor it makes) and on a few hand-made inputs that
   the run does not reach (all 256 FP8 codes, partial blocks, other presets' YaRN settings, a
   decode step's mask, a window with a -inf gate); outputs (each array of a tuple) are compared
   with the reference's. decode and dequantize are called on the run's FP8 weights, whole,
   with their own block scales (decode on the 256 codes first), and a difference names the
   byte there, field by field.
2. The lesson's runs are repeated with the learner's functions swapped in
   (`stepper.lessons.overrides`, as `stepper run --use` does) and every emitted tensor is compared, in execution order,
   with the golden run: the first tensor that differs is where the learner's function goes wrong.
   Top-k experts are compared as sets (their order is unspecified), each weight with its expert,
   and so are the positions the indexer keeps.
"""

from __future__ import annotations

import copy
import inspect
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from stepper import catalog, dtypes, fp8
from stepper.config import MODEL_TYPES
from stepper.errors import StepperError
from stepper.lessons import overrides
from stepper.planning import plan_run
from stepper.presets import PRESETS
from stepper.seams.trace import Event, Recorder, Sink
from stepper.session import RunResult, RunSpec, prepare, preset_config

PURE = ("softmax", "rms_norm", "decode", "dequantize", "rope_inv_freq", "apply_rope", "causal_mask", "index_scores",
        "gated_pool", "sinkhorn")
CALLS_PER_FUNCTION = 6
TIME_LIMIT = 30.0  # seconds for one call of a learner's function, or loading the file: a loop is stopped


@dataclass(frozen=True)
class Call:
    args: tuple
    kwargs: dict
    label: str  # "call 2 of the run (it computes layers.0.self_attn.q_a_norm)" or a hand-made case


@dataclass
class Outcome:
    ok: bool
    title: str
    detail: list[str] = field(default_factory=list)


@dataclass
class Report:
    path: Path
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.outcomes) and all(o.ok for o in self.outcomes)


# ---------------------------------------------------------------------------------------------
# Golden runs


def planned(spec: RunSpec):
    """A lesson's run, planned as `stepper run` plans one: it keeps every tensor (a recorder).
    Planning runs a miniature of the model to learn what it emits (families.derive): a spy or a
    learner's function is swapped in after it, so that it sees the lesson's run alone."""
    plan = plan_run(spec, lambda plan, names: names)
    plan.check_fits(plan.names, "--prompt-len")
    return plan


def run(spec: RunSpec, sinks: Sequence[Sink]) -> RunResult:
    return planned(spec).execute(sinks)


@lru_cache(maxsize=32)
def golden(spec: RunSpec) -> tuple[Event, ...]:
    recorder = Recorder()
    run(spec, [recorder])
    return tuple(recorder.events)


@lru_cache(maxsize=32)
def captured(spec: RunSpec, names: tuple[str, ...]) -> dict[str, tuple[Call, ...]]:
    """The reference functions' calls in a run: one per place of use (up to CALLS_PER_FUNCTION)."""
    recorder = Recorder()
    calls: dict[str, list[tuple[tuple, dict, int]]] = {name: [] for name in names}

    made: dict[tuple[str, int], Any] = {}  # (function, call) -> what it returned

    def spy(name: str, func: Callable) -> Callable:
        def call(*args, **kwargs):
            snapshot = (copy.deepcopy(args), copy.deepcopy(kwargs))
            out = func(*args, **kwargs)
            made[name, len(calls[name])] = out
            calls[name].append((*snapshot, len(recorder.events)))
            return out

        call.__wrapped__ = func  # type: ignore[attr-defined]
        return call

    plan = planned(spec)
    with overrides.patched({name: spy(name, overrides.reference(name)) for name in names}):
        plan.execute([recorder])
    events = recorder.events
    result = {}
    for name, found in calls.items():
        picked: dict[int, str] = {}
        for site_of in (kind_of_place, str):  # one call per kind of place first, then one per place
            seen = {site_of(n) for n in picked.values()}
            for i, (_, _, after) in enumerate(found):
                next_name = events[after].name if after < len(events) else "the end of the run"
                if len(picked) < CALLS_PER_FUNCTION and i not in picked and site_of(next_name) not in seen:
                    seen.add(site_of(next_name))
                    picked[i] = next_name
        result[name] = tuple(Call(found[i][0], found[i][1], place(name, i, n, events, found[i][2], made))
                             for i, n in sorted(picked.items()))
    return result


def place(name: str, i: int, next_name: str, events: Sequence[Event], after: int, made: dict) -> str:
    """'call 2 of softmax in the run, which makes layers.1.self_attn.attn_weights' when what the
    call returned (or the first array of the tuple it returned) is that tensor; else the tensor
    the run emitted next."""
    returned = made.get((name, i))
    first = returned[0] if isinstance(returned, tuple) and returned else returned
    makes = after < len(events) and events[after].array is first
    what = f"which makes {next_name}" if makes else f"computed before {next_name} is emitted"
    return f"call {i + 1} of {name} in the run, {what}"


def kind_of_place(name: str) -> tuple[bool, str]:
    """A prefill's input_layernorm and a decode step's are different kinds of place (T differs)."""
    return name.startswith("decode"), catalog.key_of(name)


FP8_FUNCTIONS = ("decode", "dequantize")


@lru_cache(maxsize=8)
def weight_calls(spec: RunSpec, name: str) -> tuple[Call, ...]:
    """decode or dequantize on the FP8 weights the run reads, one of each kind, whole and with
    their own block scales. (The run calls them on tiles of rows, with the 2^-120 rebias of
    the tiled product as the scales: not inputs a learner would recognise.)"""
    used: list[str] = []
    for call in captured(spec, ("dequantize",))["dequantize"]:
        weight = call.kwargs.get("name")
        if weight and weight not in used:
            used.append(weight)
    weights = prepare(spec).weights
    calls = []
    for weight in used:
        stored = weights.stored(weight)
        codes = fp8.as_codes(stored.data)
        if name == "decode":
            calls.append(Call((codes,), {}, f"the codes of {weight}, {list(codes.shape)} uint8, as the run reads them"))
        else:
            grid = list(np.shape(stored.scale_inv))
            calls.append(Call((codes, stored.scale_inv, tuple(stored.block)), {"name": weight},
                              f"the weight {weight}: codes {list(codes.shape)}, scale_inv {grid}"))
    return tuple(calls)


def about_byte(name: str, call: Call) -> Callable[[tuple[int, ...]], str] | None:
    """For decode and dequantize: what the byte at an index is, field by field (and its scale)."""
    if name not in FP8_FUNCTIONS or not call.args:
        return None
    codes = fp8.as_codes(np.asarray(call.args[0]))

    def about(index: tuple[int, ...]) -> str:
        f = fp8.fields(int(codes[index]))
        text = f"the byte there is 0x{f.code:02X} = {f.bits} ({f.kind}): {f.formula}"
        if name == "dequantize" and len(call.args) > 1 and len(index) == 2:
            block = call.args[2] if len(call.args) > 2 else fp8.BLOCK
            r, c = index[0] // block[0], index[1] // block[1]
            scale = float(np.asarray(call.args[1], dtype=np.float32)[r, c])
            text += f", times its block's scale_inv[{r}, {c}] = {scale:.8g}"
        return text

    return about


# ---------------------------------------------------------------------------------------------
# Hand-made cases the run does not reach


def extra_calls(name: str) -> list[Call]:
    if name == "softmax":
        x = np.array([[1000.0, 1001.0, -np.inf], [-1000.0, -1001.0, -999.0]], dtype=np.float32)
        return [Call((x,), {}, "large scores and a masked -inf entry: [[1000, 1001, -inf], [-1000, -1001, -999]]")]
    if name == "rms_norm":
        x = np.zeros((1, 2, 8), dtype=np.float32)
        x[0, 1] = np.arange(8, dtype=np.float32)
        return [Call((x, np.full(8, 2.0, dtype=np.float32), 1e-6), {},
                     "an all-zero row (eps keeps it finite), weight 2")]
    if name == "decode":
        codes = np.arange(256, dtype=np.uint8).reshape(16, 16)
        return [Call((codes,), {}, "all 256 codes 0x00..0xFF, as a [16, 16] uint8 array")]
    if name == "dequantize":
        rng = np.random.default_rng(7)
        codes = rng.integers(0, 0x7E, size=(200, 300), dtype=np.uint8)  # no NaN codes
        codes[1::2] |= 0x80  # negative rows
        scales = np.array([[0.5, 2.0**-10, 3.0], [1.25, 7.0, 2.0**-3]], dtype=np.float32)
        return [
            Call((codes, scales), {}, "a [200, 300] weight in 128x128 blocks: scale_inv [2, 3], partial last blocks"),
            Call((codes.view(dtypes.ml("float8_e4m3fn")), scales), {}, "the same weight as float8_e4m3fn codes"),
        ]
    if name == "rope_inv_freq":
        calls = []
        for model in (m for m in PRESETS if PRESETS[m]["model_type"] in MODEL_TYPES):  # DeepSeek's, with YaRN
            cfg = preset_config(model)
            calls.append(Call((cfg.qk_rope_head_dim, cfg.rope_theta, cfg.rope_scaling), {},
                              f"{model}: dim {cfg.qk_rope_head_dim}, theta {cfg.rope_theta:g}, {cfg.rope_scaling}"))
        calls.append(Call((64, 10000.0, None), {}, "no YaRN: dim 64, theta 10000, yarn None"))
        return calls
    if name == "apply_rope":
        x = np.array([[[1.0, 0.0, 0.0, 2.0]]], dtype=np.float32)  # [1, T=1, R=4]: pairs (1, 0), (0, 2)
        cos = np.array([[0.0, 1.0]], dtype=np.float32)  # pair 0 turns by 90 degrees, pair 1 by 0
        sin = np.array([[1.0, 0.0]], dtype=np.float32)
        return [Call((x, cos, sin), {}, "pairs (1, 0) and (0, 2) turned by 90 and 0 degrees")]
    if name == "causal_mask":
        return [Call((t, s), {}, f"t = {t} new positions, s = {s} attended positions")
                for t, s in ((1, 1), (4, 4), (1, 8), (3, 8))]
    if name == "index_scores":
        return index_score_calls()
    if name == "gated_pool":
        return gated_pool_calls()
    if name == "sinkhorn":
        return sinkhorn_calls()
    return []


def index_score_calls() -> list[Call]:
    """Two index heads of 2 dims, one with a negative weight (the relu comes before it), as a
    step of 2 new positions after 1 cached one: q [1, 2, 2, 2], keys [1, 3, 2], head_weights [1, 2, 2]."""
    q = np.array([[[[1.0, 0.0], [0.0, 2.0]], [[-1.0, 1.0], [1.0, 1.0]]]], dtype=np.float32)
    keys = np.array([[[1.0, 1.0], [-2.0, 0.5], [0.5, -1.0]]], dtype=np.float32)
    weights = np.array([[[1.0, -0.5], [0.25, 2.0]]], dtype=np.float32)
    return [Call((q, keys, weights), {}, "2 index heads, a negative head weight, 2 new positions after 1 cached one "
                                         "(q [1, 2, 2, 2], keys [1, 3, 2], head_weights [1, 2, 2])")]


def gated_pool_calls() -> list[Call]:
    """One window of 2 slots and 2 channels: channel 0's gates 0 and ln 3 weigh its slots 1/4 and
    3/4; channel 1's first gate is -inf (a slot before the first window): weight 0. Gates of
    1000 and 1001 (exp overflows unless the largest is taken off first). Then a step that
    closes no window."""
    kv = np.array([[[[1.0, 10.0], [3.0, -2.0]]]], dtype=np.float32)  # [B=1, Wc=1, slots=2, Dc=2]
    gate = np.array([[[[0.0, -np.inf], [np.log(3.0), 0.0]]]], dtype=np.float32)
    large = np.array([[[[1000.0, -1000.0], [1001.0, -1001.0]]]], dtype=np.float32)
    none = np.zeros((1, 0, 8, 4), dtype=np.float32)
    return [Call((kv, gate), {}, "one window of 2 slots and 2 channels, gates [[0, -inf], [ln 3, 0]] "
                                 "(slots_kv [1, 1, 2, 2], slots_gate [1, 1, 2, 2])"),
            Call((kv, large), {}, "large gates [[1000, -1000], [1001, -1001]] (slots_kv [1, 1, 2, 2])"),
            Call((none, none), {}, "a step that closes no window (slots_kv [1, 0, 8, 4])")]


def sinkhorn_calls() -> list[Call]:
    """comb [[1, 3], [1, 1]]: one iteration normalises the columns only; two then normalise the
    rows and the columns again; hc_eps 0.5 is added to every sum, the first columns' and the rounds'
    (the run's 1e-6 is too small to tell them apart)."""
    comb = np.array([[1.0, 3.0], [1.0, 1.0]], dtype=np.float32)
    return [Call((comb, iters, eps), {}, f"comb [[1, 3], [1, 1]], iters {iters}, hc_eps {eps:g}")
            for iters, eps in ((1, 0.0), (2, 0.0), (1, 0.5), (2, 0.5))]


# ---------------------------------------------------------------------------------------------
# Comparing


def fmt(v: Any) -> str:
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.8g}"
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    return str(v)


def describe_args(func: Callable, call: Call) -> str:
    try:
        bound = inspect.signature(func).bind(*call.args, **call.kwargs)
    except TypeError:
        return ""
    parts = []
    for name, value in bound.arguments.items():
        if isinstance(value, np.ndarray):
            parts.append(f"{name} {list(value.shape)} {value.dtype}")
        else:
            text = repr(value)
            parts.append(f"{name} {text if len(text) < 80 else text[:77] + '...'}")
    return ", ".join(parts)


def difference(mine: Any, ref: np.ndarray, *, rtol: float, exact: bool = False, elementwise: bool = False,
               about: Callable[[tuple[int, ...]], str] | None = None, made: str = "it returned") -> list[str]:
    """[] when mine matches ref, else lines saying where and how it differs (and `about(index)`,
    what the input holds at the first entry that differs)."""
    lines, index = differing(mine, ref, rtol=rtol, exact=exact, elementwise=elementwise, made=made)
    if index is not None and about is not None:
        lines.insert(1, about(index))
    return lines


def outputs_difference(mine: Any, ref: Any, **how) -> list[str]:
    """`difference` of one array, or of each array of a tuple the function returns (naming the
    first that differs: 'array 2 of the 2 it returns')."""
    if not isinstance(ref, tuple):
        return difference(mine, ref, **how)
    if not isinstance(mine, tuple) or len(mine) != len(ref):
        return [f"it returned {type(mine).__name__}, expected a tuple of {len(ref)} arrays"]
    for i, (m, r) in enumerate(zip(mine, ref)):
        problem = difference(m, r, **how)
        if problem:
            return [f"array {i + 1} of the {len(ref)} it returns:", *problem]
    return []


def differing(mine: Any, ref: np.ndarray, *, rtol: float, exact: bool, elementwise: bool,
              made: str = "it returned") -> tuple[list[str], tuple[int, ...] | None]:
    """The lines of `difference`, and the index of the first entry that differs (None when the
    whole array is amiss: None returned, another shape or dtype)."""
    if not isinstance(mine, np.ndarray):
        if mine is None:
            return [f"{made} None: return the array"], None
        if isinstance(ref, np.ndarray) and np.isscalar(mine):
            return [f"{made} the scalar {fmt(mine)}, expected an array of shape {list(ref.shape)}"], None
        mine = np.asarray(mine)
    if mine.shape != ref.shape:
        return [f"{made} shape {list(mine.shape)}, expected {list(ref.shape)}"], None
    if ref.dtype == np.bool_:
        return first_unequal(mine.astype(bool), ref)
    if mine.dtype != ref.dtype:
        return [(f"{made} dtype {mine.dtype}, expected {ref.dtype}: the interpreter computes in "
                 f"{ref.dtype} (cast with .astype(np.{ref.dtype}) or use np.{ref.dtype} constants)")], None
    if np.issubdtype(ref.dtype, np.integer):
        return first_unequal(mine, ref)
    return float_difference(mine, ref, rtol=rtol, exact=exact, elementwise=elementwise)


def first_unequal(mine: np.ndarray, ref: np.ndarray) -> tuple[list[str], tuple[int, ...] | None]:
    """`differing` for booleans and integers: the first entry that is not equal."""
    bad = np.argwhere(mine != ref)
    if not bad.size:
        return [], None
    i = tuple(int(j) for j in bad[0])
    return [f"at {list(i)}: expected {ref[i]}, got {mine[i]} ({len(bad)} entries differ)"], i


def float_difference(mine: np.ndarray, ref: np.ndarray, *, rtol: float, exact: bool,
                     elementwise: bool) -> tuple[list[str], tuple[int, ...] | None]:
    """`differing` for floats: NaN and infinities where the reference has them, then the tolerance."""
    m64, r64 = mine.astype(np.float64), ref.astype(np.float64)
    for what, test in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        bad = np.argwhere(test(m64) != test(r64))
        if bad.size:
            i = tuple(int(j) for j in bad[0])
            return [(f"at {list(i)}: expected {fmt(ref[i])}, got {fmt(mine[i])} ({what} where there should "
                     f"{'be' if test(r64[i]) else 'not be'} one; {len(bad)} such entries)")], i
    both = np.isfinite(m64) & np.isfinite(r64)
    with np.errstate(invalid="ignore"):
        diff = np.where(both, np.abs(m64 - r64), 0.0)
    scale = float(np.abs(r64[both]).max()) if both.any() else 0.0
    if exact:
        allowed = np.zeros_like(r64)
    elif elementwise:
        allowed = rtol * np.abs(r64)
    else:
        allowed = np.full_like(r64, rtol * scale)
    bad = np.argwhere(diff > allowed)
    if not bad.size:
        return [], None
    i = tuple(int(j) for j in bad[0])
    worst = np.unravel_index(int(np.argmax(diff)), diff.shape) if diff.ndim else ()
    tolerance = "exactly" if exact else (f"within {rtol:g} relative" if elementwise
                                         else f"within {rtol:g} x max|expected| = {rtol * scale:.3g}")
    return [f"first difference at {list(i)}: expected {fmt(ref[i])}, got {fmt(mine[i])}",
            (f"{len(bad)} of {ref.size} entries differ; the largest difference is {fmt(diff[worst])} at "
             f"{[int(j) for j in worst]} (it must match {tolerance})")], i


def setwise(events: Sequence[Event]) -> list[np.ndarray]:
    """Each event's array, with top-k experts sorted per token and their weights in the same order,
    and the indexer's kept positions sorted per query."""
    out, order = [], {}
    for e in events:
        array = np.asarray(e.array)  # one made when read (a KDA layer's states per token) read: a lesson's run is short
        scope = e.name.rpartition("mlp.gate.")[0]
        if e.key == "self_attn.indexer.topk_idx":  # the positions kept, in any order
            array = np.sort(array, axis=-1)
        elif e.key == "mlp.gate.topk_idx":
            order[scope] = np.argsort(array, axis=-1, kind="stable")
            array = np.take_along_axis(array, order[scope], axis=-1)
        elif e.key == "mlp.gate.topk_weight" and scope in order and order[scope].shape == array.shape:
            array = np.take_along_axis(array, order[scope], axis=-1)
        out.append(array)
    return out


def compare_runs(reference: Sequence[Event], mine: Sequence[Event], rtol: float) -> list[str]:
    """[] when every tensor matches; else where the learner's run first differs."""
    ref_arrays, my_arrays = setwise(reference), setwise(mine)
    for i, ref in enumerate(reference):
        if i >= len(mine):
            return [f"your run stopped emitting after {i} tensors; the reference goes on with {ref.name}"]
        if mine[i].name != ref.name:
            return [f"tensor {i + 1}: your run emitted {mine[i].name} where the reference emits {ref.name}",
                    "(emit the tensors the stub names, in its order)"]
        problem = difference(my_arrays[i], ref_arrays[i], rtol=rtol, made="your run emitted it with")
        if problem:
            kept = f"the first {i} tensors match; " if i else ""
            return [f"{ref.name} differs ({kept}this is the first that does not):", *problem]
    if len(mine) > len(reference):
        return [(f"your run emitted {len(mine) - len(reference)} tensors more than the reference, first "
                f"{mine[len(reference)].name}")]
    return []


def describe_run(spec: RunSpec) -> str:
    count = len(spec.ids) if spec.ids else spec.prompt_len
    prompt = f"ids {list(spec.ids)}" if spec.ids else f"{count} token{'s' if count != 1 else ''}"
    where = f"position {spec.start_pos}" if count == 1 else f"positions {spec.start_pos}..{spec.start_pos + count - 1}"
    model = Path(spec.model).name if spec.model.endswith(".json") else spec.model  # a lesson's own config file
    parts = [f"model {model}", f"{prompt} at {where}"]
    if spec.decode:
        parts.append(f"{spec.decode} decode step{'s' if spec.decode > 1 else ''}")
    if spec.attn != "auto":
        parts.append(f"attention {spec.attn}")
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------------
# The check


def failure_text(error: BaseException, path: Path) -> str:
    if isinstance(error, StepperError):
        return str(error)
    line = overrides.learner_line(error, path)
    if line is None:
        frame = traceback.extract_tb(error.__traceback__)[-1] if error.__traceback__ else None
        where = f" (in {Path(frame.filename).name} line {frame.lineno})" if frame else ""
        return f"{type(error).__name__}: {error}{where}"
    return f"{path} line {line}: {type(error).__name__}: {error}"


def check(lesson, path: Path) -> Report:
    """Check a learner's file for a lesson: its functions' direct cases, then the lesson's runs."""
    path = Path(path)
    report = Report(path)
    try:
        with overrides.time_limit(TIME_LIMIT):
            found = overrides.load(path, tuple(lesson.exercise.functions))
    except overrides.Overtime as e:
        report.outcomes.append(Outcome(False, "the file does not load",
                                       [str(overrides.overtime(e, path, "loading it", TIME_LIMIT))]))
        return report
    except StepperError as e:
        report.outcomes.append(Outcome(False, "the file does not load", [str(e)]))
        return report
    wanted = lesson.exercise.functions
    missing = [name for name in wanted if name not in found]
    if missing:
        report.outcomes.append(Outcome(False, f"{path} does not define {', '.join(missing)}",
                                       ["keep the function(s) of the exercise stub, with their signatures"]))
        return report
    functions = overrides.guarded_all(path, {name: found[name] for name in wanted}, TIME_LIMIT)
    for name in wanted:
        if name in PURE:
            report.outcomes.append(check_function(lesson, name, functions[name], path))
    if not all(o.ok for o in report.outcomes):
        report.outcomes.append(Outcome(False, "full runs not checked yet: fix the function above first"))
        return report
    for spec in lesson.exercise.runs:
        report.outcomes.append(check_run(spec, functions, lesson.exercise.rtol, path))
        if not report.outcomes[-1].ok:
            break
    return report


def cases(lesson, name: str) -> list[Call]:
    """The inputs a function is checked on: for decode, all 256 codes first; for decode and
    dequantize, the run's FP8 weights; for the others, its calls in the lesson's runs; then the
    hand-made cases."""
    if name == "decode":
        return extra_calls(name) + [c for spec in lesson.exercise.runs for c in weight_calls(spec, name)]
    if name == "dequantize":
        return [c for spec in lesson.exercise.runs for c in weight_calls(spec, name)] + extra_calls(name)
    return [c for spec in lesson.exercise.runs for c in captured(spec, (name,))[name]] + extra_calls(name)


def check_function(lesson, name: str, mine: Callable, path: Path) -> Outcome:
    ref = overrides.reference(name)
    calls = cases(lesson, name)
    exact = name in ("decode", "causal_mask")
    elementwise = name in ("rope_inv_freq", "dequantize")
    rtol = 1e-6 if elementwise else 1e-5
    for call in calls:
        expected = ref(*copy.deepcopy(call.args), **copy.deepcopy(call.kwargs))
        with warnings.catch_warnings(record=True) as caught, np.errstate(over="warn", divide="warn", invalid="warn"):
            warnings.simplefilter("always")
            try:
                got = mine(*copy.deepcopy(call.args), **copy.deepcopy(call.kwargs))
            except Exception as e:  # noqa: BLE001 - the learner's code may raise anything
                return Outcome(False, f"{name} fails on {call.label}", [failure_text(e, path),
                                                                        f"inputs: {describe_args(ref, call)}"])
        problem = outputs_difference(got, expected, rtol=rtol, exact=exact, elementwise=elementwise,
                                     about=about_byte(name, call))
        if problem:
            said = [f"NumPy warned: {w.message} ({Path(w.filename).name} line {w.lineno})" for w in caught[:2]]
            return Outcome(False, f"{name} differs on {call.label}",
                           [*problem, f"inputs: {describe_args(ref, call)}", *said])
    return Outcome(True, f"{name} matches the reference on {len(calls)} inputs (from the run and hand-made)")


def check_run(spec: RunSpec, functions: dict[str, Callable], rtol: float, path: Path) -> Outcome:
    reference = golden(spec)
    recorder = Recorder()
    plan = planned(spec)
    try:
        with overrides.patched(functions):
            plan.execute([recorder])
    except Exception as e:  # noqa: BLE001 - the learner's code may raise anything
        return Outcome(False, f"the run with your {', '.join(functions)} fails ({describe_run(spec)})",
                       [failure_text(e, path),
                        (f"(after {len(recorder.events)} tensors; the last was "
                         f"{recorder.events[-1].name if recorder.events else 'none'})")])
    problem = compare_runs(reference, recorder.events, rtol)
    if problem:
        return Outcome(False, f"the run with your {', '.join(functions)} differs ({describe_run(spec)})", problem)
    return Outcome(True, f"all {len(reference)} tensors of the run match ({describe_run(spec)})")
