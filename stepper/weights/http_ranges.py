"""Byte ranges of files on an HTTP server, each response checked, transient faults retried.

A safetensors file is read remotely as a few byte ranges (`Range: bytes=a-b`, answered `206
Partial Content` with `Content-Range: bytes a-b/total`). Every answer is checked before its
bytes are used: the status, that Content-Range names exactly the range asked for, that the
body has exactly that length, and that the file's ETag is the one it had at the first read (a
file replaced on the server between two reads would mix two versions). Connection failures,
timeouts, 5xx and 429 are retried with a growing pause (429's Retry-After honoured); after the
last try, one line names the file and the range. Time is bounded three ways: each wait for bytes
(the timeout), each answer as a whole, its status line and headers included (twice the timeout
plus its length at MIN_RATE: a server that trickles is cut off), and all of a run's requests together
(run_seconds). The client is `huggingface_hub`'s (httpx2), whose timeouts are per read only: a
Watchdog shuts a request's connections down at its deadline. The client also supplies the Hub's
token headers; tokens never appear in a message.
"""

from __future__ import annotations

import re
import socket
import threading
import time
import weakref
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from stepper.errors import StepperError
from stepper.untrusted import shown

CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
RETRIED_STATUS = {408, 425, 429, 500, 502, 503, 504}
MIN_RATE = 64_000  # bytes a second: an answer slower than this (after the timeout) is given up


class Transient(Exception):
    """A failure worth another try: what went wrong, in words for the last message."""


@dataclass
class Transfer:
    """What a run read: bytes and requests from the server, bytes found in the local cache."""

    fetched: int = 0
    requests: int = 0
    cached: int = 0
    repaired: int = 0  # cached ranges whose checksum failed, fetched again
    seconds: float = 0.0
    on_bytes: Callable[[int], None] | None = field(default=None, repr=False)  # a progress bar's advance


class Watchdog:
    """Ends a request that outlives its deadline wherever it waits (headers or body): the
    client's timeouts are per read, so a server trickling its headers would never be cut off.
    The sockets are learnt as connections open, through httpcore's `trace` request extension; at
    the deadline they are shut down, which ends a blocked read at once (the client then fails the
    request, and `fired` says why)."""

    OPENED = (".connect_tcp.complete", ".start_tls.complete")  # directly, or through a proxy ("proxy.", "socks.")

    def __init__(self) -> None:
        self.sockets: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self.lock = threading.Lock()
        self.timer: threading.Timer | None = None
        self.token: object | None = None  # the armed timer's: a timer stopped or replaced meanwhile does nothing
        self.fired, self.seconds = False, 0.0

    def trace(self, event: str, info: dict) -> None:
        if event.endswith(self.OPENED) and info.get("return_value") is not None:
            sock = info["return_value"].get_extra_info("socket")
            if sock is not None:
                self.sockets.add(sock)

    def arm(self, began: float, seconds: float) -> None:
        """Fire `seconds` after `began` (a time.monotonic()), replacing the deadline set before."""
        self.stop()
        with self.lock:
            self.fired, self.seconds, self.token = False, seconds, object()
            self.timer = threading.Timer(max(0.0, began + seconds - time.monotonic()), self.fire, (self.token,))
            self.timer.daemon = True
            self.timer.start()

    def stop(self) -> None:
        with self.lock:
            if self.timer is not None:
                self.timer.cancel()
                self.timer = self.token = None

    def fire(self, token: object) -> None:
        with self.lock:
            if token is not self.token:
                return
            self.fired = True
            for sock in list(self.sockets):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:  # closed already
                    pass


def missing_extra() -> StepperError:
    return StepperError("reading a remote checkpoint needs huggingface_hub: pip install \"stepper[remote]\"")


