"""Every command of README and docs/*.md (tests/helpers/docs.py), as a user sees it in a terminal 80
columns wide: no line is wider than the terminal (the terminal would break it anywhere) and no
word or number is broken across lines.

Each command runs in a pseudo-terminal (tests/helpers/terminal.py) 80 columns wide and again 400
wide, in fresh folders, one per code block (its commands build on each other). What it
writes is cut at its line ends and measured; and every word of the wide screen (whitespace
apart) must be found whole on the narrow one, as often: a word split by a line end is two other
words there. Rules, bars, borders and separators (no letter or digit) are left out, their length
or place being the width's; so are the figures that change from one run to the next.
"""

import re
import shlex
import sys
import unicodedata
from collections import Counter
from pathlib import Path

import pytest

if sys.platform == "win32":
    pytest.skip("needs a POSIX pseudo-terminal", allow_module_level=True)

from tests.cli.test_readme_commands import BEFORE, BLOCKS, SKIPPED
from tests.helpers.terminal import on_terminal

NARROW, WIDE = 80, 400

EXTRA = [[("stepper fixtures names", [])]]  # what README names in its text and no block runs


def typed_lines(shown: list[str]) -> list[str]:
    """What README's transcript types at the debugger's prompt."""
    return [line.removeprefix("(stepper) ") for line in shown if line.startswith("(stepper) ")]


CASES = [[(command, typed_lines(shown)) for command,
          shown in runs if command not in SKIPPED] for runs in BLOCKS] + EXTRA
ESCAPE = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
VARYING = [(re.compile(r"[\d.]+ GiB available"), "… GiB available"), (re.compile(r"\(\d+(\.\d+)? s\)"), "(… s)")]


def written_lines(raw: bytes) -> list[str]:
    """The lines as written (colour codes out), each as a terminal shows it after a carriage return
    (a progress bar's too, drawn and gone)."""
    text = ESCAPE.sub(b"", raw).decode(errors="replace").replace("\r\n", "\n")
    return [line.rsplit("\r", 1)[-1].rstrip() for line in text.split("\n")]


def cells(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def words(lines: list[str]) -> Counter:
    text = "\n".join(lines)
    for pattern, same in VARYING:
        text = pattern.sub(same, text)
    return Counter(w for w in text.split() if any(c.isalnum() for c in w))


def run_block(block: list[tuple[str, list[str]]], folder: Path, columns: int) -> dict[str, tuple[list[str], list[str]]]:
    """Each command of a block in `folder`: the lines it wrote, and the screen's lines afterwards."""
    folder.mkdir()
    env = {"STEPPER_DATA_DIR": "data", "STEPPER_PROGRESS_DELAY": "1000"}  # in the folder, named as a user's would be
    out = {}
    for command, typed in block:
        if command in BEFORE:
            BEFORE[command](folder)
        screen = on_terminal(*shlex.split(command)[1:], columns=columns, env=env, typed=typed, cwd=folder)
        out[command] = (written_lines(screen.raw), screen.lines)
    return out


@pytest.mark.parametrize("block", CASES, ids=[block[0][0][:40] for block in CASES])
def test_every_command_fits_80_columns_and_breaks_lines_between_words(block, tmp_path):
    narrow = run_block(block, tmp_path / "narrow", NARROW)
    wide = run_block(block, tmp_path / "wide", WIDE)
    for command, (written, screen) in narrow.items():
        over = [line for line in written if cells(line) > NARROW]
        assert not over, f"{command}: {len(over)} lines wider than {NARROW} columns, e.g.\n{over[0]}"
        broken = words(wide[command][1]) - words(screen)
        assert not broken, f"{command}: words broken across lines at {NARROW} columns: {sorted(broken)[:10]}"
        assert sum(words(wide[command][1]).values()) > 3, f"{command} printed almost nothing"


def test_notes_on_stderr_break_between_words_too(tmp_path):
    """stepper's notes and warnings on stderr (a fixture's tensors missing from a dump, the first NaN)
    follow the same rule as its output on a terminal."""
    fixtures = Path(__file__).resolve().parents[2] / "fixtures"
    (tmp_path / "dump.safetensors").write_bytes((fixtures / "tiny-prefill-decode" / "tensors.safetensors").read_bytes())
    screen = on_terminal("fixtures", "verify", fixtures / "tiny-kimi-linear-kda", "dump.safetensors", "--problems",
                         columns=NARROW, cwd=tmp_path)
    note = [line for line in written_lines(screen.raw) if "tensors are missing" in line or "accept that" in line]
    assert screen.code == 1 and len(note) == 2 and all(cells(line) <= NARROW for line in note), note
    assert "--allow-missing" in " ".join(note).split()  # whole, as every word
    nan = on_terminal("run", "--model", "tiny-v4", "--prompt-len", "8", "--patch", "embed_streams=x[0,0]=x[0,0]*nan",
                      "--only", "layers.1.hc_ffn.comb", columns=NARROW, cwd=tmp_path)
    warning = [line for line in written_lines(nan.raw) if "warning" in line or "made from" in line]
    assert nan.code == 0 and warning and all(cells(line) <= NARROW for line in written_lines(nan.raw)), warning
    error = on_terminal("run", "--model", "tiny", "--layer", "99", columns=40, cwd=tmp_path)
    assert error.code == 2 and len(error.lines) == 2 and all(cells(line) <= 40 for line in error.lines), error.lines
    assert " ".join(error.lines) == "stepper: error: layer 99 out of range: model tiny has layers 0..2"
