"""Checkpoints that are not on this machine: `hf://ORG/NAME[@REVISION]` and `https://HOST/PATH/`.

Opening one reads config.json and the index whole, then each shard's header in two range
reads (its 8-byte length, then the JSON); a run then reads only the byte ranges of the tensors
it needs, adjacent ranges merged, before it starts (an embedding only its prompt's rows). All of
it lands in a local cache (`fetch_cache`), keyed by the Hub's resolved commit or by the URL, so a
second run of the same layer reads nothing remote. The cached folder is an ordinary checkpoint
folder, read by `Checkpoint` as a local one is, with the same checks.

The Hub is reached through `huggingface_hub` (its endpoint, `HF_ENDPOINT`, its token, `HF_TOKEN`
or the login); a Hub revision that is not a commit is resolved to one once and pinned.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import threading
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit, urlunsplit

import numpy as np

from stepper import files
from stepper.config import Config, load_config
from stepper.errors import StepperError
from stepper.untrusted import shown
from stepper.untrusted.jsonfile import read_json
from stepper.weights.checkpoint import INDEX, SCALE, SINGLE, Checkpoint, is_plain_shard_name
from stepper.weights.fetch_cache import LEDGERS, CachedFile, cache_entries, note_written, refuse_foreign, trim
from stepper.weights.http_ranges import RangeClient, Transfer, missing_extra
from stepper.weights.names import EMBED, global_shapes, layer_shapes
from stepper.weights.safetensors_reader import SafetensorsFile

HF = "hf://"
REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
COMMIT = re.compile(r"[0-9a-f]{40}")
T = TypeVar("T")
SMALL_FILE = 64 << 20  # config.json and the index: more than this is no such file
DEFAULT_MAX_GB = 100.0
RUN_SECONDS = 24 * 3600.0


@dataclass
class Settings:
    """Where fetched bytes are kept and how many, how long a request may take."""

    cache_dir: Path
    max_bytes: int
    timeout: float = 30.0  # the longest wait for a connection or for the next bytes of an answer
    pause: float = 0.5  # before the first retry; doubled for each next one
    run_seconds: float = RUN_SECONDS  # the longest all of a run's requests may take together
    progress: Callable[[str, int],
                       AbstractContextManager[Callable[[int], None]]] | None = None  # (what, bytes) -> advance


def default_settings() -> Settings:
    """STEPPER_CACHE_DIR (else $XDG_CACHE_HOME/stepper/remote, else ~/.cache/stepper/remote),
    STEPPER_CACHE_MAX_GB, in GiB (else 100), STEPPER_REMOTE_TIMEOUT (seconds, else 30)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    folder = Path(os.environ.get("STEPPER_CACHE_DIR") or Path(base) / "stepper" / "remote")
    raw = os.environ.get("STEPPER_CACHE_MAX_GB", "")
    max_bytes = gib_bytes("STEPPER_CACHE_MAX_GB", raw) if raw else int(DEFAULT_MAX_GB * 2**30)
    return Settings(folder, max_bytes, timeout=positive_seconds("STEPPER_REMOTE_TIMEOUT", 30.0))


def positive_number(what: str, raw: str | float, unit: str) -> float:
    """A finite number above 0, else one line naming `what` and the unit it counts."""
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise StepperError(f"{what} must be a number of {unit} above 0, got {shown(str(raw))!r}")
    return value


def gib_bytes(what: str, raw: str | float) -> int:
    """A size in GiB as bytes."""
    return int(positive_number(what, raw, "GiB") * 2**30)


def positive_seconds(variable: str, default: float) -> float:
    """The environment variable's number of seconds, or the default when it is not set."""
    return positive_number(variable, os.environ.get(variable, "") or default, "seconds")


_chosen: Settings | None = None


def configure(chosen: Settings | None) -> None:
    """The settings every remote checkpoint opened from now on uses (the command line's options)."""
    global _chosen
    _chosen = chosen


def settings() -> Settings:
    return _chosen or default_settings()


def is_remote(model: str) -> bool:
    return model.startswith((HF, "https://", "http://"))


@dataclass(frozen=True)
class Origin:
    """A remote checkpoint resolved: how to name a file's URL, the cache key, request headers."""

    label: str  # as the user wrote it, the revision pinned
    key: str  # the cache folder, relative
    url: Callable[[str], str]
    headers: dict[str, str]


_credentials: dict[str, str] = {}  # a URL without its user:password@ -> its Authorization header


