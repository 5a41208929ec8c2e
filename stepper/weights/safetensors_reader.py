"""Reads safetensors files strictly and lazily, BF16 and FP8 tensors included, as NumPy arrays.

This module owns the file format: an 8-byte little-endian header length N, N bytes of UTF-8
JSON (tensor name -> dtype, shape, data_offsets, plus an optional `__metadata__` map of
strings), then the data section. Opening a file reads and checks only the header; it rejects
everything the reference Rust reader rejects, and more (duplicate keys, unknown keys, NaN
literals, shapes NumPy cannot hold), with a `StepperError` naming the file and the tensor.

Tensor bytes are never read at open. The first `get` memory-maps the file read-only, and each
tensor is a read-only NumPy view of its bytes in that map, so only the tensors actually used
are ever read from disk (in the aligned 2 MB blocks that hold them: `advise_checkpoint_map`);
`values` reads a small tensor (a scale checked) into a copy instead, its bytes alone.
`safetensors`' own NumPy API cannot return BF16 or FP8 tensors; here they come back as
`ml_dtypes` arrays.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import stat
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from stepper import dtypes
from stepper.errors import StepperError

# safetensors dtype name -> (NumPy's type, all little-endian, or ml_dtypes' by name; item size in bytes)
DTYPES: dict[str, tuple[str, int]] = {
    "F64": ("<f8", 8),
    "F32": ("<f4", 4),
    "F16": ("<f2", 2),
    "BF16": ("bfloat16", 2),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2": ("float8_e5m2", 1),
    "F8_E8M0": ("float8_e8m0fnu", 1),  # 2^(e - 127): block scales of newer checkpoints
    "I64": ("<i8", 8),
    "I32": ("<i4", 4),
    "I16": ("<i2", 2),
    "I8": ("i1", 1),
    "U64": ("<u8", 8),
    "U32": ("<u4", 4),
    "U16": ("<u2", 2),
    "U8": ("u1", 1),
    "BOOL": ("?", 1),
}
ML_DTYPES = ("BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0")  # made by stepper.dtypes, which imports ml_dtypes on first use


@cache
def dtype_of(name: str) -> np.dtype:
    """The NumPy dtype of a safetensors dtype name."""
    return dtypes.ml(DTYPES[name][0]) if name in ML_DTYPES else np.dtype(DTYPES[name][0])


HUGE_PAGE_BYTES = 1 << 21  # the huge page size advise_checkpoint_map relies on
MAX_HEADER_BYTES = 100_000_000  # the reference reader's limit
MAX_DIMS = 32  # NumPy 1.x's limit (2.x allows 64)
MAX_ARRAY_BYTES = 2**63 - 1  # NumPy's limit on elements x item size, counting only non-zero dims
ENTRY_KEYS = ("dtype", "shape", "data_offsets")
METADATA_KEY = "__metadata__"


@dataclass(frozen=True)
class TensorInfo:
    """One header entry. `start` and `end` are byte offsets into the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


