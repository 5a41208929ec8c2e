"""Output files: `--dump FILE.safetensors` (every shown tensor under its canonical name) and the
way every output file is written.

Tensors are stored as emitted (float32; int64 for expert indices), in execution order, which the
metadata entry `order` (a JSON list) also keeps. A tensor too large to hold (a long prompt's
attention scores, made in tiles) is written block by block; a tensor over the dump limit
(DUMP_LIMIT_GB, raised with --dump-limit-gb) is refused in one line before the run starts.

The dump's place is checked before the run and the file written after it through
`stepper.files` (an existing file replaced only with --force and only if it is a dump stepper wrote,
unchanged since: a dump notes the sha256 of its bytes, `written_sha256`; never a link, a folder
or a device; written beside its place and renamed).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from stepper import files
from stepper.errors import StepperError
from stepper.seams.trace import Recorder
from stepper.tensors.tensor import Tensor, held
from stepper.weights.safetensors_reader import SafetensorsFile
from stepper.weights.safetensors_writer import Entry, write_safetensors_into

DUMP_FORMAT = "stepper-dump"
DUMP_KIND = "a dump stepper wrote"
DUMP_LIMIT_GB = 2.0  # a dumped tensor may be this large unless --dump-limit-gb says more
SAFETENSORS_DTYPE = {np.dtype(t): name for t, name in (("float64", "F64"), ("float32", "F32"), ("float16", "F16"),
                                                        ("int64", "I64"), ("int32", "I32"), ("uint8", "U8"))}

BLANK = files.SEAL_BLANK.encode()  # the dump's own seal, as hashed (files.SEAL)
CHUNK = 1 << 20


def is_dump(path: Path) -> bool:
    """Whether a file is a dump stepper wrote (a safetensors file of format stepper-dump), unchanged
    since: its bytes still hash to the seal it notes, files.SEAL (a dump noting none, written before
    stepper noted it, is not known to have changed)."""
    try:
        with SafetensorsFile(path) as f:
            meta, header = f.metadata, f.header_size
        if meta.get("format") != DUMP_FORMAT:
            return False
        noted = meta.get(files.SEAL)
        return noted is None or digest(path, header, noted.encode()) == noted
    except (StepperError, OSError):
        return False


def digest(path: Path, header: int, noted: bytes) -> str | None:
    """The sha256 of a dump's bytes with its noted seal (in its first `header` bytes) read as BLANK,
    in chunks (a dump may be gigabytes); None when the header does not hold it once."""
    with open(path, "rb") as f:
        head = f.read(header)
        at = head.find(member(noted))
        if at < 0 or head.find(member(noted), at + 1) >= 0:
            return None
        sha = hashlib.sha256(head.replace(member(noted), member(BLANK)))
        while chunk := f.read(CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


SEALED_AS = f'"{files.SEAL}":"'.encode()  # the seal's member in the header, its value next


def member(value: bytes) -> bytes:
    return SEALED_AS + value + b'"'


def write_sealed(f: BinaryIO, entries: list[Entry], meta: dict[str, str]) -> None:
    """The dump, then its seal written into its header: the sha256 of every byte as written (BLANK
    for the seal)."""
    seen = hashlib.sha256()
    header = write_safetensors_into(f, entries, {**meta, files.SEAL: files.SEAL_BLANK}, seen)
    f.seek(8 + header.index(member(BLANK)) + len(SEALED_AS))
    f.write(seen.hexdigest().encode())
    f.seek(0, os.SEEK_END)


def check_writable(path: Path, force: bool) -> None:
    if path.suffix != ".safetensors":
        raise StepperError(f"--dump {path}: the file name must end in .safetensors")
    files.check_output("--dump", path, force, is_dump, DUMP_KIND)


def write_dump(path: Path, recorder: Recorder, metadata: dict[str, str], force: bool = False) -> None:
    """Every recorded tensor, a tensor made in tiles (a long prompt's attention) block by block."""
    entries = [Entry(e.name, SAFETENSORS_DTYPE[np.dtype(e.array.dtype)], tuple(e.array.shape), maker(e.array))
               for e in recorder.events]
    meta = {"format": DUMP_FORMAT, "order": json.dumps([e.name for e in recorder.events]), **metadata}
    files.write_output("--dump", path, lambda f: write_sealed(f, entries, meta), force, is_dump, DUMP_KIND)


def maker(array: Tensor) -> Callable[[], np.ndarray | Iterator[np.ndarray]]:
    if not held(array):
        return array.in_order
    return lambda: np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))


def dump_limit(limit_gb: float | None) -> float:
    """The limit --dump-limit-gb gives (DUMP_LIMIT_GB when not given): a finite number of GiB above
    0 (a NaN limit would let any tensor through, a negative one none)."""
    if limit_gb is None:
        return DUMP_LIMIT_GB
    if not (0 < limit_gb < math.inf):
        raise StepperError(f"--dump-limit-gb must be a finite number > 0 (GiB), got {limit_gb:g}")
    return limit_gb


def check_dump_sizes(sizes: list[tuple[str, str, int]], limit_gb: float) -> None:
    """Refuse, before the run, a dump with a tensor over the limit: (name, shape, bytes) each."""
    over = [(name, shape, n) for name, shape, n in sizes if n > limit_gb * 2**30]
    if over:
        name, shape, n = max(over, key=lambda x: x[2])
        more = f" (and {len(over) - 1} more)" if len(over) > 1 else ""
        raise StepperError(f"--dump: {name} {shape} float32 is {n / 2**30:.3g} GiB{more}, over the dump limit of "
                           f"{limit_gb:g} GiB; raise it with --dump-limit-gb, or leave it out with --only")
