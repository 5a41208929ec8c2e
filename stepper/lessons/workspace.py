"""The learner's workspace: one exercise file `NAME.py` per lesson, default `./stepper-lessons/`."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from stepper.errors import StepperError
from stepper.lessons.schema import Lesson

WORKSPACE = Path("stepper-lessons")


@dataclass(frozen=True)
class Workspace:
    root: Path = WORKSPACE

    def file(self, lesson: Lesson) -> Path:
        return self.root / f"{lesson.name}.py"

    def ensure(self, lesson: Lesson) -> tuple[Path, bool]:
        """The learner's exercise file, copied from the stub if it does not exist yet (never overwritten)."""
        path = self.file(lesson)
        if path.exists():
            return path, False
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(lesson.stub, path)
        except OSError as e:
            raise StepperError(f"cannot create {path} ({e})") from None
        return path, True

    def existing(self, lesson: Lesson) -> Path:
        path = self.file(lesson)
        if not path.is_file():
            raise StepperError(f"no exercise file {path}: `stepper lesson start {lesson.name}` creates it"
                               + (f" (workspace {self.root})" if self.root != WORKSPACE else ""))
        return path

    def reset(self, lesson: Lesson) -> tuple[Path, Path | None]:
        """Put the stub back; an existing file is kept as NAME.py.bak."""
        path = self.file(lesson)
        backup = None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            if path.exists():
                backup = path.with_name(path.name + ".bak")
                shutil.copyfile(path, backup)
            shutil.copyfile(lesson.stub, path)
        except OSError as e:
            raise StepperError(f"cannot reset {path} ({e})") from None
        return path, backup