def without_credentials(model: str) -> str:
    """A remote URL with its `user:password@` taken out, the credentials kept (in this process
    only) for the requests to it; anything else unchanged. Credentials are never shown or stored:
    the URL without them is the one that is shown, and names the cache folder."""
    if not model.startswith(("https://", "http://")):
        return model
    try:
        parts = urlsplit(model)
        parts.port  # noqa: B018 (a port that is no number raises here, not at the first request)
    except ValueError as e:
        raise StepperError(f"{shown(model)}: not a URL ({e})") from None
    if not parts.hostname:  # (no request could reach it: refused now, not after the retries)
        raise StepperError(f"{shown(model)}: not a URL (it names no host); expected https://HOST/PATH/")
    if "@" not in parts.netloc:
        return model
    userinfo, _, host = parts.netloc.rpartition("@")
    clean = urlunsplit(parts._replace(netloc=host))
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
    _credentials[clean if clean.endswith("/") else clean + "/"] = f"Basic {token}"
    return clean


def resolve(model: str, timeout: float, cache_dir: Path | None = None) -> Origin:
    """hf://ORG/NAME[@REVISION] through the Hub, or a base URL (credentials taken out: see
    without_credentials) whose files are BASE/config.json, ..."""
    if model.startswith(HF):
        return hub_origin(model, timeout, cache_dir or settings().cache_dir)
    base = model if model.endswith("/") else model + "/"
    digest = hashlib.sha256(base.encode()).hexdigest()[:16]
    plain = re.sub(r"[^A-Za-z0-9._-]+", "_", base.split("://", 1)[1]).strip("_")[:80]
    headers = {"Authorization": _credentials[base]} if base in _credentials else {}
    return Origin(base, f"url/{plain}-{digest}", lambda name: base + name, headers)


def hub_origin(model: str, timeout: float, cache_dir: Path) -> Origin:
    repo, _, revision = model.removeprefix(HF).partition("@")
    if not REPO.fullmatch(repo) or ".." in repo:
        raise StepperError(f"{shown(model)}: expected hf://ORG/NAME or hf://ORG/NAME@REVISION")
    try:
        from huggingface_hub import HfApi, constants, hf_hub_url
        from huggingface_hub.utils import build_hf_headers
    except ImportError:
        raise missing_extra() from None
    revision = revision or "main"
    commit = revision if COMMIT.fullmatch(revision) else \
        resolve_revision(HfApi(), repo, revision, timeout, model, cache_dir)
    endpoint = constants.ENDPOINT
    return Origin(f"{HF}{repo}@{commit[:12]}", f"hf/{repo}/{commit}",
                  lambda name: hf_hub_url(repo, name, revision=commit, endpoint=endpoint), build_hf_headers())


def resolve_revision(api, repo: str, revision: str, timeout: float, model: str, cache_dir: Path) -> str:
    """A branch or tag name as the commit it points at now (failing, the commit of the repository
    the cache last used, to name instead)."""
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError

    failed = f"{shown(model)}: cannot resolve revision {shown(revision)!r} on the Hub"
    try:
        sha = within(2 * timeout, lambda: api.model_info(repo, revision=revision, timeout=timeout).sha)
    except TimeoutError:
        raise StepperError(f"{failed} (no answer within {2 * timeout:g} s; given up)"
                           f"{cached_hint(repo, cache_dir)}") from None
    # not found, gated, network: one line, no token
    except (HfHubHTTPError, httpx2.HTTPError, OSError, ValueError) as e:
        first = str(e).splitlines()[0] if str(e) else ""
        raise StepperError(f"{failed} ({type(e).__name__}: {shown(first)}){cached_hint(repo, cache_dir)}") from None
    if not isinstance(sha, str) or not COMMIT.fullmatch(sha):
        raise StepperError(f"{shown(model)}: the Hub gave no commit for revision {shown(revision)!r}")
    return sha


def cached_hint(repo: str, cache_dir: Path) -> str:
    """Where the Hub cannot be asked (offline): the commit of `repo` the cache last used, to run from."""
    folder = cache_dir / "hf" / repo
    used = {e.path.relative_to(folder).parts[0]: e.used for e in sorted(cache_entries(folder), key=lambda e: e.used)}
    commits = [c for c in used if COMMIT.fullmatch(c)]
    return f"; the cache holds what runs fetched of {HF}{repo}@{commits[-1]}: name that commit to run from it" \
        if commits else ""


