"""JSON files as stepper reads them: one clear line naming the file when they are not sound.

Python's `json` lets through what a JSON file must not hold, and readers elsewhere take silently:
a key given twice in one object (the last one wins), and NaN / Infinity, which are not JSON.
Both are refused here, with the key or the literal named. So is a value nested more than
MAX_DEPTH deep, counted before the parser runs (100,000 brackets in a row would take it to
Python's recursion limit).
"""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path
from typing import Any

import numpy as np

from stepper.errors import StepperError

MAX_DEPTH = 100  # arrays and objects inside one another (a fixture manifest: 5)
MAX_BYTES = 64 << 20  # a config.json or an index: a few MB at most (DeepSeek-V3's index: 9 MB)
MANIFEST_BYTES = 1 << 30  # a fixture manifest lists every tensor of every step: larger, still bounded
STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, escapes included
STEPS = bytes.maketrans(b"[{]}" + bytes(b for b in range(256) if b not in b"[{]}"), b"\x01\x01\xff\xff" + bytes(252))


def read_json(path: Path, what: str = "", limit: int = MAX_BYTES) -> Any:
    """The JSON value in a file of at most `limit` bytes; a missing, unreadable, special (a FIFO, a
    device) or unsound file is one StepperError."""
    try:
        text = read_regular(path, limit, what).decode("utf-8")
    except FileNotFoundError:
        raise StepperError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise StepperError(f"{path}: is a directory, expected {what or 'a JSON file'}") from None
    except UnicodeDecodeError as e:
        raise StepperError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise StepperError(f"{path}: cannot be read ({e.strerror})") from None
    return parse_json(text, str(path))


def read_regular(path: Path, limit: int, what: str) -> bytes:
    """A regular file's bytes, refused from its metadata, before it is opened (opening a FIFO with no
    writer would wait forever), when it is something else or larger than `limit`."""
    st = path.stat()
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError
    if not stat.S_ISREG(st.st_mode):
        raise StepperError(f"{path}: is not a regular file, expected {what or 'a JSON file'}")
    if st.st_size > limit:
        raise StepperError(f"{path}: {st.st_size:,} bytes, more than {what or 'a JSON file'} holds (at most "
                           f"{limit >> 20} MiB)")
    with path.open("rb") as f:
        return f.read(st.st_size + 1)  # (a buffer of the size asked for is made at once)


def parse_json(text: str, where: str) -> Any:
    """The JSON value of `text`; `where` (a file name) starts every error."""

    def no_constants(literal: str) -> Any:
        raise StepperError(f"{where}: {literal} is not JSON")

    def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                raise StepperError(f"{where}: key {key!r} appears twice in one object")
            result[key] = value
        return result

    if depth(text) > MAX_DEPTH:
        raise StepperError(f"{where}: JSON nested too deeply (more than {MAX_DEPTH} arrays or objects inside one "
                           "another)")
    try:
        return json.loads(text, parse_constant=no_constants, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as e:
        raise StepperError(f"{where}: not valid JSON ({e.msg}: line {e.lineno} column {e.colno})") from None
    except RecursionError:
        raise StepperError(f"{where}: JSON nested too deeply") from None


def depth(text: str) -> int:
    """How deep the arrays and objects of a JSON text nest, brackets inside strings not counted
    (an unterminated string's are: an overestimate for text that is no JSON anyway)."""
    steps = STRING.sub("", text).encode("utf-8", "surrogatepass").translate(STEPS)  # +1 opens, -1 closes, 0 else
    return int(np.cumsum(np.frombuffer(steps, np.int8), dtype=np.int32).max(initial=0))
