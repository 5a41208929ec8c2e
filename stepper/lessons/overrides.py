"""`--use FILE.py`: run the interpreter with a learner's own functions in place of stepper's.

A lesson's exercise is a NumPy function with the name and signature of one the interpreter calls
(`rms_norm`, `decode`, `route`, ...). `use(files)` loads the files, checks the signature of each
function whose name is an exercise, and, inside the `with` block, puts it at every place the
interpreter looks that name up: the module that defines it and every module that imported it by
name. On exit stepper's own functions are put back, whatever happened.

`LOOKUPS` lists those places, one row each. Model code imports functions by name
(`from ..ops import rms_norm`), so replacing `stepper.ops.rms_norm` alone would change nothing in
`stepper.model.layer`; tests/test_lessons.py checks that every module of the interpreter holding
one of these functions is in the table.

`DETOURS` covers the places where the interpreter does not call an exercise function at all: its
FP8 matrix product and its fast decoding of a whole weight use their own bit trick instead of
calling `fp8.decode` / `fp8.dequantize`. While a learner's `decode` or `dequantize` is in use, the
product is replaced by one that calls `fp8.dequantize` on the same tiles, in the same order, and
the whole-weight decoding by `fp8.dequantize` itself, so the rest of the run continues on the
learner's output (and, with stepper's own functions, gives the same bits).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import numpy as np

from stepper.errors import StepperError

# (module, name): every place the interpreter looks up an exercise function. The first row of a
# name is the module that defines it (stepper's reference).
LOOKUPS: tuple[tuple[str, str], ...] = (
    ("stepper.model.ops", "softmax"),
    ("stepper.model.attention", "softmax"),
    ("stepper.model.ops", "rms_norm"),
    ("stepper.model.attention", "rms_norm"),
    ("stepper.model.layer", "rms_norm"),
    ("stepper.model.transformer", "rms_norm"),
    ("stepper.fp8.e4m3", "decode"),
    ("stepper.fp8.blocks", "decode"),
    ("stepper.fp8", "decode"),
    ("stepper.fp8.blocks", "dequantize"),
    ("stepper.fp8", "dequantize"),
    ("stepper.model.rope", "rope_inv_freq"),
    ("stepper.model.transformer", "rope_inv_freq"),
    ("stepper.model.rope", "apply_rope"),
    ("stepper.model.attention", "apply_rope"),
    ("stepper.model.ops", "causal_mask"),
    ("stepper.model.attention", "causal_mask"),
    ("stepper.model.attention", "latent"),
    ("stepper.model.attention", "absorbed"),
    ("stepper.model.router", "route"),
    ("stepper.model.moe", "route"),
)

EXERCISES: tuple[str, ...] = tuple(dict.fromkeys(name for _, name in LOOKUPS))
HOME: dict[str, str] = {name: module for module, name in reversed(LOOKUPS)}  # name -> defining module

# (exercises that trigger it, (module, name) replaced, replacement name in this module)
DETOURS: tuple[tuple[tuple[str, ...], tuple[str, str], str], ...] = (
    (("decode", "dequantize"), ("stepper.kernels.fp8_matmul", "linear_fp8"), "linear_fp8_via_dequantize"),
    (("decode", "dequantize"), ("stepper.kernels.linear", "linear_fp8"), "linear_fp8_via_dequantize"),
    (("decode", "dequantize"), ("stepper.kernels.fp8_matmul", "decoded"), "decoded_via_dequantize"),
    (("decode", "dequantize"), ("stepper.kernels.linear", "decoded"), "decoded_via_dequantize"),
)


def reference(name: str) -> Callable:
    """stepper's own function for an exercise name (as its module holds it now)."""
    if name not in HOME:
        raise StepperError(f"'{name}' is not an exercise function (exercises: {', '.join(EXERCISES)})")
    return getattr(importlib.import_module(HOME[name]), name)


# ---------------------------------------------------------------------------------------------
# Loading a learner's file


def load(path: Path) -> dict[str, Callable]:
    """The exercise functions a file defines (not those it imports), signatures checked."""
    path = Path(path)
    if not path.is_file():
        raise StepperError(f"{path}: no such file")
    if path.suffix != ".py":
        raise StepperError(f"{path}: expected a Python file ending in .py")
    module = import_file(path)
    found = {
        name: obj for name, obj in vars(module).items()
        if name in HOME and inspect.isfunction(obj) and obj.__module__ == module.__name__
    }
    if not found:
        raise StepperError(f"{path} defines none of the exercise functions ({', '.join(EXERCISES)})")
    for name, func in found.items():
        check_signature(path, name, func)
    return found


def import_file(path: Path):
    """Execute a Python file as a fresh module (never cached: a watch loop re-reads it)."""
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    name = f"stepper_use_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise StepperError(f"{path}: cannot load it as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise StepperError(f"{path} line {e.lineno}: syntax error: {e.msg}") from None
    except Exception as e:  # noqa: BLE001 - anything the learner's module does at import time
        line = learner_line(e, path)
        where = f" line {line}" if line else ""
        raise StepperError(f"{path}{where}: loading it failed: {type(e).__name__}: {e}") from None
    finally:
        sys.modules.pop(name, None)
    return module


def parameters(func: Callable) -> list[tuple[str, object, bool]]:
    """(name, kind, has a default) of each parameter: what makes two signatures the same."""
    return [(p.name, p.kind, p.default is not p.empty) for p in inspect.signature(func).parameters.values()]


