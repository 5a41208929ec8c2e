"""Every file stepper writes or removes, anywhere, goes through here (an architecture test holds
every other module to it).

The promises, kept in one place:
- No link is followed that stepper did not make: new files are created exclusively and without
  following a link (O_CREAT | O_EXCL | O_NOFOLLOW), files are updated through O_NOFOLLOW and only
  when they have no other name (no hard link), the folders made are checked (lstat) not to be
  links, and a link found at an output's place is refused, never written through.
- Nothing stepper did not write is replaced: an existing output is replaced only with --force,
  and only when the caller recognises it as a file of its own kind (a dump, a report, a recorded
  session, a folder synth or export wrote; the cache knows its files by their ledgers).
- Writes are atomic: the bytes go into a temporary file created exclusively beside the place,
  then renamed into it; without --force the rename cannot replace a file that appeared meanwhile.
- Only what stepper wrote is removed: single files the caller owns, empty folders, and the
  temporary folders made here.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from stepper.errors import StepperError
from stepper.untrusted import shown

NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
UPDATE = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
# A file stepper wrote notes its sha256 under SEAL: that of its bytes with the noted value as SEAL_BLANK
# (fixtures.sealed: a manifest, a verify report; views.dump: a dump), so that --force can tell one changed since.
SEAL, SEAL_BLANK = "written_sha256", "0" * 64


# -- what is at a place ------------------------------------------------------------------------------


def kind(path: Path) -> str | None:
    """'file', 'folder', 'link' or 'other' (a FIFO, a device, a socket) as found, links not
    followed; None when nothing is there."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise StepperError(f"{shown(path)}: cannot look at it ({e.strerror})") from None
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISREG(mode):
        return "file"
    return "folder" if stat.S_ISDIR(mode) else "other"


# -- folders ------------------------------------------------------------------------------------------


def make_folder(path: Path, within: Path | None = None) -> None:
    """`path` and its missing parents as folders. Below `within` (a folder stepper keeps, such as
    the cache), no part of the path may be a link: one found is refused, never followed."""
    parts = [path, *path.parents]
    for part in reversed(parts):
        if within is not None and part != within and within in part.parents:
            found = kind(part)
            if found == "folder":
                continue
            if found is not None:
                raise StepperError(f"{shown(part)}: is a {found}, not a folder stepper made; "
                                   "stepper does not write through it (remove it, or choose another folder)")
        elif part.is_dir():
            continue
        try:
            os.mkdir(part)
        except FileExistsError:
            if kind(part) != "folder":
                raise StepperError(f"{shown(part)}: is not a folder; stepper does not write through it") from None
        except OSError as e:
            raise StepperError(f"{shown(part)}: cannot make the folder ({e.strerror})") from None


