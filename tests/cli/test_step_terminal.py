"""`stepper step` in a real pseudo-terminal: type keys, read the screen."""

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
import unicodedata

import pytest

if sys.platform == "win32":
    pytest.skip("needs a POSIX pseudo-terminal", allow_module_level=True)


class Terminal:
    """A child process on a pseudo-terminal, with everything it printed kept as text."""

    def __init__(self, *argv: str, columns: int = 120):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the terminal's size set, then stepper in its place
            try:
                fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
                os.environ.update({"COLUMNS": str(columns), "LINES": "40", "TERM": "xterm-256color"})
                os.execvp(sys.executable, [sys.executable, "-m", "stepper", *argv])
            finally:
                os._exit(127)
        self.screen = ""

    def read_until(self, text: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while text not in self.screen and text not in ESCAPE.sub("", self.screen):
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
    deadline = time.monotonic() + 30
    while not ESCAPE.sub("", term.screen).rstrip().endswith("(stepper)") and time.monotonic() < deadline:
        term.read_until_quiet()  # the prompt of this stop, where the key is read
    term.type("\x04")  # Ctrl-D at the prompt: said as the key the user pressed, not as a pipe's end
    assert term.wait() == 0
    assert "(Ctrl-D: quitting)" in ESCAPE.sub("", term.screen)


ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def lines(screen: str) -> list[str]:
    """The screen's text lines, colour and cursor codes taken out."""
    return [part.rsplit("\r", 1)[-1] for part in ESCAPE.sub("", screen).replace("\r\n", "\n").split("\n")]


def cells(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def test_no_progress_bar_shares_a_line_with_the_prompt():
    """The layer bar appears once a layer loop has run for a second: waiting at layer 0's stop
    makes it appear on the way to layer 1. At the next stop it leaves before anything is printed."""
    term = Terminal("step", "--break", "layers.0.output", "--break", "layers.1.self_attn.k_pe")
    term.read_until("(stepper) ")
    time.sleep(1.2)
    term.type("c\r")
    term.read_until("layer 1 (MoE) › latent attention › k_pe")
    screen = term.read_until("(stepper) ", timeout=30) if term.screen.count("(stepper) ") < 2 else term.screen
    time.sleep(0.6)  # a live bar would redraw itself meanwhile
    term.read_until_quiet()
    stop = term.screen[term.screen.rindex("› latent attention › k_pe"):]
    assert "━" not in stop and "layers" not in ESCAPE.sub("", stop).split("\n")[-1]
    assert "━" in term.screen[:term.screen.rindex("› latent attention › k_pe")]  # the bar was drawn on the way
    term.type("h 1\r")
    screen = term.read_until("  layers.1.self_attn.k_pe  [1, 1, 7, 16]")
    assert "(stepper) h 1" in lines(screen)  # the command echoes right after its prompt
    term.type("q\r")
    assert term.wait() == 0


def test_line_editing_and_history_at_the_prompt():
    """Up brings back the last command, Left moves inside the line (readline), not '^[[A'."""
    term = Terminal("step", "--break", "compressed_kv")
    term.read_until("(stepper) ")
    term.type("p embed[0,0,:2]\r")
    term.read_until("embed[0,0,:2]  [2]")
    term.type("\x1b[A\r")  # Up, Enter: the same command again
    deadline = time.monotonic() + 30
    while term.screen.count("embed[0,0,:2]  [2]") < 2 and time.monotonic() < deadline:
        term.read_until_quiet()
    assert term.screen.count("embed[0,0,:2]  [2]") == 2
    term.type("p embed[0,0,:]\x1b[D3\r")  # Left, then 3 typed before the ]
    screen = term.read_until("embed[0,0,:3]  [3]")
    term.type("help x\r")
    screen = term.read_until("e.g. x compressed_kv kv_a[..., :128]")
    assert "unknown command" not in screen
    term.type("q\r")
    assert term.wait() == 0


def test_ctrl_c_at_the_prompt_drops_the_line_and_asks_again():
    """As other debuggers: Ctrl-C at the prompt drops what was typed, the session goes on (it ended
    the whole run, with the helpers' tracebacks)."""
    term = Terminal("step", "--break", "compressed_kv")
    term.read_until("(stepper) ")
    while select.select([term.fd], [], [], 1)[0]:  # the stop fully drawn and the prompt waiting, then keys
        term.read_until_quiet()
    term.type("p emb")
    term.read_until("p emb")  # read by the line editor before the Ctrl-C that drops it
    dropped = "(line dropped: q or Ctrl-D quits)"
    for _ in range(10):  # again once all is quiet: a SIGINT before readline waits is noticed only at the next key
        term.type("\x03")
        while dropped not in ESCAPE.sub("", term.screen) and select.select([term.fd], [], [], 2)[0]:
            term.read_until_quiet()  # the echo of ^C alone is no answer: read until the line dropped, or silence
        if dropped in ESCAPE.sub("", term.screen):
            break
    term.read_until(dropped)
    term.type("p embed[0,0,:2]\r")
    term.read_until("embed[0,0,:2]  [2]")
    term.type("q\r")
    assert term.wait() == 0
    assert "Traceback" not in term.screen and "interrupted" not in term.screen


@pytest.mark.parametrize("columns", [80, 160])
def test_everything_fits_the_terminal_width(columns):
    """No line is longer than the terminal, so the terminal never breaks a word: the name line
    breaks between the shape's dims, the statistics between fields, prose at spaces."""
    term = Terminal("step", "--decode", "1", "--break", "decode0.layers.1.self_attn.q_pe_rope", columns=columns)
    term.read_until("(stepper) ")
    for command, last in (("?", "e.g. help x"), ("help p", "e.g. p attn_weights[0, 1, -1]"),
                          ("e", "(stepper) "), ("x q_pe_rope q_pe", "non-finite in one only"),
                          ("s routing", "busiest:"), ("s attention", "a row per head")):
        term.type(command + "\r")
        term.read_until(last)
        term.read_until_quiet()
    term.type("q\r")
    assert term.wait() == 0
    shown = lines(term.screen)
    too_long = [line for line in shown if cells(line) > columns]
    assert not too_long, too_long
    text = "\n".join(shown)
    for field in ("nan 0", "inf 0", "h history", "s show attention|routing|hist|scales [NAME]",
                  "T=1 position,",
                  "picks in the router's order" if columns == 160 else "picks"):
        assert field in text, field
    name = next(i for i,
                line in enumerate(shown) if line.startswith("decode0.layers.1.self_attn.q_pe_rope  [B=1 batch,"))
    if columns == 80:  # too long for one line: broken between dims and between fields
        assert shown[name].endswith(",") and shown[name + 1].startswith("    ")
        assert shown[name + 2].startswith("    min ") and shown[name + 3].startswith("    ")
    else:
        assert shown[name].endswith("float32") and shown[name + 1].startswith("    min ")
        assert "nan 0  inf 0" in shown[name + 1]


@pytest.mark.parametrize("columns", [80, 160])
def test_explain_breaks_no_word_at_the_terminal_width(columns):
    """Every word of `stepper explain` on a terminal is a word of its piped output: lines break at spaces."""
    term = Terminal("explain", "k_pe", columns=columns)
    assert term.wait() == 0
    shown = lines(term.screen)
    assert shown and all(cells(line) <= columns for line in shown)
    piped = subprocess.run([sys.executable, "-m", "stepper", "explain", "k_pe"], capture_output=True, text=True,
                           check=True, timeout=60).stdout
    words = set(piped.split())
    broken = [w for line in shown for w in line.split() if w not in words]
    assert not broken, broken
    assert max(map(len, piped.splitlines())) > 160  # there was something to wrap


@pytest.mark.parametrize("columns", [80, 160])
def test_the_indexer_picture_fits_the_terminal_width(columns):
    """On DeepSeek-V3.2, s attention adds the indexer's kept positions beside a head's weights:
    side by side when they fit, every line within the terminal, the legend and caption wrapped."""
    term = Terminal("step", "--model", "tiny-v32", "--prompt-len", "40", "--until", "layers.0.self_attn.attn_weights",
                    columns=columns)
    term.read_until("(stepper) ")
    term.type("s attention\r")
    term.read_until("dropped a position")
    term.read_until_quiet()
    term.type("q\r")
    assert term.wait() == 0
    shown = lines(term.screen)
    assert not [line for line in shown if cells(line) > columns]
    top = next(line for line in shown if line.startswith("indexer kept"))
    assert "head 0" in top, "the two maps side by side"
    assert "× dropped by the indexer" in "\n".join(shown)