class RangeClient:
    """Reads whole small files and byte ranges of large ones from URLs."""

    def __init__(self, headers: dict[str, str] | None = None, timeout: float = 30.0, tries: int = 5,
                 pause: float = 0.5, sleep: Callable[[float], None] = time.sleep, transfer: Transfer | None = None,
                 run_seconds: float = float("inf")):
        try:
            import httpx2
        except ImportError:
            raise missing_extra() from None
        self.httpx = httpx2
        self.client = httpx2.Client(timeout=httpx2.Timeout(timeout), follow_redirects=True, headers=headers or {})
        self.tries, self.pause, self.sleep, self.timeout = tries, pause, sleep, timeout
        self.run_seconds, self.run_deadline = run_seconds, time.monotonic() + run_seconds
        self.etags: dict[str, str] = {}  # url -> the ETag of its first answer
        self.transfer = transfer or Transfer()
        self.watchdog = Watchdog()

    def whole(self, url: str, limit: int) -> bytes | None:
        """A small file's bytes (at most `limit`), or None if the server has no such file (404)."""
        return self._with_retries(url, "the whole file", lambda: self._whole_once(url, limit))

    def read(self, url: str, start: int, end: int) -> tuple[bytes, int]:
        """Bytes [start, end) of the file (a small range: they are held) and the file's total size."""
        sink = Collected()
        total = self.read_into(url, start, end, sink)
        return sink.data(), total

    def read_into(self, url: str, start: int, end: int, sink: Sink) -> int:
        """Bytes [start, end) of the file written to the sink as they arrive (never held whole);
        the file's total size. A retry restarts the sink."""
        return self._with_retries(url, f"bytes {start}-{end - 1}", lambda: self._range_once(url, start, end, sink))

    def etag(self, url: str) -> str | None:
        return self.etags.get(url)

    def _with_retries(self, url: str, what: str, once: Callable):
        began = time.monotonic()
        for attempt in range(self.tries):
            if time.monotonic() > self.run_deadline:
                raise StepperError(f"{shown(url)}: {what}: the run's remote reads took over {self.run_seconds:g} s "
                                   "together; given up")
            try:
                result = once()
                self.transfer.seconds += time.monotonic() - began
                return result
            except Transient as e:
                reason, wait = str(e), self.pause * 2**attempt
                retry_after = getattr(e, "retry_after", None)
                if attempt + 1 < self.tries:
                    self.sleep(min(retry_after if retry_after is not None else wait,
                                   max(0.0, self.run_deadline - time.monotonic())))
        raise StepperError(f"{shown(url)}: {what}: {reason} (after {self.tries} tries)")

    def _whole_once(self, url: str, limit: int) -> bytes | None:
        sink = Collected()
        with self._request(url, "the whole file", 0) as (response, began):
            if response.status_code == 404:
                return None
            self._check_status(response, 200)
            self._check_etag(url, response)
            self.watchdog.arm(began, self._seconds(began, min(limit, declared_length(response, limit))))
            self._stream(response, limit, sink, exact=False)
        return sink.data()

    def _range_once(self, url: str, start: int, end: int, sink: Sink) -> int:
        sink.restart()
        what = f"bytes {start}-{end - 1}"
        with self._request(url, what, end - start, {"Range": f"bytes={start}-{end - 1}"}) as (response, _):
            self._check_status(response, 206)
            total = self._check_content_range(url, response, start, end)
            self._check_etag(url, response)
            self._stream(response, end - start, sink)
        return total

    @contextmanager
    def _request(self, url: str, what: str, length: int, headers: dict[str, str] | None = None):
        """A GET's response and when it began, the answer cut off by the watchdog once it takes
        longer than `length` bytes allow (see _seconds); a transport failure is Transient."""
        began = time.monotonic()
        self.watchdog.arm(began, self._seconds(began, length))
        try:
            with self.client.stream("GET", url, headers=headers, extensions={"trace": self.watchdog.trace}) as response:
                self.transfer.requests += 1
                yield response, began
        except self.httpx.HTTPError as e:
            if self.watchdog.fired:
                raise StepperError(f"{shown(url)}: {what}: the answer took over {self.watchdog.seconds:.3g} s; "
                                   "given up") from None
            raise Transient(describe(e)) from None
        finally:
            self.watchdog.stop()

    def _seconds(self, began: float, length: int) -> float:
        """How long an answer of `length` bytes may take, within the run's deadline: the timeout
        for its status line and headers, then the timeout plus its length at MIN_RATE (a server
        that only stalls meets the per-read timeout first: a transient fault, tried again)."""
        return min(2 * self.timeout + length / MIN_RATE, max(0.0, self.run_deadline - began))

    def _check_status(self, response, expected: int) -> None:
        status = response.status_code
        if status == expected:
            return
        if status in RETRIED_STATUS:
            error = Transient(f"the server answered {status}")
            error.retry_after = retry_after(response.headers.get("Retry-After"))
            raise error
        if status in (401, 403):
            raise StepperError(f"{shown(response.request.url)}: the server answered {status}: this file needs a token "
                               "with access (HF_TOKEN or `hf auth login`)")
        if expected == 206 and status == 200:
            raise StepperError(f"{shown(response.request.url)}: the server does not answer range requests "
                               "(it sent the whole file, status 200)")
        raise StepperError(f"{shown(response.request.url)}: the server answered {status}, expected {expected}")

    def _check_content_range(self, url: str, response, start: int, end: int) -> int:
        header = response.headers.get("Content-Range", "")
        m = CONTENT_RANGE.fullmatch(header.strip())
        if not m or int(m[1]) != start or int(m[2]) != end - 1 or m[3] == "*":
            raise Transient(f"the answer's Content-Range is {shown(header)!r}, expected 'bytes {start}-{end - 1}/SIZE'")
        return int(m[3])

    def _check_etag(self, url: str, response) -> None:
        etag = response.headers.get("X-Linked-Etag") or response.headers.get("ETag")
        if etag is None:
            return
        first = self.etags.setdefault(url, etag)
        if etag != first:
            raise StepperError(f"{shown(url)}: the file changed on the server between two reads (ETag {shown(first)} "
                               f"then {shown(etag)}); nothing read from it is used")

    def _stream(self, response, length: int, sink: Sink, exact: bool = True) -> None:
        """The body into the sink: exactly `length` bytes, or (a whole small file) at most that."""
        size = 0
        for chunk in response.iter_bytes():  # each piece as it arrives
            size += len(chunk)
            if size > length:
                if exact:
                    raise Transient(f"the answer is longer than the {length} bytes asked for")
                raise StepperError(f"{shown(response.request.url)}: over {length} bytes, more than such a file holds")
            sink.write(chunk)
            self.transfer.fetched += len(chunk)
            if self.transfer.on_bytes:
                self.transfer.on_bytes(len(chunk))
        if exact and size != length:
            raise Transient(f"the answer ended after {size} of {length} bytes")


class Sink(Protocol):
    def restart(self) -> None: ...

    def write(self, chunk: bytes) -> None: ...


class Collected:
    """A sink that keeps the bytes (headers, small files)."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def restart(self) -> None:
        self.chunks = []

    def write(self, chunk: bytes) -> None:
        self.chunks.append(chunk)

    def data(self) -> bytes:
        return b"".join(self.chunks)


def declared_length(response, default: int) -> int:
    """The answer's Content-Length, or the default when it gives none (or nonsense)."""
    value = response.headers.get("Content-Length", "")
    return int(value) if value.strip().isdigit() else default


def retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the HTTP-date form is not honoured: the usual pause is taken), at most a minute."""
    if value is None or not value.strip().isdigit():
        return None
    return min(60.0, float(value.strip()))


def describe(error: Exception) -> str:
    """A transport failure in words, without the request's headers."""
    kind = type(error).__name__
    words = {"ReadTimeout": "no answer within the timeout", "ConnectTimeout": "could not connect within the timeout",
             "ConnectError": "could not connect", "RemoteProtocolError": "the connection broke off mid-answer",
             "ReadError": "the connection broke off mid-answer", "PoolTimeout": "no connection free within the timeout"}
    return words.get(kind, f"the transfer failed ({kind})")
