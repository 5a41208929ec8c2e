"""The learner's progress: progress.json in the user's data directory, never in the repository.

The data directory is $STEPPER_DATA_DIR, else $XDG_DATA_HOME/stepper, else ~/.local/share/stepper.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stepper import files
from stepper.errors import StepperError
from stepper.lessons.schema import Lesson, find_lesson
from stepper.untrusted import cut, said
from stepper.untrusted.jsonfile import read_json

FLAGS = ("walked", "passed", "gave_up")  # a lesson's entry: true or false
COUNTS = ("hints", "first_try", "retried", "asked")  # a lesson's entry: whole numbers >= 0


def data_dir() -> Path:
    if os.environ.get("STEPPER_DATA_DIR"):
        return Path(os.environ["STEPPER_DATA_DIR"])
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "stepper"


class Progress:
    """progress.json: per lesson whether it was walked, passed, given up, hints shown, and the latest
    walk's predictions (right at the first try, right on a retry, asked)."""

    def __init__(self, path: Path | None = None):
        self.path = path or data_dir() / "progress.json"
        self.data: dict[str, Any] = {"version": 1, "current": None, "lessons": {}}
        if self.path.exists():
            try:
                loaded = read_json(self.path, "a progress file")  # nested too deeply, NaN or a key twice: refused
            except StepperError as e:
                raise StepperError(f"progress file {e}: fix or delete it") from None
            if not isinstance(loaded, dict) or not isinstance(loaded.get("lessons"), dict):
                raise StepperError(f"progress file {self.path} is not stepper's progress: fix or delete it")
            self.data.update(loaded)
            check(self.data, self.path)

    def lesson(self, name: str) -> dict[str, Any]:
        entry = self.data["lessons"].setdefault(name, {})
        for key, default in (("walked", False), ("passed", False), ("gave_up", False), ("hints", 0),
                             ("first_try", 0), ("retried", 0), ("asked", 0)):
            entry.setdefault(key, default)
        return entry

    @property
    def current(self) -> str | None:
        return self.data.get("current")

    @current.setter
    def current(self, name: str) -> None:
        self.data["current"] = name

    def save(self) -> None:
        try:
            files.make_folder(self.path.parent)
            files.write_bytes_atomically(self.path, json.dumps(self.data, indent=2, sort_keys=True) + "\n")
        except OSError as e:
            raise StepperError(f"cannot write progress file {self.path} ({e})") from None


def check(data: dict[str, Any], path: Path) -> None:
    """The fields of a progress file the commands read, with their JSON types (a file edited by hand
    could hold anything: a count as a string, a lesson as a number)."""
    def fail(field: str, expected: str, value: Any) -> StepperError:
        return StepperError(f"progress file {path}: {field} must be {expected}, got {said(value)}: fix or delete it")

    if not isinstance(data["current"], (str, type(None))):
        raise fail("'current'", "a lesson name or null", data["current"])
    for name, entry in data["lessons"].items():
        if not isinstance(entry, dict):
            raise fail(f"lessons['{cut(name)}']", "an object", entry)
        for key in FLAGS:
            if not isinstance(entry.get(key, False), bool):
                raise fail(f"lessons['{cut(name)}'].{key}", "true or false", entry[key])
        for key in COUNTS:
            if type(entry.get(key, 0)) is not int or entry.get(key, 0) < 0:
                raise fail(f"lessons['{cut(name)}'].{key}", "a whole number >= 0", entry[key])


def default_lesson(progress: Progress, lessons: Sequence[Lesson]) -> Lesson:
    """The lesson a command without NAME means, and the one `lesson list` marks: the current one
    while it is not done, else the next one (`next_lesson`), else the current (or last) one."""
    current = None
    if progress.current:
        try:
            current = find_lesson(progress.current, lessons)
        except StepperError:
            pass
    if current is not None and not done(progress, current):
        return current
    return next_lesson(progress, lessons) or current or lessons[-1]


def done(progress: Progress, lesson: Lesson) -> bool:
    """A lesson is done once its exercise passed, or its solution was shown (--give-up)."""
    entry = progress.lesson(lesson.name)
    return bool(entry["passed"] or entry["gave_up"])


def next_lesson(progress: Progress, lessons: Sequence[Lesson], just_passed: Lesson | None = None) -> Lesson | None:
    """The one rule for "next", wherever stepper says it: the first lesson, in order, not done
    yet (`just_passed` counts as done); None when every lesson is done."""
    skip = just_passed.name if just_passed else None
    return next((lesson for lesson in lessons if lesson.name != skip and not done(progress, lesson)), None)
