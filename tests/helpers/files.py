"""Files and maps for the tests: safetensors written by the reference serializer, the pages of a
file in the page cache, this process's memory maps, a folder's files linked into another, sizes."""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Collection
from pathlib import Path

import numpy as np
import safetensors


def reference_write(path: Path, arrays: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
    """Write with the safetensors package's own low-level serializer, which takes BF16 and FP8."""
    arrays = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    if hasattr(safetensors, "TensorSpec"):  # newer releases (0.8 has it); older ones take dicts
        specs = {
            k: safetensors.TensorSpec(dtype=v.dtype.name, shape=list(v.shape), data_ptr=v.ctypes.data,
                                      data_len=v.nbytes)
            for k, v in arrays.items()
        }
    else:
        specs = {k: {"dtype": v.dtype.name, "shape": list(v.shape), "data": v.tobytes()} for k, v in arrays.items()}
    safetensors.serialize_file(specs, str(path), metadata=metadata)


def resident_pages(path: Path) -> np.ndarray:
    """Which of the file's pages are in the page cache (mincore on a fresh, untouched mapping)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size = path.stat().st_size
    pages = np.zeros(-(-size // mmap.PAGESIZE), dtype=np.uint8)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        view = np.frombuffer(m, dtype=np.uint8)
        assert libc.mincore(view.ctypes.data, size, pages.ctypes.data) == 0, ctypes.get_errno()
        del view
    return pages & 1 == 1


def mappings() -> list[dict]:
    """This process's mappings from /proc/self/smaps: address range, file (or ""), and fields."""
    found = []
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):  # "low-high perms offset dev inode [path]"
            low, high = (int(a, 16) for a in head[0].split("-"))
            path = line.split(maxsplit=5)[5].strip() if len(head) > 5 else ""  # a path may hold spaces
            found.append({"low": low, "high": high, "path": path})
        elif head and found:
            found[-1][head[0].rstrip(":")] = head[1:]
    return found


def linked(source: Path, folder: Path, *, but: Collection[str] = (), copied: bool = False) -> Path:
    """folder (made if need be) with a link to every file of source but those named in `but`: left
    out, or with copied, copied (to be changed)."""
    folder.mkdir(exist_ok=True)
    for file in source.iterdir():
        if file.name not in but:
            (folder / file.name).symlink_to(file)
        elif copied:
            (folder / file.name).write_bytes(file.read_bytes())
    return folder


def size_of(path: Path) -> int:
    """Bytes of a file, or of every file under a folder (0 for nothing there)."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size if path.is_file() else 0
