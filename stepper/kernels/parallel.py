"""Work shared by this machine's cores: threads for big float32 products, BLAS on one thread.

A big float32 product (a weight the weight cache holds decoded) is one long BLAS call per share
of rows, so threads run the shares side by side (NumPy releases the GIL inside the call). FP8
products are different: many short NumPy calls per tile, so they are shared with helper
processes instead (`fp8_workers`). OpenBLAS, left to its own threads, spins a thread on the
other core after every call, which then fights the work that follows (a Kimi K2 decode step
2-3x slower). So `single_threaded_blas()` is called by the command line (and the benchmarks): the
whole process works with stepper's own splits. As a library, stepper runs with BLAS on one
thread the same way (`one_blas_thread`), and gives it back as it found it.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import cache
from typing import TypeVar

Item = TypeVar("Item")
MAX_WORKERS = 8
POOL_THREADS = "stepper-share"  # the start of the name of each thread of the pool
SET_THREADS = ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_", "openblas_set_num_threads")
GET_THREADS = ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_", "openblas_get_num_threads")
GET_CORENAME = ("scipy_openblas_get_corename64_", "openblas_get_corename64_", "openblas_get_corename")


def cores() -> int:
    """Cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))
    except AttributeError:  # no affinity API (macOS, Windows)
        return max(1, min(MAX_WORKERS, os.cpu_count() or 1))


@cache
def _pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(workers, thread_name_prefix=POOL_THREADS)


def split(items: Sequence[Item], work: Callable[[Sequence[Item]], None], workers: int | None = None) -> None:
    """Run work(share) on contiguous shares of items, one share per core; the caller runs the first.

    Exceptions from any share are raised here, after every share has finished. Called from a
    share's own work (a pool thread), it runs there whole: that thread waiting for shares queued
    behind it would never end."""
    n = min(workers or cores(), len(items))
    if n <= 1 or threading.current_thread().name.startswith(POOL_THREADS):
        work(items)
        return
    bounds = [len(items) * k // n for k in range(n + 1)]
    shares = [items[bounds[k] : bounds[k + 1]] for k in range(n)]
    futures = [_pool(n - 1).submit(work, share) for share in shares[1:]]
    try:
        work(shares[0])
    finally:
        for future in futures:
            future.exception()  # wait for every share before raising any error
    for future in futures:
        future.result()


def single_threaded_blas() -> bool:
    """Set the loaded OpenBLAS (NumPy's) to one thread; False when none can be found."""
    setter = _blas_thread_setter()
    if setter is None:
        return False
    setter(1)
    return True


def blas_threads() -> int | None:
    """The threads NumPy's OpenBLAS runs a call on; None when no OpenBLAS can be found."""
    function = _openblas_function(GET_THREADS)
    if function is None:
        return None
    function.restype = ctypes.c_int
    return function()


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """NumPy's OpenBLAS on one thread inside (stepper's own splits use the cores), then on as many
    as it had: a run through the Python API as fast as the command line's, the caller's BLAS left
    as found. Also a decorator."""
    before, setter = blas_threads(), _blas_thread_setter()
    if before is None or setter is None or before == 1:
        yield
        return
    setter(1)
    try:
        yield
    finally:
        setter(before)


def _blas_thread_setter() -> Callable[[int], None] | None:
    function = _openblas_function(SET_THREADS)
    if function is not None:
        function.argtypes = [ctypes.c_int]  # 64-bit-integer builds still take a C int here
    return function


@cache
def _openblas_function(symbols: tuple[str, ...]):
    """The first of these functions that NumPy's OpenBLAS exports (Linux), else None."""
    import numpy  # noqa: F401  (loads NumPy's BLAS library, so its path is in the process's map)

    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line}
    except OSError:  # not Linux: leave BLAS as it is (OPENBLAS_NUM_THREADS=1 does the same)
        return None
    for path in sorted(paths):
        library = ctypes.CDLL(path)
        for symbol in symbols:
            if hasattr(library, symbol):
                return getattr(library, symbol)
    return None


@cache
def openblas_kernels() -> str:
    """The kernels NumPy's OpenBLAS chose for this CPU ('SkylakeX', 'Haswell'...), '' when unknown."""
    core = _openblas_function(GET_CORENAME)
    if core is None:
        return ""
    core.restype = ctypes.c_char_p
    return core().decode(errors="replace")


def blas_description() -> str:
    """NumPy's BLAS as built (name, version) and as it runs here: the kernel OpenBLAS chose for
    this CPU and its threads, e.g. 'scipy-openblas 0.3.31, kernels SkylakeX, 1 thread'."""
    import numpy

    try:
        built = numpy.show_config(mode="dicts")["Build Dependencies"]["blas"]
        name = f"{built.get('name', 'unknown')} {built.get('version', '')}".strip()
    except (KeyError, TypeError, ValueError):
        name = "unknown"
    core = openblas_kernels()
    count = blas_threads()
    if core:
        forced = os.environ.get("OPENBLAS_CORETYPE", "").strip()
        name += f", kernels {core}" + (f" (OPENBLAS_CORETYPE={forced} in the environment)" if forced else "")
    if count is not None:
        name += f", {count} thread{'s' if count != 1 else ''}"
    return name
