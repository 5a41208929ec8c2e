"""The seam where a learner's function takes the place of stepper's own.

A function a lesson asks the learner to write is marked `@exercise` where it is defined. Code
imports and calls it as any other function; the call runs whatever `swapped` has put under that
name, stepper's own function otherwise. So nothing lists where the function is used, and moving
a call site cannot break `--use` or `lesson check`. Marking registers nothing: the exercises are
listed by object in stepper.lessons.exercises, which checks the names swapped in.

A fast path that computes what an exercise computes without calling it (the tiled FP8 product
decodes with its own bit trick instead of calling `fp8.decode`) says so with `@bypasses`, naming
the exercise functions themselves (so renaming one fails at import, never silently): while one of
those exercises is swapped in, its readable version runs instead, one that calls them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

_in_use: dict[str, Callable] = {}  # exercise name -> the function swapped in for it


def exercise(func: Callable) -> Callable:
    """Mark func as one a learner may replace: calls go to the replacement while one is swapped in."""
    name = func.__name__

    @functools.wraps(func)
    def call(*args, **kwargs):
        return _in_use.get(name, func)(*args, **kwargs)

    call.exercise_name = name
    return call


def bypasses(*exercises: Callable, readable: Callable) -> Callable[[Callable], Callable]:
    """Mark a fast path that does the work of `exercises` (functions marked @exercise) without
    calling them: while any of them is swapped in, `readable` (same signature, calling them) runs
    instead."""
    names = [exercise_name(f) for f in exercises]

    def mark(fast: Callable) -> Callable:
        @functools.wraps(fast)
        def call(*args, **kwargs):
            chosen = readable if any(n in _in_use for n in names) else fast
            return chosen(*args, **kwargs)

        return call

    return mark


def swapped_in(*exercises: Callable) -> bool:
    """Whether a learner's function runs now in place of any of these exercises."""
    return any(exercise_name(f) in _in_use for f in exercises)


def in_place_of(func: Callable) -> Callable | None:
    """The learner's function swapped in for this exercise now, if any: a tensor made later (read
    after the run, as the API's lazy ones are) calls it as the run did."""
    return _in_use.get(exercise_name(func))


def exercise_name(func: Callable) -> str:
    """The name under which `func`, a function marked @exercise, is swapped."""
    name = getattr(func, "exercise_name", None)
    if name is None:
        raise TypeError(f"{getattr(func, '__qualname__', func)!r} is not marked @exercise")
    return name


@contextmanager
def swapped(replacements: Mapping[str, Callable]) -> Iterator[None]:
    """Inside the block, each replacement runs wherever the exercise of that name is called;
    restored on exit. The caller checks the names (stepper.lessons.overrides.patched)."""
    saved = dict(_in_use)
    _in_use.update(replacements)
    try:
        yield
    finally:
        _in_use.clear()
        _in_use.update(saved)
