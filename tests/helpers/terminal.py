"""A command run as a user runs it in a terminal: `python -m stepper ARGS` as the child of a
pseudo-terminal of a given width, everything it writes (stdout and stderr, cursor moves, colour)
fed to a terminal emulator (pyte), the screen read afterwards.

The screen is tall enough for the whole output (nothing scrolls away), so its lines are what a
user would see scrolling back after the command.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import sys
import termios
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyte
from pyte.screens import wcwidth

ROWS = 6000  # `stepper fixtures names` writes 5,226 lines at 80 columns (every table, 12-07)


@dataclass
class Screen:
    raw: bytes  # what the command wrote to the terminal
    lines: list[str]  # the screen's lines afterwards, trailing spaces and empty lines at the end dropped
    code: int  # exit code

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


PROMPTS = (b"(stepper) ", b"your prediction> ")  # where the debugger and the lessons wait for a line


def on_terminal(*args: object, columns: int = 80, env: Mapping[str, str] | None = None, timeout: float = 120.0,
                typed: Sequence[str] = (), cwd: str | Path | None = None, python: str | None = None,
                settle: float = 1.0) -> Screen:
    """`stepper ARGS` on a pseudo-terminal `columns` wide: the screen afterwards. At each prompt
    the next of the `typed` lines is typed, and once they are used up, Ctrl-D (end of input), once
    the command has written nothing for `settle` seconds. `python`: a script run in its place
    (`python -c SCRIPT ARGS`), a user's own use of the API."""
    argv = [sys.executable, *(["-c", python] if python is not None else ["-m", "stepper"]), *map(str, args)]
    pid, fd = pty.fork()
    if pid == 0:  # the child: the terminal's size set, then stepper in its place
        try:
            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, columns, 0, 0))
            os.environ.update({"COLUMNS": str(columns), "LINES": str(ROWS), "TERM": "xterm-256color"})
            os.environ.pop("NO_COLOR", None)
            os.environ.update(env or {})
            if cwd is not None:
                os.chdir(cwd)
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    raw = read_all(fd, pid, timeout, list(typed), settle)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    screen = pyte.Screen(columns, ROWS)
    pyte.ByteStream(screen).feed(raw)  # the terminal turned each "\n" into "\r\n"
    lines = written_rows(screen)
    while lines and not lines[-1]:
        lines.pop()
    return Screen(raw, lines, os.waitstatus_to_exitcode(status))


def written_rows(screen: pyte.Screen) -> list[str]:
    """The screen's lines as pyte's `display` renders them (a wide character's second cell left
    out), trailing spaces dropped, down to the last row written to or holding the cursor: the rows
    below are blank (all 6,000 rendered at 400 columns took 1.3 s a command)."""
    last = max([*screen.buffer, screen.cursor.y])
    lines = []
    for y in range(last + 1):
        row, cells, wide = screen.buffer[y], [], False
        for x in range(screen.columns):
            if not wide:
                cells.append(row[x].data)
            wide = not wide and wcwidth(row[x].data[0]) == 2
        lines.append("".join(cells).rstrip())
    return lines


def read_all(fd: int, pid: int, timeout: float, typed: list[str], settle: float = 1.0) -> bytes:
    """Everything the child writes until it closes the terminal (killed after `timeout` seconds),
    a line of `typed` (or Ctrl-D) typed at each prompt."""
    out, deadline, answered = bytearray(), time.monotonic() + timeout, 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, 9)
            raise AssertionError(f"the command did not finish in {timeout} s; it "
                                 f"wrote:\n{out[-2000:].decode(errors='replace')}")
        ready, _, _ = select.select([fd], [], [], min(left, settle))
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                return bytes(out)
            if not chunk:
                return bytes(out)
            out += chunk
        waiting = sum(out.count(prompt) for prompt in PROMPTS)
        if waiting > answered and not ready:  # a prompt, and nothing more to read: it waits for a line
            os.write(fd, (typed.pop(0) + "\r").encode() if typed else b"\x04")
            answered = waiting