def within(seconds: float, call: Callable[[], T]) -> T:
    """call()'s result, or TimeoutError once it has taken `seconds`: for a request made by a
    library whose timeout is per read only (a server trickling its answer would hold it for ever).
    The call goes on in a daemon thread, which ends with the process."""
    done: dict[str, Any] = {}

    def work() -> None:
        try:
            done["value"] = call()
        except BaseException as e:  # noqa: BLE001 - handed to the caller, who words it or lets it through
            done["error"] = e

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise TimeoutError
    if "error" in done:
        raise done["error"]
    return done["value"]


@dataclass
class Reached:
    """A remote checkpoint whose small files and shard headers are in the cache: what a checkpoint
    class over its cache folder needs to fetch the rest."""

    folder: Path
    origin: Origin
    cached: dict[str, CachedFile]
    failures: dict[str, str]  # shard -> why its header cannot be read
    transfer: Transfer
    progress: Callable[[str, int], AbstractContextManager[Callable[[int], None]]] | None


def open_remote(model: str, chosen: Settings | None = None,
                read_config: Callable[[str | Path], Config] = load_config) -> RemoteCheckpoint:
    """The remote checkpoint's config, index and shard headers fetched (or found cached), as a
    checkpoint; read_config reads its config.json (Checkpoint)."""
    return RemoteCheckpoint(reach(model, chosen), read_config)


def reach(model: str, chosen: Settings | None = None) -> Reached:
    """config.json, the index and every shard's header fetched (or found cached)."""
    chosen = chosen or settings()
    folder, origin, client = config_folder(model, chosen)
    shards = shard_names(folder, origin)
    cached, failures = {}, {}
    for shard in shards:
        cached[shard] = CachedFile(folder, shard, origin.url(shard), client)
        try:
            cached[shard].open()
        except StepperError as e:
            failures[shard] = str(e)
    trim(chosen.cache_dir, chosen.max_bytes, keep={folder / shard for shard in shards})
    return Reached(folder, origin, cached, failures, client.transfer, chosen.progress)


def config_folder(model: str, chosen: Settings | None = None) -> tuple[Path, Origin, RangeClient]:
    """The cache folder holding the remote checkpoint's config.json and index (fetched once), how
    to reach its files, and the client that fetched them (counting its bytes)."""
    chosen = chosen or settings()
    model = without_credentials(model)
    origin = resolve(model, chosen.timeout, chosen.cache_dir)
    client = RangeClient(origin.headers, timeout=chosen.timeout, pause=chosen.pause, transfer=Transfer(),
                         run_seconds=chosen.run_seconds)
    folder = chosen.cache_dir / origin.key
    files.make_folder(folder / LEDGERS, within=chosen.cache_dir)
    small_files(folder, origin, client)
    return folder, origin, client


def small_files(folder: Path, origin: Origin, client: RangeClient) -> None:
    """config.json and the index (when there is one), fetched whole once."""
    absent = folder / f".{INDEX}.absent"
    for name, required in (("config.json", True), (INDEX, False)):
        path = folder / name
        refuse_foreign(path, absent)
        if files.kind(path) == "file" or (name == INDEX and files.kind(absent) == "file"):
            continue
        data = client.whole(origin.url(name), SMALL_FILE)
        if data is None and required:
            raise StepperError(f"{shown(origin.url(name))}: no such file (404): not a checkpoint")
        try:
            files.write_bytes_atomically(absent if data is None else path, data or b"")
            if data is not None:
                note_written(folder, name, data)
        except OSError as e:
            raise StepperError(f"{shown(path)}: cannot be written ({e.strerror})") from None


def shard_names(folder: Path, origin: Origin) -> list[str]:
    """The shards the index names (plain file names only: they become paths in the cache), or the single file."""
    if not (folder / INDEX).exists():
        return [SINGLE]
    raw = read_json(folder / INDEX, "the checkpoint index")
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict):
        raise StepperError(f"{shown(origin.url(INDEX))}: expected an object with a 'weight_map' of tensor name -> "
                           "shard file")
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or not is_plain_shard_name(shard):
            raise StepperError(f"{shown(origin.url(INDEX))}: tensor {shown(tensor)!r} points at shard "
                               f"{shown(shard)!r}, expected a file name ending in .safetensors")
    return sorted(set(weight_map.values()))


class FetchedFile(SafetensorsFile):
    """A shard of the cache whose tensors are fetched before they are read."""

    def __init__(self, path: Path, cached: CachedFile):
        self.cached = cached
        super().__init__(path)

    def get(self, name: str) -> np.ndarray:
        self.cached.ensure([self.data_range(name)])
        return super().get(name)

    def values(self, name: str) -> np.ndarray:
        self.cached.ensure([self.data_range(name)])
        return super().values(name)

    def prefetch(self, name: str) -> None:
        self.cached.ensure([self.data_range(name)])
        super().prefetch(name)


