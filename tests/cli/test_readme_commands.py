"""Every `stepper` command line README.md and docs/*.md quote runs as quoted, and prints what they show.

The command lines are read from the code blocks of README and then of docs/ (tests/helpers/docs.py),
in order, each block in a fresh folder (a block's commands build on each other: synth, then run on
what it wrote). A transcript (`$ stepper
...` followed by output) must print every line README shows, in that order, and nothing between
two lines shown one under the other, before the first or after the last, unless README marks the
lines it leaves out there with `...` (blank lines aside); the debugger's `(stepper) CMD` lines are
what is typed. Commands in the text are
checked to be commands, and the options README lists for `stepper run` and `stepper step` against
their --help. "README" below means these documents together.
"""

import re
import shlex
import shutil
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from stepper.cli.main import app
from tests.helpers import docs

ROOT = Path(__file__).resolve().parents[2]
README = docs.text()

SKIPPED = {  # command lines too big for the suite, with why
    "stepper run --model kimi-k2 --layers 0:61 --prompt-len 1 --only logits":
        "every layer of the full-size model: 13 minutes, as docs/performance.md says",
    "stepper bench --workdir /work/benchwork": "the full-size bench: a 17 GB checkpoint on the bench machine",
}


def solution_written(folder: Path) -> None:
    """What README's reader does before `lesson check` passes: write the exercise (here: its solution)."""
    shutil.copy(ROOT / "lessons" / "01-tour" / "solution.py", folder / "stepper-lessons" / "tour.py")


def port_dumped(folder: Path) -> None:
    """The reader's port's dump (here: the fixture's own tensors, a port that matches)."""
    (folder / "fixtures").symlink_to(ROOT / "fixtures")
    shutil.copy(ROOT / "fixtures" / "tiny-prefill-decode" / "tensors.safetensors", folder / "port.safetensors")


BEFORE = {"stepper lesson check tour": solution_written,
          "stepper fixtures verify fixtures/tiny-prefill-decode port.safetensors": port_dumped}


def code_blocks(text: str) -> list[list[str]]:
    return [block.splitlines() for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, re.DOTALL | re.MULTILINE)]


EXIT = re.compile(r"#.*\bexit (\d+)")  # a command README says exits with another code than 0


def transcripts(block: list[str]) -> list[tuple[str, list[str]]]:
    """A block's command lines, each with the output lines README shows after it (a `$ ` transcript's)."""
    runs: list[tuple[str, list[str]]] = []
    transcript = False
    for line in block:
        command = line.removeprefix("$ ")
        if command.startswith("stepper "):
            runs.append((shlex.join(shlex.split(command, comments=True)), []))
            if EXIT.search(command):
                EXPECTED_EXIT[runs[-1][0]] = int(EXIT.search(command)[1])
            transcript = line.startswith("$ ")
        elif runs and transcript and line.strip():
            runs[-1][1].append(line.rstrip())  # `...` included: where README leaves lines out
    return runs


def unmarked_gap(shown: list[str], printed: list[str]) -> str | None:
    """Why the printed lines (blank lines left out) are not what README shows, or None: every shown
    line printed, in order, lines one under the other in README one under the other in the output,
    the first shown the first printed and the last the last, but where a `...` stands."""
    runs: list[list[str]] = [[]]
    for line in shown:
        if line.strip() == "...":
            runs.append([])
        else:
            runs[-1].append(line)
    at = 0
    for k, run in enumerate(runs):
        if not run:
            continue
        starts = [i for i in range(at, len(printed) - len(run) + 1) if printed[i:i + len(run)] == run]
        if k == 0:  # no `...` before the first shown line
            starts = [i for i in starts if i == 0]
        if k == len(runs) - 1:  # nor after the last
            starts = [i for i in starts if i + len(run) == len(printed)]
        if not starts:
            if run[0] not in printed[at:]:
                return f"README shows a line it does not print:\n{run[0]}"
            i = printed.index(run[0], at)
            if k == 0 and i != 0:
                return f"README leaves out the first lines printed without a `...`:\n{printed[0]}"
            j = next((j for j in range(1, len(run)) if i + j >= len(printed) or printed[i + j] != run[j]), len(run))
            if j == len(run):
                return f"README leaves out the last lines printed without a `...`:\n{printed[i + j]}"
            told = printed[i + j] if i + j < len(printed) else "(the end of the output)"
            return (f"README shows\n{run[j - 1]}\nthen\n{run[j]}\n"
                    f"but stepper prints between them, with no `...`:\n{told}")
        at = starts[0] + len(run)
    return None


