"""The work a piece of code does, counted instead of timed: a bound in seconds fails on a slower or
busier machine, a bound on work does not (and still fails on the bug it guards against).

`counted()` measures, over its body: the bytes read with read() calls (/proc/self/io's rchar, the
data of a memory-mapped file not included, nor the modules Python imported meanwhile: a command run
first in a process reads its modules' source or bytecode, however many other tests ran before it
in the same worker), the safetensors tensors handed out and their bytes
(SafetensorsFile.get), and, when asked, the Python lines run (sys.settrace) and the most
allocated at once (tracemalloc, NumPy's arrays included).
"""

from __future__ import annotations

import sys
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from stepper.weights.safetensors_reader import SafetensorsFile

IO = Path("/proc/self/io")


@dataclass
class Work:
    read: int = 0  # bytes read by read() calls (0 where /proc/self/io is missing)
    tensors: int = 0  # tensors SafetensorsFile.get handed out
    tensor_bytes: int = 0  # ... and their bytes
    lines: int = 0  # Python lines run (lines=True)
    peak: int = 0  # the most allocated at once (traced=True)


def bytes_read() -> tuple[int, int]:
    """This process's bytes read by read() calls so far (0 where the kernel does not say), and
    the bytes this reading of /proc/self/io itself adds to that."""
    try:
        text = IO.read_bytes()
    except OSError:
        return 0, 0
    fields = dict(line.split(b": ") for line in text.splitlines())
    return int(fields[b"rchar"]), len(text)


def imported_bytes(names: set[str]) -> int:
    """The bytes Python read to import these modules: each one's cached bytecode where it is there
    and no older than its source, else its source (an extension module is mapped, not read)."""
    total = 0
    for name in names:
        spec = getattr(sys.modules.get(name), "__spec__", None)
        origin = Path(spec.origin) if spec is not None and spec.origin and spec.origin.endswith(".py") else None
        if origin is None or not origin.is_file():
            continue
        cached = Path(spec.cached) if spec.cached else None
        fresh = cached is not None and cached.is_file() and cached.stat().st_mtime >= origin.stat().st_mtime
        total += (cached if fresh else origin).stat().st_size
    return total


@contextmanager
def counted(lines: bool = False, traced: bool = False) -> Iterator[Work]:
    work, get = Work(), SafetensorsFile.get

    def counting_get(self, name):
        array = get(self, name)
        work.tensors, work.tensor_bytes = work.tensors + 1, work.tensor_bytes + array.nbytes
        return array

    def line_tracer(frame, event, arg):
        if event == "line":
            work.lines += 1
        return line_tracer

    before_trace = sys.gettrace()
    modules = set(sys.modules)  # (before the tracing: the set is the counting's, not the body's)
    if traced:
        tracemalloc.start()
    SafetensorsFile.get = counting_get
    if lines:
        sys.settrace(lambda frame, event, arg: line_tracer)
    start, own = bytes_read()
    try:
        yield work
    finally:
        read = bytes_read()[0] - start - own
        if lines:
            sys.settrace(before_trace)
        SafetensorsFile.get = get
        if traced:
            work.peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        work.read = read - imported_bytes(set(sys.modules) - modules)
