"""Every command's --help as a user reads it: the usage line and the Arguments list name each
argument as command lines are written by hand, `stepper diff [OPTIONS] A B` and `A  A --dump
file...` (typer writes `{A} {B}` and `A <str>`), through a pipe and on a terminal of any width.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated

import pytest
import typer
import typer.main
from helpers.cli import stepper
from typer.testing import CliRunner

from stepper.cli import usage
from stepper.cli.main import app

USAGE = {  # each command's usage line, and its arguments as the Arguments list names them
    (): ("stepper [OPTIONS] COMMAND [ARGS]...", []),
    ("run",): ("stepper run [OPTIONS]", []),
    ("step",): ("stepper step [OPTIONS]", []),
    ("diff",): ("stepper diff [OPTIONS] A B", ["A", "B"]),
    ("explain",): ("stepper explain [OPTIONS] NAME", ["NAME"]),
    ("tree",): ("stepper tree [OPTIONS]", []),
    ("bench",): ("stepper bench [OPTIONS]", []),
    ("synth",): ("stepper synth [OPTIONS]", []),
    ("inspect",): ("stepper inspect [OPTIONS] PATH", ["PATH"]),
    ("fp8",): ("stepper fp8 [OPTIONS] [CODE]", ["CODE"]),
    ("fixtures",): ("stepper fixtures [OPTIONS] COMMAND [ARGS]...", []),
    ("fixtures", "export"): ("stepper fixtures export [OPTIONS] OUT_DIR", ["OUT_DIR"]),
    ("fixtures", "verify"): ("stepper fixtures verify [OPTIONS] FIXTURE CANDIDATE", ["FIXTURE", "CANDIDATE"]),
    ("fixtures", "names"): ("stepper fixtures names [OPTIONS]", []),
    ("lesson",): ("stepper lesson [OPTIONS] COMMAND [ARGS]...", []),
    **{("lesson", name): (f"stepper lesson {name} [OPTIONS] [NAME]", ["NAME"])
       for name in ("start", "check", "watch", "hint", "solution", "reset")},
    ("lesson", "list"): ("stepper lesson list [OPTIONS]", []),
    ("cache",): ("stepper cache [OPTIONS] COMMAND [ARGS]...", []),
    ("cache", "ls"): ("stepper cache ls [OPTIONS]", []),
    ("cache", "clear"): ("stepper cache clear [OPTIONS] [CHECKPOINT]", ["CHECKPOINT"]),
}


def command_paths(group, path=()):
    yield path
    for name, sub in getattr(group, "commands", {}).items():
        yield from command_paths(sub, (*path, name))


def listed_arguments(helped: str) -> list[str]:
    """The names the Arguments section lists (its rows' first column), each checked to stand alone."""
    section = re.search(r"^Arguments:\n(.*?)(?:\n\n|\Z)", helped, re.DOTALL | re.MULTILINE)
    rows = [line for line in (section[1] if section else "").splitlines() if re.match(r"  \S", line)]
    assert all(re.match(r"  [A-Z_]+  +\S", row) for row in rows), rows
    return [row.split()[0] for row in rows]


def test_the_table_has_every_command():
    assert sorted(command_paths(typer.main.get_command(app))) == sorted(USAGE)


@pytest.mark.parametrize("path", list(USAGE), ids=lambda path: " ".join(path) or "stepper")
def test_usage_names_arguments_as_written_by_hand(path):
    helped = stepper(*path, "--help")
    assert helped.returncode == 0, helped.stderr
    line, arguments = USAGE[path]
    assert helped.stdout.splitlines()[0] == f"Usage: {line}"
    assert listed_arguments(helped.stdout) == arguments
    assert not re.search(r"[{}]|<(str|path|int|float)>", helped.stdout.split("\n\n")[0]), helped.stdout


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
@pytest.mark.parametrize("columns", [80, 160])
def test_a_terminal_shows_the_same_usage(columns):
    from helpers.terminal import on_terminal

    screen = on_terminal("fixtures", "verify", "--help", columns=columns)
    assert screen.code == 0 and screen.lines[0] == "Usage: stepper fixtures verify [OPTIONS] FIXTURE CANDIDATE"
    assert listed_arguments(screen.text) == ["FIXTURE", "CANDIDATE"]


def test_repeatable_and_named_arguments():
    """An argument given a metavar is named by it; one that repeats ends in `...`, its brackets
    (when it may be left out) around the name alone, as click writes one."""
    tool = usage.Typer(add_completion=False, rich_markup_mode=None)

    @tool.command()
    def copy(sources: Annotated[list[str], typer.Argument(help="Files.")],
             target: Annotated[str, typer.Argument(metavar="DEST", help="Where.")]) -> None:
        pass

    @tool.command()
    def show(names: Annotated[list[str] | None, typer.Argument(help="Names.")] = None) -> None:
        pass

    def helped(command: str) -> str:
        return CliRunner().invoke(tool, [command, "--help"], prog_name="tool", terminal_width=80).stdout

    assert helped("copy").splitlines()[0] == "Usage: tool copy [OPTIONS] SOURCES... DEST"
    assert listed_arguments(helped("copy")) == ["SOURCES", "DEST"]
    assert helped("show").splitlines()[0] == "Usage: tool show [OPTIONS] [NAMES]..."


FORCE = {  # each command's --force, in its help: it replaces only what stepper wrote, as it does
    ("run",): "Replace an existing output file if stepper wrote it.",
    ("step",): "Replace an existing output file if stepper wrote it.",
    ("synth",): "Replace DIR if it is a checkpoint stepper synth wrote.",
    ("fixtures", "export"): "Replace OUT_DIR if it is a fixture folder stepper wrote.",
    ("fixtures", "verify"): "Replace the --report file if it is a report stepper wrote.",
}


def test_every_force_option_says_what_it_replaces():
    """--force never replaces a file or folder stepper did not write (the commands refuse, exit 2):
    the help said 'Overwrite an existing output file' and 'Replace DIR if it exists'."""
    forced = {path for path in USAGE if any("--force" in getattr(p, "opts", ()) for p in command_of(path).params)}
    assert forced == set(FORCE)
    for path, said in FORCE.items():
        assert f"--force {said}" in " ".join(stepper(*path, "--help").stdout.split()), path


def test_synth_draws_no_prompt():
    helped = " ".join(stepper("synth", "--help").stdout.split())
    assert "--seed S Seed of the synthetic weights. [default: 0; x>=0]" in helped


def command_of(path: tuple[str, ...]):
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    return command


def test_diff_names_its_sides():
    """`A  A --dump file` read as a stutter once the name stood alone."""
    arguments = stepper("diff", "--help").stdout.split("Arguments:\n", 1)[1].split("\n\n")[0]
    assert " ".join(arguments.split()) == ("A One side: a --dump file, a fixture folder, or a run in quotes: 'run "
                                           "--attn naive' ('run': the default run). [required] B The other side, "
                                           "in the same forms. [required]")


def every_help(columns: int) -> dict[tuple[str, ...], str]:
    """Each command's --help as a pipe gets it at this width, its lines joined as a reader joins them."""
    return {path: " ".join(stepper(*path, "--help", env={"COLUMNS": str(columns)}).stdout.split()) for path in USAGE}


@pytest.mark.parametrize("columns", [80, 160])
def test_each_default_reads_once_with_its_range(columns):
    """A default the function cannot hold read `[default: 7].  [x>=1]` (written into the help, typer's
    range after it) or `Default: as the model's config says.` mid-text; given to typer as text it read
    `[default: (7)]`. Now one bracket per option: its default as written, then its range."""
    helped = every_help(columns)
    for path, text in helped.items():
        assert "default: (" not in text and "Default:" not in text, (path, text)
        assert not re.search(r"\]\.? \[(default|required|[\d.]*<?=?x)", text), (path, text)
    assert "--prompt-len T Number of prompt tokens drawn from the seed. [default: 7; x>=1]" in helped[("run",)]
    assert ("--dump-limit-gb GiB Refuse a --dump with a tensor larger than this many GiB (2**30 bytes). [default: 2]"
            in helped[("run",)])
    assert "--seed S With --weight and a preset: seed of the synthetic weights. [default: 0; x>=0]" in helped[("fp8",)]
    assert "bf16. [default: as the config says] --help" in helped[("synth",)]
    assert "a shared name read canonically] --allow-missing" in helped[("fixtures", "verify")]
    assert ("--cache-dir DIR Where the bytes fetched of remote checkpoints are kept. "
            "[default: $STEPPER_CACHE_DIR or ~/.cache/stepper/remote]") in helped[()]
    assert ("NAME Lesson name or number. [default: the current lesson; once it is done, the next one not done]"
            in helped[("lesson", "check")])


def test_a_default_given_as_text_reads_as_written():
    """typer's hook for a default the function does not hold is show_default="TEXT", which it writes
    in parentheses; a stepper command writes the text as given, beside the range, for options and arguments."""
    tool = usage.Typer(add_completion=False, rich_markup_mode=None)

    @tool.command()
    def count(name: Annotated[str | None, typer.Argument(help="Who.", show_default="everyone")] = None,
              times: Annotated[int | None, typer.Option(metavar="N", min=1, show_default="7",
                                                                    help="How often.")] = None) -> None:
        pass

    @tool.callback()
    def everything(level: Annotated[int | None, typer.Option(metavar="L", show_default="as set",
                                                                                 help="Level.")] = None) -> None:
        pass

    def helped(*args: str) -> str:
        return " ".join(CliRunner().invoke(tool, [*args, "--help"], prog_name="tool", terminal_width=80).stdout.split())

    assert "NAME Who. [default: everyone]" in helped("count")
    assert "--times N How often. [default: 7; x>=1]" in helped("count")
    assert "--level L Level. [default: as set]" in helped()


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
def test_a_terminal_shows_a_default_once():
    from helpers.terminal import on_terminal

    screen = on_terminal("run", "--help", columns=80)
    row = screen.lines.index(next(line for line in screen.lines if line.lstrip().startswith("--prompt-len")))
    assert [line.strip() for line in screen.lines[row:row + 2]] == [
        "--prompt-len T             Number of prompt tokens drawn from the seed.", "[default: 7; x>=1]"]


def test_the_oldest_typer_allowed_runs_stepper():
    """pyproject allowed typer 0.12, under which no command starts (an `int | None` option is 'not
    yet supported', and typer.TyperException, which main catches, is 0.28's). Measured: 0.29.0 runs
    this file and test_errors as 0.29.2 does; 0.28.0 words the number refusals as typer does."""
    pyproject = Path(__file__).parents[2] / "pyproject.toml"
    floor = re.search(r'"typer>=([\d.]+)"', pyproject.read_text(encoding="utf-8"))[1]
    assert tuple(int(part) for part in floor.split(".")) >= (0, 29)


def test_the_same_thing_has_the_same_metavar_in_every_command():
    """fp8 named its --model NAME|DIR|URL and lesson start its --model DIR (it takes presets too)
    where the other commands, taking the same forms, say NAME|PATH; --dump-limit-gb's GB counted GiB,
    as --cache-max-gb GiB says."""
    metavars = {}
    for path in USAGE:
        for param in command_of(path).params:
            for option in getattr(param, "opts", ()):
                metavars.setdefault(option, {})[" ".join(path)] = param.metavar
    assert set(metavars["--model"].values()) == {"NAME|PATH"}, metavars["--model"]
    assert metavars["--dump-limit-gb"] == {"run": "GiB"} and metavars["--cache-max-gb"] == {"": "GiB"}
