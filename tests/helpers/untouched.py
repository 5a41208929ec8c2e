"""No test changes a file outside its own scratch folders: the checkout (sources, lessons,
fixtures, docs) and stepper's default cache and data folders are snapshot before each test and
compared after it (tests/conftest.py's `nothing_else_written`).

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

SKIPPED = {".git", "__pycache__", ".ruff_cache", ".pytest_cache", ".mypy_cache", ".hypothesis", ".venv", "build", "dist"}

Snapshot = dict[str, tuple[str, int, int, int]]


def snapshot(root: Path) -> Snapshot:
    """Every file and link under root (relative path -> kind, inode, size, mtime in ns), links not followed."""
    found: Snapshot = {}
    for where, folders, names in os.walk(root):
        folders[:] = [f for f in folders if f not in SKIPPED and not f.endswith(".egg-info")]
        for name in names + [f for f in folders if os.path.islink(os.path.join(where, f))]:
            path = os.path.join(where, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            kind = "link" if stat.S_ISLNK(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
            found[os.path.relpath(path, root)] = (kind, st.st_ino, st.st_size, st.st_mtime_ns)
    return found


def changes(root: Path, before: Snapshot, after: Snapshot) -> list[str]:
    """What differs: files created, changed (inode, size or time) or removed under root."""
    out = [f"removed {root / p}" for p in before if p not in after]
    out += [f"changed {root / p}" for p in before if p in after and after[p] != before[p]]
    out += [f"created {root / p}" for p in after if p not in before]
    return sorted(out)


class Guard:
    """The folders a test must leave as they were, snapshot on entry, compared on check()."""

    def __init__(self, roots: list[Path]):
        self.roots = roots
        self.before = {root: snapshot(root) for root in roots}

    def check(self) -> list[str]:
        return [line for root in self.roots for line in changes(root, self.before[root], snapshot(root))]