class RemoteReads:
    """What a checkpoint over a remote one's cache folder does differently: its shards fetch what
    is read, a run's tensors are fetched in merged ranges once they are checked, before any
    compute, and an embedding's rows alone. Mixed in before a Checkpoint class."""

    reads_values = False  # `inspect` lists from the headers alone, reading no scale values
    remote: Reached
    weight_map: dict[str, str]
    shard_of: Callable[[str], SafetensorsFile]

    @property
    def label(self) -> str:
        return self.remote.origin.label

    @property
    def transfer(self) -> Transfer:
        return self.remote.transfer

    def open_file(self, path: Path) -> SafetensorsFile:
        return FetchedFile(path, self.remote.cached[path.name])

    def note_failures(self, unreadable: dict[str, str]) -> None:
        """The shards whose headers could not be fetched, said as the server's answer."""
        origin = self.remote.origin
        unreadable.update({shard: why.removeprefix(f"{origin.url(shard)}: ")
                           for shard, why in self.remote.failures.items()})

    def fetch(self, names: list[str]) -> None:
        """Every byte of these tensors present locally, each shard's ranges in merged requests,
        with a progress bar in bytes when one is wanted."""
        per_shard: dict[str, list[tuple[int, int]]] = {}
        for name in names:
            per_shard.setdefault(self.weight_map[name], []).append(self.shard_of(name).data_range(name))
        cached, progress = self.remote.cached, self.remote.progress
        total = sum(cached[shard].missing_bytes(ranges) for shard, ranges in per_shard.items())
        if not total or progress is None:
            return self._fetch(per_shard)
        with progress(f"fetching {self.label}", total) as advance:
            self.transfer.on_bytes = advance
            try:
                self._fetch(per_shard)
            finally:
                self.transfer.on_bytes = None

    def _fetch(self, per_shard: dict[str, list[tuple[int, int]]]) -> None:
        for shard, ranges in per_shard.items():
            self.remote.cached[shard].ensure(ranges)

    def note(self) -> str:
        """What the run read: from the server and from the cache."""
        t = self.transfer
        rate = f", {t.fetched / t.seconds / 2**20:.1f} MiB/s" if t.seconds > 0 and t.fetched else ""
        repaired = f", {t.repaired} corrupted cached range(s) fetched again" if t.repaired else ""
        return (f"fetched {human(t.fetched)} in {t.requests} request(s){rate}, {human(t.cached)} from the cache "
                f"({shown(self.remote.folder)}){repaired}")

    def fetched_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        """The rows of a tensor stored row by row (not FP8: a block's scale spans 128 rows), only
        their bytes fetched."""
        shard = self.shard_of(name)
        info = shard.info(name)
        start, _ = shard.data_range(name)
        row_bytes = info.nbytes // info.shape[0]
        self.remote.cached[self.weight_map[name]].ensure([(start + int(r) * row_bytes,
                                                           start + (int(r) + 1) * row_bytes) for r in np.unique(rows)])
        return np.asarray(SafetensorsFile.get(shard, name)[rows], dtype=np.float32)  # the mapped view, no fetch


class RemoteCheckpoint(RemoteReads, Checkpoint):
    """A Checkpoint over the cache folder of a remote one (RemoteReads)."""

    def __init__(self, reached: Reached, read_config: Callable[[str | Path], Config] = load_config):
        self.remote = reached
        super().__init__(reached.folder, read_config)
        self.note_failures(self.unreadable)

    def check(self, layers: Iterable[int], with_globals: bool) -> None:
        layers = list(layers)
        super().check(layers, with_globals)
        self.fetch(self.needed(layers, with_globals))

    def needed(self, layers: list[int], with_globals: bool) -> list[str]:
        """The run's tensors and their scales, but for the embedding (only its prompt's rows are read)."""
        names = [n for layer in layers for n in layer_shapes(self.config, layer)]
        names += [n for n in global_shapes(self.config) if n != EMBED] if with_globals else []
        return [n for name in names for n in (name, name + SCALE) if n in self.weight_map]

    def get_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Only the rows' bytes fetched (an embedding's prompt rows), unless the tensor is FP8."""
        info = self.shard_of(name).info(name)
        if info.dtype == "F8_E4M3" or not info.shape:
            return super().get_rows(name, rows)
        return self.fetched_rows(name, rows)


def human(n: int) -> str:
    """Bytes in binary units, the ones the cache's limit is set in (GiB = 2**30 bytes) and the rest
    of stepper shows: '100.0 GiB', '3.2 MiB', '512 B'."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
