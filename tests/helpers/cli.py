"""The command line run in the test process: `stepper(*args)` does what `python -m stepper ARGS`
does (stepper.cli.main.main with those arguments) and returns the same CompletedProcess, a second
faster (no interpreter to start, nothing to import again).

For what the command prints and writes, not for the process around it: exit codes as a shell
sees them, signals, a terminal, the umask and memory limits are tested with real processes.
Like a child process with stdin=DEVNULL, the command sees: its own stdout and stderr (pipes, not
terminals: bytes in the locale's encoding), an empty stdin (or the given text) and /dev/null on file descriptor 0
(so Rich never takes the width of a terminal the tests were started from), the given working directory and
environment. An exception the command lets escape is a traceback on stderr and exit code 1, as
Python reports it, so a test that says "no traceback" still fails on one. A command that changes a
file that was in the test's tmp_path, outside stepper's own places, fails the test
(helpers.untouched.command_guard).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from helpers import untouched
from stepper.cli.main import main


def stepper(*args: object, cwd: str | Path | None = None, stdin: str = "",
            env: Mapping[str, str | None] | None = None) -> subprocess.CompletedProcess:
    """`stepper ARGS` in this process. env: variables set (a value None removes one) for the run."""
    argv = [str(a) for a in args]
    out, err = _pipe(sys.__stdout__, "strict"), _pipe(sys.__stderr__, "backslashreplace")
    guard = untouched.command_guard(argv, Path(cwd or os.getcwd()), env or {})
    with _process_state(argv, out, err, io.StringIO(stdin), cwd, env or {}):
        code = _exit_code(err)
    changed = guard.check() if guard else []
    assert not changed, f"stepper {' '.join(argv)} changed files it was not asked to: {', '.join(changed[:5])}"
    return subprocess.CompletedProcess(["stepper", *argv], code, _read(out), _read(err))


def one_line(out: subprocess.CompletedProcess, code: int = 2) -> str:
    """The one line a failure writes on stderr (after checking the exit code and that it is alone)."""
    assert out.returncode == code, out.stdout[-2000:] + out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    return lines[0]


def refused(out: subprocess.CompletedProcess) -> str:
    """The one line of a refusal (exit code 2), without its "stepper: error: " prefix."""
    return one_line(out).removeprefix("stepper: error: ").strip()


def ends_well(out: subprocess.CompletedProcess) -> None:
    """Exit 0 or 1 with a verdict, or 2 with one line; never a traceback."""
    assert "Traceback" not in out.stderr and "Traceback" not in out.stdout, out.stderr[-3000:]
    assert out.returncode in (0, 1, 2), out.stderr[-3000:]
    if out.returncode == 2:
        assert len(out.stderr.splitlines()) == 1, out.stderr


def _pipe(like, errors: str) -> io.TextIOWrapper:
    """A stream writing bytes as the interpreter's own stdout or stderr would into a pipe (the
    locale's encoding and error handler: a raw byte from a file name goes out raw)."""
    encoding = getattr(like, "encoding", None) or "utf-8"
    return io.TextIOWrapper(io.BytesIO(), encoding=encoding, errors=getattr(like, "errors", None) or errors,
                            write_through=True)


def _read(stream: io.TextIOWrapper) -> str:
    """The bytes written, decoded as subprocess.run(text=True) decodes them (strictly)."""
    stream.flush()
    return stream.buffer.getvalue().decode(stream.encoding)


def _exit_code(err: io.TextIOWrapper) -> int:
    """main()'s exit status as the interpreter turns it into one."""
    try:
        main()
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        err.write(f"{e.code}\n")
        return 1
    except BaseException:  # noqa: BLE001 (what escapes main is what a user would see)
        err.write(traceback.format_exc())
        return 1
    return 0


@contextmanager
def _process_state(argv: list[str], out, err, stdin, cwd, env: Mapping[str, str | None]) -> Iterator[None]:
    saved_streams = sys.argv, sys.stdout, sys.stderr, sys.stdin
    saved_env = {k: os.environ.get(k) for k in env}
    saved_cwd = os.getcwd()
    try:
        saved_fd0: int | None = os.dup(0)
    except OSError:  # the test process has no stdin at all
        saved_fd0 = None
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
        for k, v in env.items():
            _set_env(k, v)
        if cwd is not None:
            os.chdir(cwd)
        sys.argv, sys.stdout, sys.stderr, sys.stdin = ["stepper", *argv], out, err, stdin
        yield
    finally:
        sys.argv, sys.stdout, sys.stderr, sys.stdin = saved_streams
        os.chdir(saved_cwd)
        for k, v in saved_env.items():
            _set_env(k, v)
        if saved_fd0 is None:
            os.close(0)
        else:
            os.dup2(saved_fd0, 0)
            os.close(saved_fd0)
        os.close(null)


def _set_env(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value
