"""The progress bars on a real terminal: `stepper run` in a pseudo-terminal, its screen read by a
terminal emulator (tests/helpers/terminal.py)."""

import json
import re
import sys

import pytest

if sys.platform == "win32":
    pytest.skip("needs a POSIX pseudo-terminal", allow_module_level=True)

from tests.helpers.cli import stepper
from tests.helpers.terminal import on_terminal

BAR = "━".encode()
RUN = ("run", "--prompt-len", "64", "--decode", "1", "--only", "*attn_weights")


def same_run(lines: list[str]) -> list[str]:
    """The lines, the memory the machine has free at the time taken out."""
    return [re.sub(r"[\d.]+ GiB available", "… GiB available", line) for line in lines]


@pytest.mark.parametrize("columns", [80, 200])
def test_rows_are_printed_below_the_bar_never_on_its_line(columns):
    """With every loop's bar drawn at once, the screen afterwards is the screen of the same run
    without bars: each row starts its own line, and the bar leaves nothing behind."""
    with_bars = on_terminal(*RUN, columns=columns, env={"STEPPER_PROGRESS_DELAY": "0"})
    without = on_terminal(*RUN, columns=columns, env={"STEPPER_PROGRESS_DELAY": "1000"})
    assert with_bars.code == without.code == 0
    assert BAR in with_bars.raw and b"layers" in with_bars.raw.split(BAR)[0].rsplit(b"\n", 1)[-1]  # a bar was drawn
    assert BAR not in without.raw
    assert "━" not in with_bars.text and "%" not in with_bars.text
    assert same_run(with_bars.lines) == same_run(without.lines)
    assert sum(re.fullmatch(r"(prefill|decode0)\.layers\.\d\.self_attn\.attn_weights", line.split(" ")[0]) is not None
               for line in with_bars.lines) == 3 * 2


def test_json_lines_on_a_terminal_are_not_printed_onto_the_bar():
    with_bars = on_terminal(*RUN, "--json", columns=200, env={"STEPPER_PROGRESS_DELAY": "0"})
    assert with_bars.code == 0 and BAR in with_bars.raw
    records = [json.loads(line) for line in unwrapped(with_bars.lines, 200) if line]  # each whole, on its own lines
    assert [r["name"].split(".")[0] for r in records] == ["prefill"] * 3 + ["decode0"] * 3


def unwrapped(lines: list[str], columns: int) -> list[str]:
    """The lines a terminal wrapped (a line filling the width goes on on the next) joined again."""
    out: list[str] = []
    for line, before in zip(lines, [""] + lines):
        if len(before) == columns:
            out[-1] += line
        else:
            out.append(line)
    return out


def test_synth_shows_its_progress_on_a_terminal_and_nothing_through_a_pipe(tmp_path):
    on_screen = on_terminal("synth", "--model", "tiny", "--out", tmp_path / "on-screen", columns=120)
    assert on_screen.code == 0
    drawn = ESCAPE.sub(b"", on_screen.raw).decode()
    assert BAR in on_screen.raw and "writing on-screen" in drawn and re.search(r"\d+(\.\d+)?/\d+(\.\d+)? [kM]B", drawn)
    assert [line for line in on_screen.lines if line][0].startswith("wrote ")  # the bar gone, the summary left
    piped = stepper("synth", "--model", "tiny", "--out", tmp_path / "piped")
    assert piped.returncode == 0 and piped.stderr == "" and piped.stdout.startswith("wrote ") and piped.stdout.count("\n") == 1


ESCAPE = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")
