"""Output files: `--dump FILE.safetensors` (every shown tensor under its canonical name) and the
way every output file is written.

Tensors are stored as emitted (float32; int64 for expert indices), in execution order, which the
metadata entry `order` (a JSON list) also keeps. A tensor too large to hold (a long prompt's
attention scores, made in tiles) is written block by block; a tensor over the dump limit
(DUMP_LIMIT_GB, raised with --dump-limit-gb) is refused in one line before the run starts.

An output file is checked before the run (its folder exists and takes a new file; an existing
file is replaced only with --force, and only when it is of the kind stepper writes there, never a
folder or a device), then written beside its place and renamed, with the permissions any new file
gets (0666 less the umask): a failed or interrupted run leaves nothing half-written behind.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from safetensors import SafetensorError

from stepper.errors import StepperError
from stepper.tiled import Tiled
from stepper.trace import Recorder
from stepper.weights.safetensors_reader import SafetensorsFile
from stepper.weights.safetensors_writer import Entry, write_safetensors

DUMP_FORMAT = "stepper-dump"
DUMP_LIMIT_GB = 2.0  # a dumped tensor may be this large unless --dump-limit-gb says more
SAFETENSORS_DTYPE = {np.dtype(t): name for t, name in (("float64", "F64"), ("float32", "F32"), ("float16", "F16"),
                                                        ("int64", "I64"), ("int32", "I32"), ("uint8", "U8"))}


def check_output(option: str, path: Path, force: bool, ours: Callable[[Path], bool], what: str) -> None:
    """Refuse an output place that cannot take the file, or a file that --force may not replace."""
    try:
        st = path.stat()
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise StepperError(f"{option} {path}: cannot use it ({e.strerror})") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise StepperError(f"{option} {path}: is a folder; give a file name inside it")
        if not stat.S_ISREG(st.st_mode):
            raise StepperError(f"{option} {path}: is not a regular file; give a new file name")
        if not force:
            raise StepperError(f"{option} {path}: file exists; pass --force to overwrite it")
        if not ours(path):
            raise StepperError(f"{option} {path}: is not {what}; --force replaces only {what}, so it was not touched")
    if not path.parent.is_dir():
        raise StepperError(f"{option} {path}: folder {path.parent} does not exist")
    probe = beside(path, "probe")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        probe.unlink()
    except OSError as e:
        raise StepperError(f"{option} {path}: cannot write in {path.parent} ({e.strerror})") from None


def beside(path: Path, what: str) -> Path:
    return path.with_name(f".{path.name}.{what}-{os.getpid()}")


def new_file_mode() -> int:
    """0666 less the umask: the permissions `open` gives a new file."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_atomically(option: str, path: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` beside `path`, then rename it into place; the temporary file never stays."""
    tmp = beside(path, "tmp")
    try:
        write(tmp)
        os.chmod(tmp, new_file_mode())
        os.replace(tmp, path)
    except (OSError, SafetensorError) as e:
        raise StepperError(f"{option} {path}: cannot write it ({getattr(e, 'strerror', None) or e})") from None
    finally:
        tmp.unlink(missing_ok=True)


def is_dump(path: Path) -> bool:
    """Whether a file is a dump stepper wrote (a safetensors file of format stepper-dump)."""
    try:
        with SafetensorsFile(path) as f:
            return f.metadata.get("format") == DUMP_FORMAT
    except (StepperError, OSError):
        return False


def check_writable(path: Path, force: bool) -> None:
    if path.suffix != ".safetensors":
        raise StepperError(f"--dump {path}: the file name must end in .safetensors")
    check_output("--dump", path, force, is_dump, "a dump stepper wrote")


def write_dump(path: Path, recorder: Recorder, metadata: dict[str, str]) -> None:
    """Every recorded tensor, a tensor made in tiles (a long prompt's attention) block by block."""
    entries = [Entry(e.name, SAFETENSORS_DTYPE[np.dtype(e.array.dtype)], tuple(e.array.shape), maker(e.array))
               for e in recorder.events]
    meta = {"format": DUMP_FORMAT, "order": json.dumps([e.name for e in recorder.events]), **metadata}
    write_atomically("--dump", path, lambda tmp: write_safetensors(tmp, entries, meta))


def maker(array: np.ndarray | Tiled) -> Callable[[], np.ndarray | Iterator[np.ndarray]]:
    if isinstance(array, Tiled):
        return array.blocks
    return lambda: np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))


def check_dump_sizes(sizes: list[tuple[str, str, int]], limit_gb: float) -> None:
    """Refuse, before the run, a dump with a tensor over the limit: (name, shape, bytes) each."""
    over = [(name, shape, n) for name, shape, n in sizes if n > limit_gb * 2**30]
    if over:
        name, shape, n = max(over, key=lambda x: x[2])
        more = f" (and {len(over) - 1} more)" if len(over) > 1 else ""
        raise StepperError(f"--dump: {name} {shape} float32 is {n / 2**30:.3g} GiB{more}, over the dump limit of "
                           f"{limit_gb:g} GiB; raise it with --dump-limit-gb, or leave it out with --only")
