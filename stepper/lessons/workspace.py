"""The learner's workspace: one exercise file `NAME.py` per lesson, default `./stepper-lessons/`.

The learner's file is never lost: `reset` first copies it (unless it is the stub) to a new backup (`NAME.py.bak`, then
`NAME.py.bak2`, `NAME.py.bak3`, ...: an existing backup is never written over), and no file is
written through a link.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from stepper import files
from stepper.errors import StepperError
from stepper.lessons.schema import Lesson
from stepper.untrusted import shown

WORKSPACE = Path("stepper-lessons")
MAX_BACKUPS = 10_000


@dataclass(frozen=True)
class Workspace:
    root: Path = WORKSPACE

    def file(self, lesson: Lesson) -> Path:
        return self.root / f"{lesson.name}.py"

    def ensure(self, lesson: Lesson) -> tuple[Path, bool]:
        """The learner's exercise file, copied from the stub if it does not exist yet (never overwritten)."""
        path = self.file(lesson)
        found = files.kind(path)
        if found == "file":
            return path, False
        if found is not None:
            raise StepperError(f"{shown(path)}: is a {found}, not an exercise file; move it away first")
        try:
            files.make_folder(self.root)
            files.write_new(path, lesson.stub.read_bytes())
        except OSError as e:
            raise StepperError(f"cannot create {shown(path)} ({e.strerror or e})") from None
        return path, True

    def existing(self, lesson: Lesson) -> Path:
        path = self.file(lesson)
        if not path.is_file():
            option = f" --workspace {shlex.quote(str(self.root))}" if self.root != WORKSPACE else ""
            raise StepperError(f"no exercise file {path}: `stepper lesson start {lesson.name}{option}` creates it")
        return path

    def reset(self, lesson: Lesson) -> tuple[Path, Path | None]:
        """Put the stub back; an existing file other than the stub is kept first as a new backup
        (the next free NAME.py.bakN)."""
        path = self.file(lesson)
        found = files.kind(path)
        if found not in (None, "file"):
            raise StepperError(f"{shown(path)}: is a {found}, not an exercise file; stepper does not write through it")
        backup, stub = None, lesson.stub.read_bytes()
        try:
            files.make_folder(self.root)
            if found == "file" and path.read_bytes() != stub:  # the stub itself needs no backup
                backup = new_backup(path)
            files.write_bytes_atomically(path, stub)
        except OSError as e:
            raise StepperError(f"cannot reset {shown(path)} ({e.strerror or e})") from None
        return path, backup


def new_backup(path: Path) -> Path:
    """The file's bytes copied to the first backup name that is free (created exclusively)."""
    data = path.read_bytes()
    for n in range(1, MAX_BACKUPS + 1):
        backup = path.with_name(f"{path.name}.bak" + (str(n) if n > 1 else ""))
        try:
            files.write_new(backup, data)
            return backup
        except FileExistsError:
            continue
    raise StepperError(f"{shown(path)}: {MAX_BACKUPS} backups exist already; remove old ones to reset again")