class SafetensorsFile:
    """A validated safetensors file: its header in memory, its data memory-mapped on first use."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        # device, inode, size and modification time when the header was read; the map is checked against them
        self.identity, file_size, raw = _read_header_bytes(self.path)
        self.header_size = 8 + len(raw)
        where = str(self.path)
        header = _decode_json(raw, where)
        self.metadata = _parse_metadata(header.pop(METADATA_KEY, None), where)
        entries = [_parse_entry(name, entry, where) for name, entry in header.items()]
        self.tensors = _check_layout(entries, file_size - self.header_size, where)
        self._map: mmap.mmap | None = None
        self._fault_bytes = mmap.PAGESIZE  # what a fault reads and maps (advise_checkpoint_map)
        self._closed = False

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def names(self) -> list[str]:
        """Tensor names in the order of their bytes in the file."""
        return list(self.tensors)

    def info(self, name: str) -> TensorInfo:
        if name not in self.tensors:
            raise StepperError(f"{self.path}: no tensor named {_quote(name)}")
        return self.tensors[name]

    def data_range(self, name: str) -> tuple[int, int]:
        """The tensor's absolute byte range [start, end) in the file."""
        info = self.info(name)
        return self.header_size + info.start, self.header_size + info.end

    def get(self, name: str) -> np.ndarray:
        """The tensor as a read-only view into the file's memory map (no bytes copied)."""
        info = self.info(name)
        dtype, item_size = dtype_of(info.dtype), DTYPES[info.dtype][1]
        mapped = self._mapped()
        flat = np.frombuffer(mapped, dtype=dtype, count=info.nbytes // item_size, offset=self.header_size + info.start)
        return flat.reshape(info.shape)

    def values(self, name: str) -> np.ndarray:
        """A small tensor's values read from the file into a read-only copy, nothing mapped: for
        checking each scale or weight_shape of a checkpoint, which `get` would map with the 2 MB
        block around it (`advise_checkpoint_map`): 2.4 GB read for one Kimi K2 layer's 4 MB of scales."""
        if self._closed:
            raise StepperError(f"{self.path}: file was closed")
        info = self.info(name)
        start, end = self.data_range(name)
        with _open(self.path) as f:
            if file_identity(os.fstat(f.fileno())) != self.identity:
                raise StepperError(f"{self.path}: the file changed after its header was read")
            f.seek(start)
            raw = f.read(end - start)
        if len(raw) != end - start:
            raise StepperError(f"{self.path}: tensor {_quote(name)}: the file ends before its bytes")
        return np.frombuffer(raw, dtype=dtype_of(info.dtype)).reshape(info.shape)

    def prefetch(self, name: str) -> None:
        """About to read all of a tensor. Where a fault reads its whole 2 MB block (see
        `advise_checkpoint_map`) there is nothing to do. Elsewhere, read-ahead is asked for
        (MADV_WILLNEED), so that a cold page cache fills in large reads, not page by page. Nothing
        is mapped here: the pages are mapped by whichever thread or helper process reads them, side
        by side (mapping them all here, MADV_POPULATE_READ, measured no faster on one core)."""
        self._mapped()
        if self._fault_bytes == mmap.PAGESIZE:
            self._advise(name, mmap.MADV_WILLNEED)

    def mapped_bytes(self, name: str) -> int:
        """The memory the tensor's pages take once mapped: its byte range rounded out to whole
        fault blocks (a 14.7 MB expert maps 16-18 MB in 2 MB blocks)."""
        self._mapped()
        return spanned(*self.data_range(name), self._fault_bytes)

    def release(self, name: str) -> None:
        """Let the tensor's pages go from this process (they stay in the page cache), so a run
        that has used a weight does not keep it resident. Views stay valid and fault back in."""
        if self._map is not None:
            self._advise(name, mmap.MADV_DONTNEED)

    def _advise(self, name: str, advice: int) -> None:
        advise_range(self._map, advice, *self.data_range(name))

    def close(self) -> None:
        """Drop the memory map. Arrays already returned keep their pages mapped until they go."""
        self._closed = True
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # views are alive; the map is unmapped when the last of them is freed
            self._map = None

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SafetensorsFile({str(self.path)!r}, {len(self.tensors)} tensors)"

    def _mapped(self) -> mmap.mmap:
        """The whole file mapped read-only, made once, after checking it is the file we validated."""
        if self._closed:
            raise StepperError(f"{self.path}: file was closed")
        if self._map is not None and self._map.size() < len(self._map):  # its pages past the end: SIGBUS, no error
            raise StepperError(f"{self.path}: the file was cut short after it was read (written over in place), so its "
                               "weights can no longer be read; run again on the file as it is now")
        if self._map is None:
            with _open(self.path) as f:
                if file_identity(os.fstat(f.fileno())) != self.identity:
                    raise StepperError(f"{self.path}: the file changed after its header was read")
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._fault_bytes = advise_checkpoint_map(self._map)
        return self._map


def advise_checkpoint_map(view: mmap.mmap) -> int:
    """Advise a map of a checkpoint file; returns the bytes a fault now reads and maps: a 2 MB
    block, or a page.

    MADV_RANDOM: a fault does not read the pages around it (neighbouring tensors are mostly other
    experts, not needed). MADV_HUGEPAGE: on Linux a fault on a page not yet in the page cache then
    reads its aligned 2 MB block as one large folio, whatever the transparent huge page setting,
    and a process maps such a folio with one page-table entry. Mapping is what it costs to use a
    weight whose bytes are already cached: measured here for a 14.7 MB expert, 0.09 ms to map and
    0.01 ms to let go, against 1.0-1.2 ms and 0.5 ms when the page cache holds the same bytes as
    4 KB pages, which is what MADV_WILLNEED's read-ahead makes. A decode step maps 24 new experts."""
    if not hasattr(view, "madvise"):
        return mmap.PAGESIZE
    view.madvise(mmap.MADV_RANDOM)
    if not hasattr(mmap, "MADV_HUGEPAGE") or huge_page_bytes() != HUGE_PAGE_BYTES:
        return mmap.PAGESIZE  # (with 16 or 64 KB pages a huge page is 32 or 512 MB: far more than a tensor)
    try:
        view.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # a kernel without transparent huge pages
        return mmap.PAGESIZE
    return huge_page_bytes()


@cache
def huge_page_bytes() -> int:
    """The size of the kernel's huge page (2 MB on x86-64, and on arm64 with 4 KB pages)."""
    try:
        return int(Path("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size").read_text())
    except (OSError, ValueError):
        return HUGE_PAGE_BYTES


def spanned(start: int, end: int, block: int) -> int:
    """Bytes of the whole blocks that [start, end) touches."""
    return -(-end // block) * block - start // block * block


def advise_range(view: mmap.mmap, advice: int, start: int, end: int) -> None:
    """madvise bytes [start, end) of a map, from the page that holds start (where it exists)."""
    first = start - start % mmap.PAGESIZE
    if end > first and hasattr(view, "madvise"):
        view.madvise(advice, first, end - first)


class MappedBudget:
    """Mapped ranges kept after their use, least recently used first let go once they add up to
    more than `limit` bytes (the one used last always stays). Mapped pages count as a process's
    memory; let go, they stay in the page cache and fault back in."""

    def __init__(self, limit: int):
        self.limit = limit
        self.kept: OrderedDict[Hashable, tuple[int, Callable[[], None]]] = OrderedDict()
        self.total = 0  # the bytes kept, summed as ranges come and go (a layer uses hundreds)

    def use(self, key: Hashable, size: int, let_go: Callable[[], None]) -> None:
        """The range `key` (size bytes mapped) was just used; let_go() unmaps it."""
        earlier, _ = self.kept.pop(key, (0, None))
        self.kept[key] = (size, let_go)
        self.total += size - earlier
        while self.total > self.limit and len(self.kept) > 1:
            _, (oldest_size, oldest_let_go) = self.kept.popitem(last=False)
            self.total -= oldest_size
            oldest_let_go()


# -- reading the header bytes ------------------------------------------------------------------


def _open(path: Path):
    """The file opened for reading, with read-ahead off: reading the header pulls in no tensor data."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise StepperError(f"{path}: not a regular file")
        f = open(path, "rb", buffering=0)  # noqa: SIM115 (callers close it). Unbuffered: no read past the header
    except FileNotFoundError:
        raise StepperError(f"{path}: no such file") from None
    except OSError as e:
        raise StepperError(f"{path}: cannot open ({e.strerror})") from None
    if hasattr(os, "posix_fadvise"):  # no read-ahead into the data section
        with contextlib.suppress(OSError):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
    return f


def file_identity(st: os.stat_result) -> tuple[int, int, int, int]:
    """Device, inode, size and modification time: a file rewritten or replaced since differs."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


MAGIC = {b"\x93NUMPY": "a NumPy .npy file", b"PK\x03\x04": "a zip archive (NumPy's .npz or a PyTorch checkpoint)",
         b"GGUF": "a GGUF file"}


def other_format(first: bytes) -> str:
    """What a file is instead of safetensors, by its first bytes ('' when unknown)."""
    return next((name for magic, name in MAGIC.items() if first.startswith(magic)), "")


def _read_header_bytes(path: Path) -> tuple[tuple[int, ...], int, bytes]:
    """The file's identity, its size and its N header bytes; N is checked before anything is read."""
    with _open(path) as f:
        st = os.fstat(f.fileno())
        size = st.st_size
        if size < 8:
            raise StepperError(f"{path}: {size} bytes, too short for a safetensors file (at least 8 expected)")
        first = _read_exactly(f, 8)
        n = int.from_bytes(first, "little")
        if n > MAX_HEADER_BYTES and (what := other_format(first)):
            raise StepperError(f"{path}: {what}, not a safetensors file")
        if n > MAX_HEADER_BYTES:
            raise StepperError(f"{path}: header length {n} is over the {MAX_HEADER_BYTES}-byte limit")
        if n > size - 8:
            raise StepperError(f"{path}: header length {n} runs past the end of the file ({size} bytes)")
        raw = _read_exactly(f, n)
        if len(raw) != n:
            raise StepperError(f"{path}: file ended inside the header ({len(raw)} of {n} bytes read)")
    return file_identity(st), size, raw


def _read_exactly(f, n: int) -> bytes:
    """n bytes, or fewer only at the end of the file (an unbuffered read may return less)."""
    chunks, missing = [], n
    while missing:
        chunk = f.read(missing)
        if not chunk:
            break
        chunks.append(chunk)
        missing -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


# -- decoding the JSON ---------------------------------------------------------------------------


def _decode_json(raw: bytes, where: str) -> _Object:
    """The header as a JSON object, refusing what the reference reader's parser refuses and
    what Python's `json` would otherwise let through (NaN, duplicate keys, lone surrogates)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise StepperError(f"{where}: header is not valid UTF-8 (byte {e.start} of the header)") from None

    def no_constants(literal: str) -> Any:
        raise StepperError(f"{where}: header contains {literal}, which is not JSON")

    def plain_int(literal: str) -> Any:
        if len(literal) > 21:  # no integer past 64 bits is ever valid in a header
            raise StepperError(f"{where}: header contains a {len(literal)}-digit integer, out of 64-bit range")
        return -0.0 if literal == "-0" else int(literal)  # serde_json reads -0 as a float

    def make_object(pairs: list[tuple[str, Any]]) -> _Object:
        result = _Object()
        for key, value in pairs:
            _check_unicode(key, where)
            if isinstance(value, str):
                _check_unicode(value, where)
            if key in result and result.repeated is None:
                result.repeated = key
            result[key] = value
        return result

    try:
        header = json.loads(text, parse_constant=no_constants, parse_int=plain_int, object_pairs_hook=make_object)
    except json.JSONDecodeError as e:
        what = e.msg.removesuffix(" at")
        raise StepperError(f"{where}: header is not valid JSON ({what} at byte {e.pos} of the header)") from None
    except RecursionError:
        raise StepperError(f"{where}: header JSON is nested too deeply") from None
    _check_header_object(header, where)
    return header


def _check_header_object(header: Any, where: str) -> None:
    """The decoded header is one object, each key in it once."""
    if not isinstance(header, dict):
        raise StepperError(f"{where}: header must be a JSON object, found {_json_type(header)}")
    if header.repeated == METADATA_KEY:
        raise StepperError(f"{where}: {METADATA_KEY} appears twice in the header")
    if header.repeated is not None:
        raise StepperError(f"{where}: tensor {_quote(header.repeated)} appears twice in the header")


class _Object(dict):
    """A JSON object that remembers the first key it saw twice; the checks of the three places
    where objects are allowed (the header, `__metadata__`, a tensor entry) refuse it."""

    repeated: str | None = None


def _check_unicode(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise StepperError(f"{where}: header has a string with an unpaired surrogate escape "
                           "(\\ud800-\\udfff)") from None


# -- checking the entries ------------------------------------------------------------------------


def _parse_metadata(value: Any, where: str) -> dict[str, str]:
    if value is None:  # absent, or null: the format allows both
        return {}
    if not isinstance(value, dict):
        raise StepperError(f"{where}: {METADATA_KEY} must be an object of string -> string, found {_json_type(value)}")
    if getattr(value, "repeated", None) is not None:
        raise StepperError(f"{where}: {METADATA_KEY} key {_quote(value.repeated)} appears twice")
    for key, item in value.items():
        if not isinstance(item, str):
            raise StepperError(f"{where}: {METADATA_KEY} entry {_quote(key)} must be a string, found "
                               f"{_json_type(item)}")
    return dict(value)


def _parse_entry(name: str, entry: Any, where: str) -> TensorInfo:
    """One tensor entry, with exactly the keys dtype, shape, data_offsets, and a consistent size."""
    at = f"{where}: tensor {_quote(name)}"
    if not name:
        raise StepperError(f"{where}: a tensor has an empty name")
    if any(_is_control(c) for c in name):
        raise StepperError(f"{at}: its name holds a control character")
    _check_entry_keys(entry, at)
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise StepperError(f"{at}: unknown dtype {_show(dtype)} (expected one of {', '.join(DTYPES)})")
    if isinstance(shape, list) and len(shape) > MAX_DIMS:
        raise StepperError(f"{at}: shape has {len(shape)} dimensions, more than the {MAX_DIMS} supported")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise StepperError(f"{at}: shape must be a list of non-negative integers, found {_show(shape)}")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets):
        raise StepperError(f"{at}: data_offsets must be [start, end] with non-negative integers, found "
                           f"{_show(offsets)}")
    start, end = offsets
    if end < start:
        raise StepperError(f"{at}: data_offsets [{start}, {end}] end before they start")
    info = TensorInfo(name, dtype, tuple(shape), start, end)
    _check_size(info, at)
    return info


def _check_entry_keys(entry: Any, at: str) -> None:
    """A tensor entry is an object with exactly the keys dtype, shape and data_offsets, each once."""
    if not isinstance(entry, dict):
        raise StepperError(f"{at}: entry must be an object with {', '.join(ENTRY_KEYS)}, found {_json_type(entry)}")
    if getattr(entry, "repeated", None) is not None:
        raise StepperError(f"{at}: key {_quote(entry.repeated)} appears twice in its entry")
    for key in entry:
        if key not in ENTRY_KEYS:
            raise StepperError(f"{at}: unknown key {_quote(key)} (expected only {', '.join(ENTRY_KEYS)})")
    for key in ENTRY_KEYS:
        if key not in entry:
            raise StepperError(f"{at}: missing key '{key}'")


def _is_control(char: str) -> bool:
    """C0 and C1 control characters and DEL: NUL, ESC (terminal escape sequences), newlines..."""
    return ord(char) < 0x20 or 0x7F <= ord(char) <= 0x9F


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0  # bool is a subclass of int, and not a count


def _check_size(info: TensorInfo, at: str) -> None:
    """shape x item size must be the byte range; products are bounded as they grow."""
    item_size = DTYPES[info.dtype][1]
    nonzero = item_size
    for dim in info.shape:
        nonzero *= max(dim, 1)
        if nonzero > MAX_ARRAY_BYTES:
            raise StepperError(
                f"{at}: shape {list(info.shape)} of {info.dtype} is too large for NumPy "
                "(its non-zero dimensions x item size exceed 2^63 - 1 bytes)"
            )
    nbytes = 0 if 0 in info.shape else nonzero
    if nbytes != info.nbytes:
        raise StepperError(
            f"{at}: shape {list(info.shape)} of {info.dtype} needs {nbytes} bytes, "
            f"but data_offsets [{info.start}, {info.end}] span {info.nbytes}"
        )


def _check_layout(entries: list[TensorInfo], data_size: int, where: str) -> dict[str, TensorInfo]:
    """Tensors sorted by offset must tile the data section exactly: from 0, no gap, no overlap,
    nothing missing and nothing extra at the end. Zero-size tensors may share an offset."""
    ordered = sorted(entries, key=lambda t: (t.start, t.end))
    covered, previous = 0, None
    for info in ordered:
        at = f"{where}: tensor {_quote(info.name)}"
        if info.start > covered:
            raise StepperError(f"{at}: starts at data byte {info.start}, leaving bytes [{covered}, {info.start}) "
                               "unused")
        if info.start < covered:
            same = (previous.start, previous.end) == (info.start, info.end)
            verb = "use the same bytes as" if same else "overlap"
            raise StepperError(f"{at}: data_offsets [{info.start}, {info.end}] {verb} tensor {_quote(previous.name)}")
        if info.end > data_size:
            raise StepperError(
                f"{at}: data_offsets [{info.start}, {info.end}] run past the data section "
                f"({data_size} bytes); is the file truncated?"
            )
        covered, previous = info.end, info
    if covered != data_size:
        raise StepperError(
            f"{where}: extra data after the last tensor: the data section has {data_size} bytes, "
            f"the tensors cover {covered}"
        )
    return {info.name: info for info in ordered}


# -- messages ------------------------------------------------------------------------------------


def _quote(text: str, limit: int = 120) -> str:
    """A name as it goes into a one-line message: quoted, control characters escaped, shortened."""
    if len(text) > limit:
        text = text[:limit] + "..."
    return f"'{text}'" if text.isprintable() else repr(text)


def _show(value: Any, limit: int = 80) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _json_type(value: Any) -> str:
    names = {dict: "an object", _Object: "an object", list: "an array", str: "a string", bool: "a boolean",
             type(None): "null"}
    return names.get(type(value), "a number")
