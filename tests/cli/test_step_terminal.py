"""`stepper step` in a real pseudo-terminal: type keys, read the screen."""

import os
import pty
import select
import sys
import time

import pytest

if sys.platform == "win32":
    pytest.skip("needs a POSIX pseudo-terminal", allow_module_level=True)


class Terminal:
    """A child process on a pseudo-terminal, with everything it printed kept as text."""

    def __init__(self, *argv: str):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child
            os.environ.update({"COLUMNS": "120", "LINES": "40", "TERM": "xterm-256color"})
            os.execvp(sys.executable, [sys.executable, "-m", "stepper", *argv])
        self.screen = ""

    def read_until(self, text: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while text not in self.screen:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"'{text}' did not appear; screen ends with:\n{self.screen[-2000:]}")
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    self.screen += os.read(self.fd, 65536).decode(errors="replace")
                except OSError:  # the child closed the terminal
                    break
        return self.screen

    def type(self, keys: str) -> None:
        os.write(self.fd, keys.encode())

    def wait(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            self.read_until_quiet()
        os.kill(self.pid, 9)
        raise AssertionError("stepper step did not exit")

    def read_until_quiet(self) -> None:
        ready, _, _ = select.select([self.fd], [], [], 0.1)
        if ready:
            try:
                self.screen += os.read(self.fd, 65536).decode(errors="replace")
            except OSError:
                pass


def test_keystrokes_drive_the_debugger_on_a_terminal():
    term = Terminal("step", "--break", "compressed_kv")
    screen = term.read_until("(stepper) ")
    assert "layer 0 (dense) › latent attention › compressed_kv" in screen
    assert "\x1b[" in screen  # a terminal gets colour
    term.type("\r")  # Enter = next
    screen = term.read_until("› k_pe")
    term.type("p self_attn.k_pe[0,0,0,:2]\r")
    screen = term.read_until("layers.0.self_attn.k_pe[0,0,0,:2]")
    term.type("c\r")
    screen = term.read_until("layer 1 (MoE) › latent attention › compressed_kv")
    term.type("q\r")
    assert term.wait() == 0
