"""The local copy of what was fetched of a remote file: a sparse file and a ledger of its ranges.

A remote shard becomes a local file of its full size in which only the fetched byte ranges hold
data (the rest is a hole, taking no disk), so everything that reads a local checkpoint (memory
maps, the FP8 helper processes) reads it unchanged. The ledger (`.stepper/NAME.json` beside it)
lists each fetched range with its sha256, the file's ETag and size, and when it was last used.
Nothing is read from the file before `ensure` has made its range present: missing ranges are
fetched, and each cached range is checked against its length and checksum once per process (a
corrupted one is fetched again). Writing keeps the file's modification time, which is part of
the identity that readers check the file against.

Folders are bounded by `trim`: least recently used files first, whole files at a time.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from stepper.errors import StepperError
from stepper.untrusted import shown
from stepper.weights.http_ranges import RangeClient

LEDGERS = ".stepper"
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


PIECE = 256 << 20  # the most one request asks for: a retry repeats at most this much


def pieces(start: int, end: int) -> list[tuple[int, int]]:
    return [(a, min(a + PIECE, end)) for a in range(start, end, PIECE)]


class FileSink:
    """Writes a range into the local file as it arrives, hashing it; restarted by a retry. The
    file's modification time is put back when done (readers check it)."""

    def __init__(self, path: Path, start: int):
        self.path, self.start = path, start
        self.stat = os.stat(path)
        self.fd = os.open(path, os.O_WRONLY)
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
            if self._load() and self.path.is_file() and self.path.stat().st_size == self.size:
                self._ensure_locked([(0, self.header_end())])
                return
            self._discard()
            length, self.size = self.client.read(self.url, 0, 8)
            n = int.from_bytes(length, "little")
            if n > MAX_HEADER or 8 + n > self.size:
                raise StepperError(f"{shown(self.url)}: header length {n} does not fit a file of {self.size} bytes")
            header, _ = self.client.read(self.url, 8, 8 + n)
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
        for start, end in (piece for gap in gaps for piece in pieces(*gap)):
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

    def _create(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "wb") as f:
            f.truncate(self.size)
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
        st = os.stat(self.path)
        fd = os.open(self.path, os.O_WRONLY)
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
        self.ledger_path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.ledger_path.with_suffix(".partial")
        partial.write_text(json.dumps(record), encoding="utf-8")
        partial.replace(self.ledger_path)

    def _discard(self) -> None:
        for path in (self.path, self.ledger_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self.chunks, self.verified = [], set()

    @contextlib.contextmanager
    def _locked(self):
        """One process at a time fills a folder's files (another stepper may share the cache)."""
        lock = self.ledger_path.parent / "lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        with open(lock, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


# -- the cache as a whole --------------------------------------------------------------------------


@dataclass(frozen=True)
class Held:
    """One cached file: where, how many bytes of it are present, when last used."""

    path: Path
    ledger: Path
    bytes: int
    used: float


def held(root: Path) -> list[Held]:
    """Every cached file under root, with the bytes its ledger says are present."""
    found = []
    for ledger in root.glob(f"**/{LEDGERS}/*.json"):
        try:
            raw = json.loads(ledger.read_text(encoding="utf-8"))
            present = sum(int(b) - int(a) for a, b, _ in raw["chunks"])
            found.append(Held(ledger.parent.parent / ledger.name.removesuffix(".json"), ledger, present, float(raw["used"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


def trim(root: Path, max_bytes: int, keep: set[Path]) -> int:
    """Remove least recently used files (not those in keep) until root holds at most max_bytes;
    returns the bytes removed."""
    files = sorted(held(root), key=lambda h: h.used)
    total, removed = sum(h.bytes for h in files), 0
    for h in files:
        if total - removed <= max_bytes:
            break
        if h.path in keep:
            continue
        for path in (h.path, h.ledger):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        removed += h.bytes
    return removed


def clear(root: Path, folder: Path | None = None) -> None:
    """Remove the whole cache, or one checkpoint's folder in it."""
    target = folder or root
    if target.exists():
        shutil.rmtree(target)
