"""A local HTTP server (127.0.0.1 only) serving a folder with range requests, for remote tests.

It serves `/PATH` from the folder and, as a Hub endpoint, `/{org}/{name}/resolve/{revision}/{file}` (from NAME/file)
and `/api/models/{org}/{name}/revision/{revision}` (the commit a revision points at). It counts
the file bytes it sends and the requests, and can be told to misbehave on the next requests: a
5xx or 429, a dropped connection mid-body, a short body, a wrong Content-Range, a stall, a
changed ETag, a body trickled one byte every `trickle_seconds` ("trickle"), the status line and
headers trickled the same way ("trickle-headers", counted in `head_sent`; also the Hub API's
answers, with `api_fault`), a Content-Range
whose total is 2^60 ("huge-total"). Written from the HTTP range semantics (RFC 9110), independently of stepper's client.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"
HUB_FILE = re.compile(r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)")
HUB_API = re.compile(r"/api/models/(?P<repo>[^/]+/[^/]+)/revision/(?P<rev>[^/]+)")
RANGE = re.compile(r"bytes=(\d+)-(\d+)")


class Quiet(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:  # a client that gave up mid-answer (a timeout test)
        pass


class RangeServer:
    def __init__(self, root: Path):
        self.root = root
        self.sent = 0  # file bytes sent
        self.head_sent = 0  # bytes of trickled status lines and headers sent
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header)
        self.headers_seen: list[dict[str, str]] = []  # each request's headers, names in lower case
        self.faults: list[str] = []  # applied one per request, first first
        self.api_fault: str | None = None  # "trickle-headers": every Hub API answer trickled so
        self.etag_suffix = ""
        self.trickle_seconds = 0.2
        self.lock = threading.Lock()
        self.server = Quiet(("127.0.0.1", 0), self.handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def reset_counts(self) -> None:
        with self.lock:
            self.sent, self.requests = 0, []

    def next_fault(self) -> str | None:
        with self.lock:
            return self.faults.pop(0) if self.faults else None

    def handler(self) -> type[BaseHTTPRequestHandler]:
        return type("Handler", (RangeHandler,), {"ranged": self})


class RangeHandler(BaseHTTPRequestHandler):
    """Answers one RangeServer's requests (`ranged`: set on the subclass `RangeServer.handler` makes)."""

    ranged: RangeServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        with self.ranged.lock:
            self.ranged.requests.append((self.path, self.headers.get("Range")))
            self.ranged.headers_seen.append({k.lower(): v for k, v in self.headers.items()})
        api = HUB_API.fullmatch(self.path)
        if api:
            return self.send_json({"id": api["repo"], "sha": COMMIT, "siblings": []})
        hub = HUB_FILE.fullmatch(self.path)
        relative = (f"{hub['repo'].split('/')[1]}/{hub['file']}" if hub
                    else self.path.lstrip("/"))  # ORG/NAME: ROOT/NAME
        path = self.ranged.root / relative
        if ".." in relative or not path.is_file():
            return self.send_status(404)
        self.send_file(path, self.ranged.next_fault())

    def send_status(self, status: int, headers: dict | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def send_json(self, value) -> None:
        body = json.dumps(value).encode()
        if self.ranged.api_fault == "trickle-headers":
            self.trickle_head(200, {"Content-Type": "application/json"}, body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def send_file(self, path: Path, fault: str | None) -> None:
        if fault in ("500", "503"):
            return self.send_status(int(fault))
        if fault == "429":
            return self.send_status(429, {"Retry-After": "0"})
        data = path.read_bytes()
        etag = '"' + hashlib.sha256(data).hexdigest()[:16] + self.ranged.etag_suffix + '"'
        asked = RANGE.fullmatch(self.headers.get("Range", ""))
        if asked:
            start, last = int(asked[1]), min(int(asked[2]), len(data) - 1)
            body, status = data[start : last + 1], 206
            shown_start = start + 1 if fault == "bad-range" else start
            total = 2**60 if fault == "huge-total" else len(data)
            content_range = f"bytes {shown_start}-{last}/{total}"
        else:
            body, status, content_range = data, 200, None
        if fault == "stall":
            time.sleep(3)
        if fault == "trickle-headers":
            self.trickle_head(status, {"ETag": etag, "Content-Range": content_range}, body)
            return
        self.send_response(status)
        self.send_header("ETag", etag)
        if content_range:
            self.send_header("Content-Range", content_range)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if fault in ("drop", "short"):
            body = body[: len(body) // 2]
        if fault == "trickle":
            self.trickle(body)
            return
        self.wfile.write(body)
        with self.ranged.lock:
            self.ranged.sent += len(body)
        if fault in ("drop", "short"):
            self.close_connection = True
            self.wfile.flush()
            self.connection.shutdown(2)

    def trickle(self, data: bytes, counter: str = "sent") -> bool:
        """One byte at a time, each after a pause, counted in self.ranged.<counter>; whether all went
        (not if the client gave up)."""
        for i in range(len(data)):
            time.sleep(self.ranged.trickle_seconds)
            try:
                self.wfile.write(data[i : i + 1])
                self.wfile.flush()
            except OSError:
                return False
            with self.ranged.lock:
                setattr(self.ranged, counter, getattr(self.ranged, counter) + 1)
        return True

    def trickle_head(self, status: int, headers: dict, body: bytes) -> None:
        """The status line and headers trickled, then the body at once."""
        lines = [f"HTTP/1.1 {status} Partial\r\n"] + [f"{k}: {v}\r\n" for k, v in headers.items() if v]
        if self.trickle("".join(lines + [f"Content-Length: {len(body)}\r\n\r\n"]).encode(), "head_sent"):
            self.wfile.write(body)
