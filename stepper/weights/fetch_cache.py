"""The local copy of what was fetched of a remote file: a sparse file and a ledger of its ranges.

A remote shard becomes a local file of its full size in which only the fetched byte ranges hold
data (the rest is a hole, taking no disk), so everything that reads a local checkpoint (memory
maps, the FP8 helper processes) reads it unchanged. The ledger (`.stepper/NAME.json` beside it)
lists each fetched range with its sha256, the file's ETag and size, and when it was last used.
Nothing is read from the file before `ensure` has made its range present: missing ranges are
fetched, and each cached range is checked against its length and checksum once per process (a
corrupted one is fetched again). Writing keeps the file's modification time, which is part of
the identity that readers check the file against.

Folders are bounded by `trim`: least recently used files first, whole files at a time. No link
in the cache folder is followed: one where a cached file, its ledger, the lock or the ledger
folder belongs is refused in one line (and left); every write goes through `stepper.files`.
`clear` removes only the cache's own files (those its ledgers name, the small files as it wrote them, the
ledgers) and the folders left empty, and returns what else it found.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from stepper import files
from stepper.errors import StepperError
from stepper.untrusted import shown
from stepper.untrusted.jsonfile import parse_json
from stepper.weights.checkpoint import INDEX
from stepper.weights.http_ranges import RangeClient

LEDGERS = ".stepper"
LOCK = "lock"
WRITTEN = ".written"  # `.stepper/NAME.written`: "SIZE SHA256" of a small file stepper wrote whole (config.json...)
MAX_FILE = 1 << 44  # 16 TiB: no checkpoint file is larger (nor can most file systems hold one)
MAX_HEADER = 100_000_000  # the safetensors reader's limit


def merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Ranges [start, end) sorted, those that touch or overlap joined."""
    out: list[list[int]] = []
    for start, end in sorted(r for r in ranges if r[1] > r[0]):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def missing(chunks: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    """The parts of [start, end) that no chunk covers."""
    gaps, at = [], start
    for a, b in sorted(chunks):
        if b <= at or a >= end:
            continue
        if a > at:
            gaps.append((at, a))
        at = max(at, b)
    if at < end:
        gaps.append((at, end))
    return gaps


REQUEST_BYTES = 256 << 20  # the most one request asks for: a retry repeats at most this much


def request_spans(start: int, end: int) -> list[tuple[int, int]]:
    return [(a, min(a + REQUEST_BYTES, end)) for a in range(start, end, REQUEST_BYTES)]


class FileSink:
    """Writes a range into the local file as it arrives, hashing it; restarted by a retry. The
    file's modification time is put back when done (readers check it)."""

    def __init__(self, path: Path, start: int):
        self.path, self.start = path, start
        self.fd = files.open_for_update(path)
        self.stat = os.fstat(self.fd)
        self.restart()

    def restart(self) -> None:
        self.at, self.digest = self.start, hashlib.sha256()

    def write(self, chunk: bytes) -> None:
        os.pwrite(self.fd, chunk, self.at)
        self.at += len(chunk)
        self.digest.update(chunk)

    def close(self) -> None:
        os.close(self.fd)
        os.utime(self.path, ns=(self.stat.st_atime_ns, self.stat.st_mtime_ns))


@dataclass
class Chunk:
    start: int
    end: int
    sha256: str


class CachedFile:
    """One remote file's local copy."""

    def __init__(self, folder: Path, name: str, url: str, client: RangeClient):
        self.path, self.url, self.client = folder / name, url, client
        self.ledger_path = folder / LEDGERS / f"{name}.json"
        self.size = 0
        self.etag: str | None = None
        self.chunks: list[Chunk] = []
        self.verified: set[tuple[int, int]] = set()

    # -- opening -----------------------------------------------------------------------------

    def open(self) -> None:
        """Make the local file hold at least the header: from the ledger if it is sound, else by
        two range reads (the 8-byte length, then the header)."""
        with self._locked():
            self._refuse_foreign()
            if self._load() and files.kind(self.path) == "file" and self.path.stat().st_size == self.size:
                self._ensure_locked([(0, self.header_end())])
                return
            self._discard()
            length, self.size = self.client.read(self.url, 0, 8)
            n = int.from_bytes(length, "little")
            if n > MAX_HEADER or 8 + n > self.size:
                raise StepperError(f"{shown(self.url)}: header length {n} does not fit a file of {self.size} bytes")
            header, _ = self.client.read(self.url, 8, 8 + n)
            check_size(self.url, self.size, n, header)
            self.etag = self.client.etag(self.url)
            self._create()
            self._write(0, length + header)
            self._save()

    def header_end(self) -> int:
        with open(self.path, "rb") as f:
            return 8 + int.from_bytes(f.read(8), "little")

    # -- reading -----------------------------------------------------------------------------

    def missing_bytes(self, ranges: list[tuple[int, int]]) -> int:
        """How many bytes of the ranges are not cached yet (as far as this process knows)."""
        have = [(c.start, c.end) for c in self.chunks]
        return sum(b - a for start, end in merged(ranges) for a, b in missing(have, start, end))

    def ensure(self, ranges: list[tuple[int, int]]) -> None:
        """Every byte of the ranges present and checked in the local file."""
        if self._present(ranges):
            return
        with self._locked():
            self._load()
            self._ensure_locked(merged(ranges))

    def _present(self, ranges: list[tuple[int, int]]) -> bool:
        """Whether this process has already fetched or checked every byte of the ranges (no lock needed:
        chunks are only ever added while a process runs)."""
        have = [(c.start, c.end) for c in self.chunks if (c.start, c.end) in self.verified]
        return all(not missing(have, start, end) for start, end in ranges)

    def _ensure_locked(self, ranges: list[tuple[int, int]]) -> None:
        self._check_cached(ranges)
        have = [(c.start, c.end) for c in self.chunks]
        gaps = [gap for start, end in ranges for gap in missing(have, start, end)]
        for start, end in (span for gap in gaps for span in request_spans(*gap)):
            self._fetch(start, end)
        self.client.transfer.cached += sum(b - a for a, b in ranges) - sum(b - a for a, b in gaps)
        self._save()

    def _check_cached(self, ranges: list[tuple[int, int]]) -> None:
        """Each cached chunk the ranges touch, once per process: its bytes hash to its checksum,
        or it is dropped from the ledger (and so fetched again)."""
        for chunk in list(self.chunks):
            key = (chunk.start, chunk.end)
            if key in self.verified or not any(chunk.start < end and start < chunk.end for start, end in ranges):
                continue
            if self._digest(chunk.start, chunk.end) != chunk.sha256:
                self.chunks.remove(chunk)
                self.client.transfer.repaired += 1
            else:
                self.verified.add(key)

    def _check_same_file(self, size: int) -> None:
        etag = self.client.etag(self.url)
        if size != self.size or (self.etag and etag and etag != self.etag):
            raise StepperError(f"{shown(self.url)}: the file on the server is no longer the one cached "
                               f"(size {size} vs {self.size}, ETag {shown(etag)} vs {shown(self.etag)}); "
                               "`stepper cache clear` and run again")

    # -- the local file and its ledger -----------------------------------------------------------

    def _refuse_foreign(self) -> None:
        refuse_foreign(self.path, self.ledger_path)

    def _create(self) -> None:
        try:
            files.new_sparse_file(self.path, self.size)
        except OSError as e:
            raise StepperError(f"{shown(self.path)}: cannot make the local copy of {self.size} bytes "
                               f"({e.strerror})") from None
        self.chunks, self.verified = [], set()

    def _fetch(self, start: int, end: int) -> None:
        """One range from the server straight into the file, hashed on the way; recorded once whole."""
        sink = FileSink(self.path, start)
        try:
            size = self.client.read_into(self.url, start, end, sink)
        finally:
            sink.close()
        self._check_same_file(size)
        self.chunks.append(Chunk(start, end, sink.digest.hexdigest()))
        self.verified.add((start, end))

    def _write(self, start: int, data: bytes) -> None:
        """The bytes written at start, the file's modification time kept (readers check it)."""
        fd = files.open_for_update(self.path)
        st = os.fstat(fd)
        try:
            os.pwrite(fd, data, start)
        finally:
            os.close(fd)
        os.utime(self.path, ns=(st.st_atime_ns, st.st_mtime_ns))
        self.chunks.append(Chunk(start, start + len(data), hashlib.sha256(data).hexdigest()))
        self.verified.add((start, start + len(data)))

    def _digest(self, start: int, end: int) -> str:
        digest = hashlib.sha256()
        with open(self.path, "rb") as f:
            f.seek(start)
            left = end - start
            while left:
                block = f.read(min(left, 1 << 24))
                if not block:
                    break
                digest.update(block)
                left -= len(block)
        return digest.hexdigest() if left == 0 else ""

    def _load(self) -> bool:
        """The ledger read back; False if there is none or it is unreadable (then it is remade)."""
        try:
            raw = json.loads(self.ledger_path.read_text(encoding="utf-8"))
            self.size, self.etag = int(raw["size"]), raw.get("etag")
            self.chunks = [Chunk(int(a), int(b), str(h)) for a, b, h in raw["chunks"]]
        except (OSError, ValueError, KeyError, TypeError):
            return False
        return raw.get("url") == self.url

    def _save(self) -> None:
        record = {"url": self.url, "etag": self.etag, "size": self.size, "used": time.time(),
                  "chunks": [[c.start, c.end, c.sha256] for c in self.chunks]}
        files.make_folder(self.ledger_path.parent, within=self.path.parent)
        files.write_bytes_atomically(self.ledger_path, json.dumps(record))

    def _discard(self) -> None:
        for path in (self.path, self.ledger_path):
            files.remove_file(path)
        self.chunks, self.verified = [], set()

    @contextlib.contextmanager
    def _locked(self):
        """One process at a time fills a folder's files (another stepper may share the cache)."""
        lock = self.ledger_path.parent / LOCK
        files.make_folder(lock.parent, within=self.path.parent)
        fd = files.open_lock(lock)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # the lock goes with it


# -- the cache as a whole --------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheEntry:
    """One cached file: where, how many bytes of it are present, when last used."""

    path: Path
    ledger: Path
    bytes: int
    used: float


def refuse_foreign(*paths: Path) -> None:
    """A link, folder or device where a file of the cache belongs is not the cache's: never followed."""
    for path in paths:
        found = files.kind(path)
        if found not in (None, "file"):
            raise StepperError(f"{shown(path)}: is a {found}, not a file stepper cached; stepper does not follow or "
                               "remove it (remove it yourself, or use another --cache-dir)")


def ledgers(root: Path) -> Iterator[Path]:
    """Every ledger under root (no link followed below it)."""
    for where, _, names in os.walk(root):
        if Path(where).name == LEDGERS:
            yield from (Path(where) / name for name in sorted(names) if name.endswith(".json"))


def cache_entries(root: Path) -> list[CacheEntry]:
    """Every cached file under root, with the bytes its ledger says are present."""
    found = []
    for ledger in ledgers(root):
        try:
            raw = json.loads(ledger.read_text(encoding="utf-8"))
            present = sum(int(b) - int(a) for a, b, _ in raw["chunks"])
            found.append(CacheEntry(ledger.parent.parent / ledger.name.removesuffix(".json"), ledger, present,
                              float(raw["used"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


def trim(root: Path, max_bytes: int, keep: set[Path]) -> int:
    """Remove least recently used files (not those in keep) until root holds at most max_bytes;
    returns the bytes removed."""
    cached = sorted(cache_entries(root), key=lambda h: h.used)
    total, removed = sum(h.bytes for h in cached), 0
    for h in cached:
        if total - removed <= max_bytes:
            break
        if h.path in keep:
            continue
        if files.kind(h.path) in (None, "file"):  # a link there is not the cache's: left, its ledger too
            files.remove_file(h.path)
            files.remove_file(h.ledger)
            removed += h.bytes
    return removed


TEMPORARY = re.compile(r"\..+\.tmp-\d+-[0-9a-f]{8}")  # stepper.files' temporary names, left by a crash


def clear(target: Path, keep_target: bool = False) -> list[Path]:
    """Remove what stepper cached under target: in each checkpoint folder (one holding a ledger
    folder) the files its ledgers name, config.json and the index as stepper wrote them (a changed
    one is the user's), the index's absence marker, the ledgers and the lock; then every folder
    left empty (target too, unless keep_target: the cache folder itself, which the user may have
    made). Anything else stays, with the folders holding it: those
    entries are returned."""
    for where, folders, names in os.walk(target):
        if LEDGERS in folders and files.kind(Path(where) / LEDGERS) == "folder":
            clear_checkpoint(Path(where), names)
    for where, _, _ in sorted(os.walk(target), key=lambda w: -len(Path(w[0]).parts)):
        if not (keep_target and Path(where) == target):
            files.remove_empty_folder(Path(where))
    left = []
    for where, folders, names in os.walk(target):
        left += [Path(where) / name for name in names]
        left += [Path(where) / name for name in folders if files.kind(Path(where) / name) == "link"]
    return sorted(left)


def clear_checkpoint(folder: Path, names: list[str]) -> None:
    ledger_folder = folder / LEDGERS
    own = {f".{INDEX}.absent"} | {name for name in ("config.json", INDEX) if written_whole(folder, name)}
    own |= {p.name.removesuffix(".json") for p in ledger_folder.iterdir() if p.name.endswith(".json")}
    for name in names:
        if name in own or TEMPORARY.fullmatch(name):
            remove_own(folder / name)
    for path in ledger_folder.iterdir():
        if path.name.endswith((".json", WRITTEN)) or path.name == LOCK or TEMPORARY.fullmatch(path.name):
            remove_own(path)


def note_written(folder: Path, name: str, data: bytes) -> None:
    """Record that stepper wrote folder/name whole with these bytes, so that `clear` removes it and
    not a file a user put (or changed) there."""
    record = f"{len(data)} {hashlib.sha256(data).hexdigest()}"
    files.write_bytes_atomically(folder / LEDGERS / f"{name}{WRITTEN}", record.encode())


def written_whole(folder: Path, name: str) -> bool:
    """Whether folder/name holds the bytes stepper wrote there (note_written), unchanged."""
    path, note = folder / name, folder / LEDGERS / f"{name}{WRITTEN}"
    if files.kind(path) != "file" or files.kind(note) != "file" or note.stat().st_size > 100:
        return False
    size, _, digest = note.read_text(encoding="utf-8", errors="replace").partition(" ")
    if not size.isdigit() or path.stat().st_size != int(size):  # read back only a file of the size written
        return False
    return hashlib.sha256(path.read_bytes()).hexdigest() == digest


def remove_own(path: Path) -> None:
    """A file of the cache's removed; a link at its place is not the cache's, and stays."""
    if files.kind(path) == "file":
        files.remove_file(path)


def check_size(url: str, size: int, n: int, header: bytes) -> None:
    """The file's size as the server gives it (Content-Range), held against what no file is and
    against the end of the data its header describes: no local copy is made of a size the header
    does not account for."""
    if size > MAX_FILE:
        raise StepperError(f"{shown(url)}: the server gives the file's size as {size} bytes, more than any "
                           f"checkpoint file ({MAX_FILE} bytes); not fetched")
    try:
        raw = parse_json(header.decode("utf-8"), shown(url))
        ends = [int(v["data_offsets"][1]) for k, v in raw.items() if k != "__metadata__"]
    except (StepperError, UnicodeDecodeError, AttributeError, KeyError, IndexError, TypeError, ValueError):
        return  # an unsound header: the checkpoint's checks name what is wrong with it
    data_end = 8 + n + max(ends, default=0)
    if size > data_end:
        raise StepperError(f"{shown(url)}: the server gives the file's size as {size} bytes, but its header's "
                           f"tensors end at byte {data_end}; not fetched")