def plain_signature(func: Callable) -> str:
    """'(codes, scale_inv, block=..., *, name=...)': the signature without annotations or values."""
    parts, star = [], False
    for p in inspect.signature(func).parameters.values():
        if p.kind == p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        prefix = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        star = star or p.kind == p.VAR_POSITIONAL
        parts.append(prefix + p.name + ("=..." if p.default is not p.empty else ""))
    return "(" + ", ".join(parts) + ")"


def check_signature(path: Path, name: str, func: Callable) -> None:
    ref = reference(name)
    if parameters(func) != parameters(ref):
        raise StepperError(
            f"{path}: {name}{plain_signature(func)} has a different signature from the interpreter's "
            f"{name}{plain_signature(ref)}; keep the parameters of the exercise stub"
        )


# ---------------------------------------------------------------------------------------------
# Errors inside a learner's function


def learner_line(error: BaseException, path: Path) -> int | None:
    """The line of `path` where an exception was raised: the innermost frame of the traceback in
    that file, when nothing but NumPy ran below it. None when the error came from elsewhere (a
    debugger quitting the run, stepper's own code)."""
    frames = traceback.extract_tb(error.__traceback__)
    target = str(Path(path).resolve())
    numpy_dir = str(Path(np.__file__).parent)
    for frame in reversed(frames):
        if frame.filename == target or Path(frame.filename).resolve() == Path(target):
            return frame.lineno
        if not frame.filename.startswith(numpy_dir):
            return None
    return None


def guarded(path: Path, name: str, func: Callable) -> Callable:
    """func, with an error raised in the learner's own code turned into a one-line StepperError
    naming the file, the line and the function; any other exception passes through unchanged."""

    @functools.wraps(func)
    def call(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except StepperError:
            raise
        except Exception as e:
            line = learner_line(e, path)
            if line is None:
                raise
            what = "is not written yet" if isinstance(e, NotImplementedError) else "raised"
            raise StepperError(f"{path} line {line}, in {name}: {what} ({type(e).__name__}: {e})") from e

    call.learner_path = path  # type: ignore[attr-defined]
    return call


# ---------------------------------------------------------------------------------------------
# Swapping


@contextmanager
def patched(replacements: Mapping[str, Callable]) -> Iterator[None]:
    """Put each replacement at every place in LOOKUPS (and the DETOURS it triggers); restore on exit."""
    unknown = sorted(set(replacements) - set(HOME))
    if unknown:
        raise StepperError(f"'{unknown[0]}' is not an exercise function (exercises: {', '.join(EXERCISES)})")
    places = [(module, name, replacements[name]) for module, name in LOOKUPS if name in replacements]
    for triggers, (module, name), replacement in DETOURS:
        if any(t in replacements for t in triggers) and hasattr(importlib.import_module(module), name):
            places.append((module, name, globals()[replacement]))
    saved: list[tuple[object, str, object]] = []
    try:
        for module_name, name, replacement in places:
            module = importlib.import_module(module_name)
            if not hasattr(module, name):
                raise RuntimeError(f"{module_name} has no '{name}': update stepper.overrides.LOOKUPS")
            saved.append((module, name, getattr(module, name)))
            setattr(module, name, replacement)
        yield
    finally:
        for module, name, original in reversed(saved):
            setattr(module, name, original)


@contextmanager
def use(files: Iterable[Path], announce: IO[str] | None = None) -> Iterator[dict[str, Callable]]:
    """Run the body with the exercise functions the files define in place of stepper's own.

    Each file's functions are signature-checked when loaded; a name defined in two files is an
    error. `announce`, when given, gets one line saying what was swapped in.
    """
    functions: dict[str, Callable] = {}
    origin: dict[str, Path] = {}
    for path in files:
        path = Path(path)
        for name, func in load(path).items():
            if name in functions:
                raise StepperError(f"{name} is defined in both {origin[name]} and {path}: --use only one of them")
            functions[name], origin[name] = guarded(path, name, func), path
    if announce is not None and functions:
        listed = ", ".join(f"{name} from {origin[name]}" for name in functions)
        announce.write(f"using your {listed}\n")
        announce.flush()
    with patched(functions):
        yield functions


# ---------------------------------------------------------------------------------------------
# The detour for FP8 products


def linear_fp8_via_dequantize(x: np.ndarray, w) -> np.ndarray:
    """x @ W^T for an FP8 weight, each tile through `fp8.dequantize` (and so `fp8.decode`),
    whichever functions those names hold now; otherwise `fp8_matmul.product` itself, so the
    tiles, padding, scaling and products are the same.  [..., in] -> [..., out]
    """
    from stepper import fp8
    from stepper.kernels import fp8_matmul

    def decode(codes: np.ndarray, out: np.ndarray) -> None:  # the codes' values times 2^-120 (exact)
        unbias = np.full(fp8.scale_grid(codes.shape, w.block), 1 / fp8.REBIAS, dtype=np.float32)
        out[...] = fp8.dequantize(codes, unbias, w.block, name=w.name)

    return fp8_matmul.product(x, w, decode)


def decoded_via_dequantize(w, out: np.ndarray | None = None) -> np.ndarray:
    """An FP8 weight as float32 through `fp8.dequantize`, whichever function that name holds now."""
    dense = w.dense()
    if out is None:
        return dense
    if np.shape(dense) != w.shape:
        raise StepperError(f"dequantize gave shape {list(np.shape(dense))} for '{w.name}', expected {list(w.shape)}")
    np.copyto(out, dense)
    return out
