"""Output files: `--dump FILE.safetensors` (every shown tensor under its canonical name) and the
way every output file is written.

Tensors are stored as emitted (float32; int64 for expert indices), in execution order, which the
metadata entry `order` (a JSON list) also keeps. A tensor too large to hold (a long prompt's
attention scores, made in tiles) is written block by block; a tensor over the dump limit
(DUMP_LIMIT_GB, raised with --dump-limit-gb) is refused in one line before the run starts.

The dump's place is checked before the run and the file written after it through
`stepper.files` (an existing file replaced only with --force and only if it is a dump; never a
link, a folder or a device; written beside its place and renamed).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path

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
    files.check_output("--dump", path, force, is_dump, DUMP_KIND)


def write_dump(path: Path, recorder: Recorder, metadata: dict[str, str], force: bool = False) -> None:
    """Every recorded tensor, a tensor made in tiles (a long prompt's attention) block by block."""
    entries = [Entry(e.name, SAFETENSORS_DTYPE[np.dtype(e.array.dtype)], tuple(e.array.shape), maker(e.array))
               for e in recorder.events]
    meta = {"format": DUMP_FORMAT, "order": json.dumps([e.name for e in recorder.events]), **metadata}
    files.write_output("--dump", path, lambda f: write_safetensors_into(f, entries, meta), force, is_dump, DUMP_KIND)


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