def temp_folder(beside: Path) -> Path:
    """A new, empty folder beside `beside`, made here (so later writes into it follow no foreign link)."""
    for _ in range(100):
        folder = beside.with_name(f".{beside.name}.partial-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            os.mkdir(folder)
            return folder
        except FileExistsError:
            continue
        except OSError as e:
            raise StepperError(f"{shown(beside)}: cannot write in {shown(beside.parent)} ({e.strerror})") from None
    raise StepperError(f"{shown(beside)}: cannot make a temporary folder beside it")


def remove_temp_folder(folder: Path) -> None:
    """A folder made by temp_folder (or moved out of the way by replace_folder), and what stepper
    wrote into it. A link in it is removed, not followed."""
    if kind(folder) == "folder":
        shutil.rmtree(folder, ignore_errors=True)


def replace_folder(new: Path, out: Path) -> None:
    """Move a finished folder into place; an existing one (the caller has checked it is stepper's)
    goes only after, and nothing of it is left beside the new one."""
    if kind(out) is None:
        os.rename(new, out)
        return
    old = out.with_name(f".{out.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
    os.rename(out, old)
    try:
        os.rename(new, out)
    except OSError:
        os.rename(old, out)  # put it back
        raise
    remove_temp_folder(old)


def move_folder(src: Path, dst: Path) -> None:
    """A folder stepper wrote moved to a new place (refused if the place is taken)."""
    if kind(dst) is not None:
        raise StepperError(f"{shown(dst)}: already exists; nothing was moved there")
    os.rename(src, dst)


def remove_empty_folder(path: Path) -> bool:
    """The folder removed if it is empty (and not a link); whether it was."""
    if kind(path) != "folder":
        return False
    try:
        os.rmdir(path)
    except OSError:
        return False
    return True


# -- files ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def new_file(path: Path) -> Iterator[BinaryIO]:
    """A file created for writing that did not exist before (never through a link); removed again
    if the writing fails."""
    fd = os.open(path, NEW, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise


def write_new(path: Path, data: bytes | str) -> None:
    """A new file holding `data` (text as UTF-8)."""
    with new_file(path) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


def _temp_beside(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


def write_atomically(path: Path, write: Callable[[BinaryIO], None], replace: bool = True) -> None:
    """`write(f)` into a temporary file made exclusively beside `path`, then renamed into place.
    With replace=False a file that is at the place by then is not replaced (FileExistsError).
    A failure leaves no temporary file behind. OSError is the caller's to word."""
    for _ in range(100):
        tmp = _temp_beside(path)
        try:
            fd = os.open(tmp, NEW, 0o666)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(errno.EEXIST, "no free temporary name", str(path))
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        if replace:
            os.replace(tmp, path)
        else:
            _publish_new(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _publish_new(tmp: Path, path: Path) -> None:
    """tmp renamed to path only if nothing is there: a hard link cannot replace a file."""
    try:
        os.link(tmp, path, follow_symlinks=False)
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        if kind(path) is not None:  # a file system without hard links: checked, then renamed
            raise FileExistsError(errno.EEXIST, "exists", str(path)) from None
        os.replace(tmp, path)


def new_sparse_file(path: Path, size: int) -> None:
    """A new file of `size` bytes that holds none yet (a hole, taking no disk)."""
    with new_file(path) as f:
        os.ftruncate(f.fileno(), size)


def write_bytes_atomically(path: Path, data: bytes | str) -> None:
    write_atomically(path, lambda f: f.write(data.encode("utf-8") if isinstance(data, str) else data))


def open_for_update(path: Path) -> int:
    """A file descriptor to write into an existing regular file stepper made (never through a link,
    symbolic or hard)."""
    try:
        fd = os.open(path, UPDATE)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise StepperError(f"{shown(path)}: is a link; stepper does not write through links it did not make") \
                from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise StepperError(f"{shown(path)}: is not a regular file; stepper does not write into it")
    if st.st_nlink != 1:  # a hard link: the same bytes under another name, perhaps a user's
        os.close(fd)
        raise StepperError(f"{shown(path)}: has {st.st_nlink} names (hard links); stepper does not write into "
                           "a file that is also elsewhere")
    return fd


def open_lock(path: Path) -> int:
    """A lock file's descriptor (made if missing; never through a link)."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise StepperError(f"{shown(path)}: is a link; stepper does not write through links it did not make") \
                from None
        raise


def remove_file(path: Path) -> bool:
    """A file stepper wrote removed (a link at its place is removed itself, nothing it points at;
    a folder or device is left); whether something was removed."""
    if kind(path) not in ("file", "link"):
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def anonymous_file() -> int:
    """A file descriptor of a file with no name: a memfd (Linux), else an unlinked temporary file."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("stepper-scratch")
    fd, path = tempfile.mkstemp(prefix="stepper-scratch-")
    os.unlink(path)
    return fd


# -- outputs the user names -------------------------------------------------------------------------


def check_output(option: str, path: Path, force: bool, ours: Callable[[Path], bool], what: str) -> None:
    """Refuse an output place that cannot take the file, or a file that --force may not replace:
    a link, a folder, a FIFO or device is never written; an existing file only with --force and
    only when `ours` recognises it as `what`."""
    found = kind(path)
    if found == "folder":
        raise StepperError(f"{option} {shown(path)}: is a folder; give a file name inside it")
    if found == "link":
        raise StepperError(f"{option} {shown(path)}: is a link; stepper does not write through links, give a new file "
                           "name")
    if found == "other":
        raise StepperError(f"{option} {shown(path)}: is not a regular file; give a new file name")
    if found == "file":  # whether it is ours looked at first: --force is offered only where it would be taken
        if not ours(path):
            advice = "so it was not touched" if force else "so give another name"
            raise StepperError(f"{option} {shown(path)}: is not {what}; --force replaces only {what}, {advice}")
        if not force:
            raise StepperError(f"{option} {shown(path)}: file exists; pass --force to overwrite it, or give another "
                               "name")
    if not path.parent.is_dir():
        raise StepperError(f"{option} {shown(path)}: folder {shown(path.parent)} does not exist")
    probe = _temp_beside(path)
    try:
        os.close(os.open(probe, NEW, 0o600))
        os.unlink(probe)
    except OSError as e:
        raise StepperError(f"{option} {shown(path)}: cannot write in {shown(path.parent)} ({e.strerror})") from None


def write_output(option: str, path: Path, write: Callable[[BinaryIO], None], force: bool,
                 ours: Callable[[Path], bool], what: str) -> None:
    """An output file the user named, checked again (check_output: the place may have changed since
    the check before the run) and written atomically; a file that appears at the last moment is
    not replaced."""
    check_output(option, path, force, ours, what)
    try:
        write_atomically(path, write, replace=kind(path) == "file")
    except FileExistsError:
        raise StepperError(f"{option} {shown(path)}: a file appeared there while writing; it was not touched") from None
    except OSError as e:
        raise StepperError(f"{option} {shown(path)}: cannot write it ({e.strerror or e})") from None
