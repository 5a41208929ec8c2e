"""No test changes a file outside its own scratch folders: the checkout (sources, lessons,
fixtures, docs) and stepper's default cache and data folders are snapshot before each test and
compared after it (tests/conftest.py's `nothing_else_written`). And no command changes a file
that was in the test's tmp_path before it ran, but for stepper's own places (its cache, data and
lesson folders, and what a --force names): `helpers.cli.stepper` checks each command it runs.

A snapshot is cheap: one lstat per file (inode, size, modification time, kind), no file read; the
checkout's caches (.git, __pycache__, tool caches) are skipped. The default folders are the
session's own (XDG_CACHE_HOME and XDG_DATA_HOME point into the test run's temporary folder), so
a command run without --cache-dir or STEPPER_DATA_DIR writes there, never into the user's home,
and is caught.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

SKIPPED = {".git", "__pycache__", ".ruff_cache", ".pytest_cache", ".mypy_cache", ".hypothesis", ".venv",
           "build", "dist"}

Snapshot = dict[str, tuple[str, int, int, int]]


def snapshot(root: Path, skip: frozenset[Path] = frozenset()) -> Snapshot:
    """Every file and link under root (relative path -> kind, inode, size, mtime in ns), links not
    followed, the folders and files in `skip` left out."""
    found: Snapshot = {}
    skipped = {os.fspath(p) for p in skip}
    folders = [(os.fspath(root), "")]
    while folders:
        where, relative = folders.pop()
        try:
            entries = list(os.scandir(where))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            if entry.path in skipped:
                continue
            name = relative + entry.name
            if entry.is_dir(follow_symlinks=False):
                if entry.name not in SKIPPED and not entry.name.endswith(".egg-info"):
                    folders.append((entry.path, name + os.sep))
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            kind = "link" if stat.S_ISLNK(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
            found[name] = (kind, st.st_ino, st.st_size, st.st_mtime_ns)
    return found


def changes(root: Path, before: Snapshot, after: Snapshot, created: bool = True) -> list[str]:
    """What differs: files created (unless not asked), changed (inode, size or time) or removed under root."""
    out = [f"removed {root / p}" for p in before if p not in after]
    out += [f"changed {root / p}" for p in before if p in after and after[p] != before[p]]
    out += [f"created {root / p}" for p in after if p not in before] if created else []
    return sorted(out)


class Guard:
    """The folders that must stay as they were, snapshot on entry, compared on check(); with
    created=False only the files that were there count (new ones are outputs)."""

    def __init__(self, roots: list[Path], skip: frozenset[Path] = frozenset(), created: bool = True):
        self.roots, self.skip, self.created = roots, skip, created
        self.before = {root: snapshot(root, skip) for root in roots}

    def check(self) -> list[str]:
        return [line for root in self.roots
                for line in changes(root, self.before[root], snapshot(root, self.skip), self.created)]


test_folder: Path | None = None  # the running test's tmp_path, when it has one (set by tests/conftest.py)
OWN_FOLDERS = ("--cache-dir", "--workspace")
OWN_VARIABLES = ("STEPPER_DATA_DIR", "STEPPER_CACHE_DIR", "XDG_CACHE_HOME", "XDG_DATA_HOME")


def command_guard(argv: list[str], cwd: Path, env: dict[str, str | None]) -> Guard | None:
    """A guard over the test's tmp_path for one command: the files there before it must stay as
    they were, but for stepper's own places (its cache and data folders, the lesson workspace,
    and, with --force, every path the command names)."""
    if test_folder is None:
        return None
    own = [cwd / "stepper-lessons"]
    own += [Path(v) for k in OWN_VARIABLES if (v := env.get(k, os.environ.get(k)))]
    own += [cwd / argv[i + 1] for i, a in enumerate(argv[:-1]) if a in OWN_FOLDERS]
    if "--force" in argv:
        own += [cwd / a for a in argv if not a.startswith("-")]
    places = frozenset(Path(q) for p in own for q in (os.path.abspath(p), os.path.realpath(p)))  # a link's target too
    return Guard([test_folder], places, created=False)
