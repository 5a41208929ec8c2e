"""`--use FILE.py`: run the interpreter with a learner's own functions in place of stepper's.

A lesson's exercise is a NumPy function with the name and signature of one the interpreter marks
`@exercise` (`rms_norm`, `decode`, `route`, ...; listed in stepper.lessons.exercises). `use(files)` loads the files,
checks the signature of each function whose name is an exercise, and, inside the `with` block,
swaps it in: every call of that exercise, wherever it is made, runs the learner's function. On
exit stepper's own functions are back, whatever happened.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import numpy as np

from stepper.errors import StepperError
from stepper.lessons import returns
from stepper.lessons.exercises import REFERENCES
from stepper.seams import swap
from stepper.untrusted import shown
from stepper.untrusted.paths import regular_file

EXERCISES: tuple[str, ...] = tuple(REFERENCES)


def reference(name: str) -> Callable:
    """stepper's own function for an exercise name."""
    if name not in REFERENCES:
        raise StepperError(f"'{name}' is not an exercise function (exercises: {', '.join(EXERCISES)})")
    return REFERENCES[name]


# ---------------------------------------------------------------------------------------------
# Loading a learner's file


def load(path: Path, wanted: tuple[str, ...] = ()) -> dict[str, Callable]:
    """The exercise functions a file defines (not those it imports), signatures checked; a file
    with none is refused naming the `wanted` ones (a lesson's), else every exercise's."""
    path = Path(path)
    regular_file(path, "a Python file ending in .py")
    if path.suffix != ".py":
        raise StepperError(f"{path}: expected a Python file ending in .py")
    module = import_file(path)
    found = {
        name: obj for name, obj in vars(module).items()
        if name in REFERENCES and inspect.isfunction(obj) and obj.__module__ == module.__name__
    }
    if not found:
        raise StepperError(f"{path} defines none of the exercise functions ({', '.join(wanted or EXERCISES)})")
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
        raise StepperError(f"{path}{where}: loading it failed: {type(e).__name__}: {shown(e)}") from None
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
    that file. None when no frame is in it (the call itself failed)."""
    frames = traceback.extract_tb(error.__traceback__)
    target = Path(path).resolve()
    for frame in reversed(frames):
        if Path(frame.filename).resolve() == target:
            return frame.lineno
    return None


PASSING = (KeyboardInterrupt, SystemExit, GeneratorExit, MemoryError)  # not the function's failure: they go on up


class Overtime(BaseException):  # not an Exception: a learner's `except Exception` does not swallow it
    """Raised where a learner's code is when it has run longer than its time limit."""


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise Overtime wherever the block is once it has run `seconds`: a loop that never ends is
    stopped, at its line. No limit with None, inside another limit, or where a timer signal cannot
    do it (off the main thread, or without SIGALRM)."""
    if (not seconds or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread()
            or signal.getitimer(signal.ITIMER_REAL)[0]):
        yield
        return

    def stop(signum, frame):
        raise Overtime

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def overtime(error: Overtime, path: Path, what: str, seconds: float) -> StepperError:
    line = learner_line(error, path)
    where = f" line {line}" if line else ""
    return StepperError(f"{path}{where}, {what}: still running after {seconds:g} s, stopped there (a loop that never "
                        "ends?)")


def guarded(path: Path, name: str, func: Callable, limit: float | None = None) -> Callable:
    """func, with whatever its call raises, a library's panic too, turned into a one-line
    StepperError naming the file, the line and the function, and a result of the wrong type or
    shape refused in one line; a call that runs longer than `limit` seconds is stopped and
    reported the same way. stepper's own exceptions (its errors, a debugger quitting the run)
    pass through unchanged. Its array arguments are its own copies (`own`)."""
    signature = inspect.signature(reference(name))
    inside: set[int] = set()  # the threads in a call of it

    @functools.wraps(func)
    def call(*args, **kwargs):
        call.called = True  # type: ignore[attr-defined]
        thread = threading.get_ident()
        if thread in inside:  # the function calling itself: its outermost call is the one guarded
            return func(*args, **kwargs)
        try:
            inside.add(thread)
            args, kwargs = [own(a) for a in args], {k: own(v) for k, v in kwargs.items()}
            with time_limit(limit):
                result = func(*args, **kwargs)
        except Overtime as e:
            raise overtime(e, path, f"in {name}", limit or 0) from None
        except PASSING:
            raise
        except BaseException as e:  # a Rust library's panic is a BaseException
            if type(e).__module__.split(".")[0] == "stepper":
                raise
            line = learner_line(e, path)
            what = "is not written yet" if isinstance(e, NotImplementedError) else "raised"
            where = f" line {line}" if line else ""
            raise StepperError(f"{path}{where}, in {name}: {what} ({type(e).__name__}: {shown(e)})") from e
        finally:
            inside.discard(thread)
        wrong = returns.wrong_result(name, signature.bind(*args, **kwargs).arguments, result)
        if wrong:
            raise StepperError(f"{path}: {name} returned {wrong}")
        return result

    call.called = False  # type: ignore[attr-defined]
    return call


def own(value: object) -> object:
    """An array argument as a copy of its own, so that a learner's function may change it in place
    (`x /= s`) without changing the tensor the run already emitted; anything else as it is."""
    return value.copy(order="K") if isinstance(value, np.ndarray) else value


def guarded_all(path: Path, found: Mapping[str, Callable], limit: float | None = None) -> dict[str, Callable]:
    """`guarded` for each of a file's functions. The file's own calls of one another (its
    dequantize calling its decode) go through the guards too: they count as calls of that function
    (a run that decodes only through the learner's dequantize does call the learner's decode),
    and a failure there is named after it."""
    wrapped = {name: guarded(path, name, func, limit) for name, func in found.items()}
    for name, func in found.items():
        if getattr(func, "__globals__", {}).get(name) is func:  # the name the file's code calls it by
            func.__globals__[name] = wrapped[name]
    return wrapped


# ---------------------------------------------------------------------------------------------
# Swapping


@contextmanager
def patched(replacements: Mapping[str, Callable]) -> Iterator[None]:
    """Swap each replacement in for its exercise inside the block; stepper's own on exit."""
    unknown = sorted(set(replacements) - set(REFERENCES))
    if unknown:
        raise StepperError(f"'{unknown[0]}' is not an exercise function (exercises: {', '.join(EXERCISES)})")
    with swap.swapped(replacements):
        yield


@contextmanager
def use(files: Iterable[Path], announce: IO[str] | None = None) -> Iterator[dict[str, Callable]]:
    """Run the body with the exercise functions the files define in place of stepper's own.

    Each file's functions are signature-checked when loaded; a name defined in two files is an
    error. `announce`, when given, gets one line saying what was swapped in, and after a run that
    never called one of them, one line saying so.
    """
    functions: dict[str, Callable] = {}
    origin: dict[str, Path] = {}
    for path in files:
        path = Path(path)
        for name, func in guarded_all(path, load(path)).items():
            if name in functions:
                raise StepperError(f"{name} is defined in both {origin[name]} and {path}: use only one of them")
            functions[name], origin[name] = func, path
    if announce is not None and functions:
        listed = ", ".join(f"{name} from {origin[name]}" for name in functions)
        announce.write(f"using your {shown(listed)}\n")
        announce.flush()
    with patched(functions):
        yield functions
    never = [name for name, func in functions.items() if not func.called]
    if announce is not None and never:  # the run's model has no such step (a V4 exercise on an MLA model)
        announce.write(f"your {', '.join(never)} {'was' if len(never) == 1 else 'were'} never called: this run's "
                       "model has no step it computes\n")
        announce.flush()
