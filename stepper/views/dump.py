"""`--dump FILE.safetensors`: every emitted tensor under its canonical name, in one file.

Tensors are stored as emitted (float32; int64 for expert indices). safetensors orders its
header by name, so the execution order is kept in the metadata entry `order` (a JSON list).
The file is written to a temporary name and renamed, so a failed run leaves nothing half-written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from stepper.errors import StepperError
from stepper.trace import Recorder


def check_writable(path: Path, force: bool) -> None:
    """Refuse to overwrite an existing file unless asked; fail early if the folder is missing."""
    if path.suffix != ".safetensors":
        raise StepperError(f"--dump {path}: the file name must end in .safetensors")
    if path.exists() and not force:
        raise StepperError(f"--dump {path}: file exists; pass --force to overwrite it")
    if not path.parent.is_dir():
        raise StepperError(f"--dump {path}: folder {path.parent} does not exist")


def write_dump(path: Path, recorder: Recorder, metadata: dict[str, str]) -> None:
    tensors = {e.name: np.ascontiguousarray(e.array) for e in recorder.events}
    meta = {"format": "stepper-dump", "order": json.dumps([e.name for e in recorder.events]), **metadata}
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        save_file(tensors, str(tmp), metadata=meta)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
