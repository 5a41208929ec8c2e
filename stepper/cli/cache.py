"""`stepper cache`: what is kept of remote checkpoints, and clearing it.

Also the options that choose the cache for every command (`stepper --cache-dir DIR ...`), and the
progress bar in bytes that a remote run shows while it fetches.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.text import Text

from stepper import files
from stepper.cli import usage
from stepper.cli.common import PlainOpt, user_errors
from stepper.errors import StepperError
from stepper.untrusted import shown
from stepper.views.fitted_table import fitted
from stepper.views.sinks import line_width, print_whole, styles
from stepper.weights import fetch_cache, remote

cache_app = usage.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    help="The local cache of remote checkpoints (hf://ORG/NAME, https://HOST/PATH/): list or clear it.",
)

CacheDirOpt = Annotated[Path | None, typer.Option("--cache-dir", metavar="DIR",
    show_default="$STEPPER_CACHE_DIR or ~/.cache/stepper/remote",
    help="Where the bytes fetched of remote checkpoints are kept.")]
CacheMaxOpt = Annotated[float | None, typer.Option("--cache-max-gb", metavar="GiB",
    show_default="$STEPPER_CACHE_MAX_GB or 100",
    help="The most the cache keeps, in GiB (2**30 bytes); least recently used files go first.")]


def choose(cache_dir: Path | None, max_gb: float | None) -> None:
    """The cache every remote checkpoint of this command uses, and a progress bar on a terminal."""
    max_bytes = None if max_gb is None else remote.gib_bytes("--cache-max-gb", max_gb)
    chosen = remote.default_settings()
    if cache_dir is not None:
        if cache_dir.exists() and not cache_dir.is_dir():
            raise StepperError(f"--cache-dir {shown(str(cache_dir))}: is a file, not a folder")
        chosen.cache_dir = cache_dir
    if max_bytes is not None:
        chosen.max_bytes = max_bytes
    if sys.stderr.isatty():
        chosen.progress = byte_progress
    remote.configure(chosen)


@contextmanager
def byte_progress(what: str, total: int) -> Iterator[Callable[[int], None]]:
    """A bar in bytes with the rate, on stderr, gone when done."""
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True, **styles(False)), transient=True) as bar:
        task = bar.add_task(shown(what), total=total)
        yield lambda n: bar.advance(task, n)


COLUMNS = (("checkpoint", "left"), ("files", "right"), ("kept", "right"), ("last used", "left"))


@cache_app.command("ls", short_help="Each cached remote checkpoint: files, bytes, last use.")
def ls_command(plain: PlainOpt = False) -> None:
    """Each cached remote checkpoint: its files, the bytes kept, when last used."""
    with user_errors():
        root = remote.settings().cache_dir
        entries = fetch_cache.cache_entries(root)
        console = Console(**styles(plain), highlight=False, markup=False, soft_wrap=True)
        per_folder: dict[Path, list[fetch_cache.CacheEntry]] = {}
        for h in entries:
            per_folder.setdefault(h.path.parent, []).append(h)
        rows: list[dict[str, str | Text]] = []
        for folder, files in sorted(per_folder.items()):  # each name whole: `stepper cache clear` takes it
            used = datetime.fromtimestamp(max(h.used for h in files)).strftime("%Y-%m-%d %H:%M")
            rows.append({"checkpoint": shown(folder.relative_to(root)), "files": str(len(files)),
                         "kept": remote.human(sum(h.bytes for h in files)), "last used": used})
        total = sum(h.bytes for h in entries)
        if per_folder:
            print_whole(console, fitted("", COLUMNS, rows, "checkpoint", (), line_width(console)))
        console.print(f"{remote.human(total)} kept in {shown(root)} (at most "
                      f"{remote.human(remote.settings().max_bytes)})")


@cache_app.command("clear")
def clear_command(
    checkpoint: Annotated[str | None, typer.Argument(
        metavar="CHECKPOINT", show_default="all",
        help="One cached checkpoint, as `stepper cache ls` names it.")] = None,
) -> None:
    """Remove what was fetched: every remote checkpoint, or one. Only stepper's files go; a folder
    holding anything else stays, and is named."""
    with user_errors():
        root = remote.settings().cache_dir
        target = root if checkpoint is None else cached_folder(root, checkpoint)
        freed = sum(h.bytes for h in fetch_cache.cache_entries(target))
        left = fetch_cache.clear(target, keep_target=checkpoint is None)
        print(f"removed {remote.human(freed)} from {shown(target)}")
        if left:
            listed = (", ".join(shown(p.relative_to(target)) for p in left[:3])
                      + (f" and {len(left) - 3} more" if len(left) > 3 else ""))
            print(f"left {shown(target)}: it holds what stepper did not write ({listed})")
        elif files.kind(target) == "link":
            print(f"left {shown(target)}: a link, not made by stepper")


def cached_folder(root: Path, checkpoint: str) -> Path:
    """The folder of one cached checkpoint (or a part of the cache: hf/ORG), never through a link."""
    parts = Path(checkpoint).parts
    folder = root.joinpath(*parts)
    if not parts or Path(checkpoint).is_absolute() or ".." in parts or any(
            files.kind(root.joinpath(*parts[:i])) != "folder" for i in range(1, len(parts) + 1)):
        raise StepperError(f"{shown(checkpoint)}: no such cached checkpoint in {shown(root)} (see stepper cache ls)")
    return folder
