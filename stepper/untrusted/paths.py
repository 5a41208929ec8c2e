"""What is at a path a user gave (a checkpoint folder, its config.json, its index), looked at once
with one clear line when it cannot be.

Python 3.11's Path.exists() and is_file() raise PermissionError when a folder on the way cannot
be searched (a traceback), and say False for a loop of symbolic links (reported as a missing
file). `found` says which it was instead; a folder is also checked to be searchable and listable
here, so that no later exists() raises and no glob() finds it silently empty.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from stepper.errors import StepperError
from stepper.untrusted import cut

PATH_MAX = 4096  # Linux's longest path: a longer one names nothing (and is shown cut to it)


def found(path: Path) -> str | None:
    """'folder', 'file' or 'other' (a FIFO, a device, a socket) at `path`, links followed; None when
    nothing is there. A path that cannot be looked at, or a folder that cannot be searched or listed,
    is a StepperError naming it and why."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise unreadable(path, e) from None
    if stat.S_ISDIR(mode):
        _check_readable_folder(path)
        return "folder"
    return "file" if stat.S_ISREG(mode) else "other"


def regular_file(path: Path, expected: str, option: str = "") -> None:
    """`path` is a regular file (links followed), else one line naming it (after the `option` it was given to):
    no such file, or what is there instead of the `expected` file (a folder, a FIFO that would block the read)."""
    there = found(path)
    if there != "file":
        said = {None: "no such file", "folder": f"is a folder; expected {expected}"}
        named = f"{option} {cut(path, PATH_MAX)}" if option else cut(path, PATH_MAX)
        raise StepperError(f"{named}: {said.get(there, f'is not a regular file; expected {expected}')}")


def unreadable(path: Path, e: OSError) -> StepperError:
    """The one line for a path the system would not let stepper look at or read."""
    return StepperError(f"{cut(path, PATH_MAX)}: cannot be read ({why(e)})")


def why(e: OSError) -> str:
    """An OSError's reason in words; a loop of symbolic links named as one."""
    if e.errno == errno.ELOOP:
        return "a symlink loop: too many levels of symbolic links"
    return (e.strerror or type(e).__name__).lower()


def _check_readable_folder(path: Path) -> None:
    """A folder's entries can be looked up (search permission: stat of its '.') and listed (read)."""
    try:
        os.stat(os.path.join(path, "."))  # (pathlib drops a trailing ".")
        with os.scandir(path) as entries:
            next(entries, None)
    except OSError as e:
        raise unreadable(path, e) from None
