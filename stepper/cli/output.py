"""Standard output that goes away (`| head`, a pager quit early) or cannot be written (a full disk).

The reader going away is no error: stepper stops printing (its output goes to /dev/null from
then on), and a command that writes files (`run --dump`, `fixtures export`) goes on to finish
them, so that what it was asked to save is whole; any other command ends there, exit 0. Output
that cannot be written (`> /dev/full`) is one line on stderr, exit 2 (user_errors).
"""

from __future__ import annotations

import os
import sys

from rich.console import Console

_finishing = [False]  # whether the running command goes on to finish its files when the reader goes


def install() -> None:
    """Every Rich console of this process follows this policy (Rich's way: its on_broken_pipe,
    which would exit 1 with the files unwritten)."""
    Console.on_broken_pipe = reader_gone


def finish_files_when_the_reader_goes() -> None:
    """Said by a command that writes files: a closed output does not stop it."""
    _finishing[0] = True


def reader_gone(console: Console) -> None:
    """The reader of standard output went away: nothing more is printed; a command writing files
    goes on, any other ends (user_errors takes the BrokenPipeError as a quiet end)."""
    console.quiet = True
    silence_stdout()
    if not _finishing[0]:
        raise BrokenPipeError


def silence_stdout() -> None:
    """Standard output to /dev/null: what is still buffered, or printed later, goes nowhere, and
    Python's flush at exit does not fail again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
