"""The progress bars on a real terminal: `stepper run` in a pseudo-terminal, its screen read by a
terminal emulator (tests/helpers/terminal.py)."""

import json
import re
import sys
from contextlib import contextmanager

import pytest

if sys.platform == "win32":
    pytest.skip("needs a POSIX pseudo-terminal", allow_module_level=True)

from stepper.model import synthetic_cache
from stepper.presets import preset
from stepper.session import STEPS, RunSpec, run
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.synth_checkpoint import synth_checkpoint
from tests.helpers.cli import stepper
from tests.helpers.terminal import on_terminal

BAR = "━".encode()
RUN = ("run", "--prompt-len", "64", "--decode", "1", "--only", "*attn_weights")


def same_run(lines: list[str]) -> list[str]:
    """The lines, the memory the machine has free at the time taken out."""
    return [re.sub(r"[\d.]+ GiB available", "… GiB available", line) for line in lines]


@pytest.mark.parametrize(("args", "columns"), [(RUN, 80), (RUN, 200),
                                               (("run", "--prompt-len", "16", "--decode", "1"), 80)])
def test_rows_are_printed_below_the_bar_never_on_its_line(args, columns):
    """With every loop's bar drawn at once, the screen afterwards is the screen of the same run
    without bars: each row starts its own line, and the bar leaves nothing behind."""
    with_bars = on_terminal(*args, columns=columns, env={"STEPPER_PROGRESS_DELAY": "0"})
    without = on_terminal(*args, columns=columns, env={"STEPPER_PROGRESS_DELAY": "1000"})
    assert with_bars.code == without.code == 0
    assert (BAR in with_bars.raw and b"layers" in with_bars.raw
            and b"steps (the prefill" in with_bars.raw)  # bars were drawn
    assert BAR not in without.raw
    assert "━" not in with_bars.text and "%" not in with_bars.text
    assert same_run(with_bars.lines) == same_run(without.lines)
    assert sum(re.fullmatch(r"(prefill|decode0)\.layers\.\d\.self_attn\.attn_weights", line.split(" ")[0]) is not None
               for line in with_bars.lines) == 3 * 2


def test_json_lines_on_a_terminal_are_not_printed_onto_the_bar():
    with_bars = on_terminal(*RUN, "--json", columns=200, env={"STEPPER_PROGRESS_DELAY": "0"})
    without = on_terminal(*RUN, "--json", columns=200, env={"STEPPER_PROGRESS_DELAY": "1000"})
    assert with_bars.code == without.code == 0 and BAR in with_bars.raw and BAR not in without.raw
    assert with_bars.lines == without.lines
    records = [json.loads(line) for line in without.raw.decode().split("\r\n") if line]
    assert [r["name"].split(".")[0] for r in records] == ["prefill"] * 3 + ["decode0"] * 3


def test_synth_shows_its_progress_on_a_terminal_and_nothing_through_a_pipe(tmp_path):
    on_screen = on_terminal("synth", "--model", "tiny", "--out", tmp_path / "on-screen", columns=120)
    assert on_screen.code == 0
    drawn = ESCAPE.sub(b"", on_screen.raw).decode()
    assert BAR in on_screen.raw and "writing on-screen" in drawn and re.search(r"\d+(\.\d+)?/\d+(\.\d+)? [kM]B", drawn)
    assert next(line for line in on_screen.lines if line).startswith("wrote ")  # the bar gone, the summary left
    piped = stepper("synth", "--model", "tiny", "--out", tmp_path / "piped")
    assert (piped.returncode == 0 and piped.stderr == "" and piped.stdout.startswith("wrote ")
            and piped.stdout.count("\n") == 1)


ESCAPE = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def test_synth_reports_every_byte_of_its_tensors_once(tmp_path):
    told: list[tuple[str, int]] = []
    advanced: list[int] = []

    @contextmanager
    def progress(what, total):
        told.append((what, total))
        yield advanced.append

    folder = synth_checkpoint(SyntheticWeights(preset("tiny"), seed=0), tmp_path / "ck", progress=progress)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert told == [("writing ck", index["metadata"]["total_size"])]
    assert sum(advanced) == told[0][1] and len(advanced) == len(index["weight_map"])


class Reports:
    """A sink keeping the progress reports of a run (and no tensor)."""

    def __init__(self):
        self.reports: list[tuple[str, int, int]] = []

    def __call__(self, _event):
        pass

    def wants(self, _event):
        return False

    def progress(self, task, done, total):
        self.reports.append((task, done, total))


def test_a_long_cache_and_the_steps_report_their_progress():
    """The silent parts of a long-context run: the synthetic cache (drawn, then up-projected for
    the naive prefill, 8192 positions at a time) and the prefill and decode steps."""
    sink = Reports()
    run(RunSpec(layer=1, prompt_len=1, decode=1, cache_len=20000, attn="auto"), [sink])
    cache = [(done, total) for task, done, total in sink.reports if task == synthetic_cache.TASK]
    assert cache == [(0, 40000), (8192, 40000), (16384, 40000), (20000, 40000), (28192, 40000), (36384, 40000),
                     (40000, 40000)]
    assert [(done, total) for task, done, total in sink.reports if task == STEPS] == [(0, 2), (1, 2), (2, 2)]


def test_the_long_run_shows_its_bars_on_a_terminal_and_leaves_a_clean_screen():
    args = ("run", "--layer", "1", "--cache-len", "20000", "--prompt-len", "1", "--decode", "1", "--only",
            "*attn_weights")
    shown = on_terminal(*args, columns=100, env={"STEPPER_PROGRESS_DELAY": "0"})
    drawn = ESCAPE.sub(b"", shown.raw).decode()
    assert (shown.code == 0 and "synthetic cache positions" in drawn
            and "steps (the prefill, then each decode step)" in drawn)
    assert "━" not in shown.text and "synthetic cache positions" not in shown.text
    piped = stepper(*args)
    assert piped.returncode == 0 and piped.stderr == "" and "synthetic cache" in piped.stdout  # the header says it