EXPECTED_EXIT: dict[str, int] = {}
BLOCKS = [runs for runs in map(transcripts, code_blocks(README)) if runs]


def test_readme_quotes_the_commands_this_test_runs():
    commands = [command for runs in BLOCKS for command, _ in runs]
    for expected in ("stepper run --plain --ids 1,2,3", "stepper step --break", "stepper synth --model tiny",
                     "stepper lesson start tour", "stepper fixtures verify"):
        assert any(c.startswith(expected) for c in commands), expected
    assert len(commands) >= 13


@pytest.mark.parametrize("runs", BLOCKS, ids=[runs[0][0][:40] for runs in BLOCKS])
def test_every_command_of_a_block_runs_as_quoted(runs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STEPPER_DATA_DIR", str(tmp_path / "data"))
    for command, shown in runs:
        if command in SKIPPED:
            continue
        if command in BEFORE:
            BEFORE[command](tmp_path)
        typed = "".join(line.removeprefix("(stepper) ") + "\n" for line in shown if line.startswith("(stepper) "))
        result = CliRunner().invoke(app, shlex.split(command)[1:], input=typed)
        assert result.exit_code == EXPECTED_EXIT.get(command, 0), \
            f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
        if shown:
            printed = [line.rstrip() for line in result.stdout.splitlines() if line.strip()]
            wrong = unmarked_gap(shown, printed)
            assert wrong is None, f"{command}: {wrong}"


def test_a_line_left_out_without_a_marker_is_caught():
    printed = ["header", "a", "b", "c", "footer"]
    assert unmarked_gap(["...", "a", "b", "c", "..."], printed) is None
    assert unmarked_gap(["header", "a", "...", "c", "footer"], printed) is None
    assert "prints between them" in unmarked_gap(["...", "a", "c", "..."], printed)
    assert "first lines" in unmarked_gap(["a", "b", "..."], printed)
    assert "last lines" in unmarked_gap(["...", "b", "c"], printed)
    assert "does not print" in unmarked_gap(["...", "a", "...", "z", "..."], printed)


def test_every_command_in_the_text_is_a_command():
    named = set(re.findall(r"`stepper ([a-z0-9]+)", README))
    assert {"run", "step", "explain", "tree", "synth", "inspect", "fp8", "lesson", "fixtures", "bench"} <= named
    for word in sorted(named):
        assert CliRunner().invoke(app, [word, "--help"]).exit_code == 0, word
    for command, why in SKIPPED.items():
        assert f"`{command}`" in README or command in README, f"skipped but not quoted: {command} ({why})"


def test_the_command_table_names_every_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = [row for row in readme.splitlines() if row.startswith("| `stepper ")]
    tabled = {row.split("`")[1].split()[1] for row in rows}
    assert tabled == set(typer.main.get_command(app).commands)
    assert any(row.startswith("| `stepper fixtures names`") for row in rows)


def test_the_options_readme_lists_are_the_options_run_and_step_take():
    """Every option of README's table is run's; step's are the same but the four the sentence names."""
    start = README.index("`stepper run` options")
    intro = README[start:README.index("| option |", start)]
    table = README[start:README.index("The header of every run")]
    listed = {o for row in table.splitlines() if row.startswith("| `--")
              for o in re.findall(r"`(--[a-z-]+)", row.split("|")[1])}
    run_help = CliRunner().invoke(app, ["run", "--help"], terminal_width=200).stdout
    step_help = CliRunner().invoke(app, ["step", "--help"], terminal_width=200).stdout
    not_in_step = set(re.findall(r"except (`--[a-z-]+`(?:, `--[a-z-]+`)* and `--[a-z-]+`)", intro)[0].replace("`", "")
                      .replace(" and ", ", ").split(", "))
    assert not_in_step == {"--only", "--show", "--dump", "--dump-limit-gb", "--chunk"} and len(listed) >= 15
    for option in listed:
        assert re.search(rf"^  {option}\b", run_help, re.MULTILINE), option
        assert bool(re.search(rf"^  {option}\b", step_help, re.MULTILINE)) == (option not in not_in_step), option
