"""`stepper lesson ...`: list, start, check, watch, hint, solution, reset.

The commands are thin: the lessons are read by `stepper.lessons.schema`, walked by
`stepper.lessons.walk` and checked by `stepper.lessons.check`; the progress file is
`stepper.lessons.progress`, the exercise files `stepper.lessons.workspace`. A problem with the
user's input (an unknown lesson, a missing exercise file, a solution asked for too early) is one
line on stderr and exit code 2; a check that fails exits with 1, like a failing test.
"""

from __future__ import annotations

import queue
import shlex
import sys
import textwrap
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.syntax import Syntax
from rich.text import Text

from stepper.cli import usage
from stepper.cli.common import PlainOpt, user_errors
from stepper.errors import StepperError
from stepper.lessons import check
from stepper.lessons.progress import Progress, default_lesson, next_lesson
from stepper.lessons.prose import indented, styled
from stepper.lessons.schema import Lesson, all_lessons, find_lesson
from stepper.lessons.walk import planned_run, walk
from stepper.lessons.workspace import WORKSPACE, Workspace
from stepper.planning import RunPlan
from stepper.text import INSTALL
from stepper.untrusted import shown
from stepper.untrusted.paths import found
from stepper.views.debugger import CommandSource
from stepper.views.sinks import WholeLinesOffTerminal, line_width, styles

lesson_app = usage.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    help="Guided lessons: step through the layer, predict each tensor, write the pieces yourself.",
)

NameArg = Annotated[str | None, typer.Argument(
    metavar="NAME", help="Lesson name or number.",
    show_default="the current lesson; once it is done, the next one not done")]
WorkspaceOpt = Annotated[Path, typer.Option("--workspace", metavar="DIR", help="Where your exercise files live.")]


def console_for(plain: bool) -> Console:
    return WholeLinesOffTerminal(**styles(plain), highlight=False, markup=False)


def chosen(name: str | None, progress: Progress) -> tuple[Lesson, list[Lesson]]:
    lessons = all_lessons()
    return (find_lesson(name, lessons) if name is not None else default_lesson(progress, lessons)), lessons


# ---------------------------------------------------------------------------------------------


LIST_LEGEND = ("◀ the current lesson: lesson commands without NAME use it · walked ✓: stepped through to the end · "
               "exercise: passed, gave up (solution shown) or · not yet")


@lesson_app.command("list")
def list_command(plain: PlainOpt = False) -> None:
    """List the lessons with your progress."""
    with user_errors():
        progress = Progress()
        lessons = all_lessons()
        console = console_for(plain)
        name_w = max(len("lesson"), *(len(l.name) for l in lessons)) + 2
        title_w = max(len("title"), *(len(shown(l.title)) for l in lessons)) + 2
        if line_width(console) is not None:  # on a terminal, rows fit its width: a long title goes on under itself
            title_w = max(12, min(title_w, console.width - (4 + name_w + 8 + len("gave up ◀"))))
        console.print(f"{'#':>2}  {'lesson':<{name_w}}{'title':<{title_w}}{'walked':<8}exercise", style="bold")
        marked = default_lesson(progress, lessons)
        for lesson in lessons:
            entry = progress.lesson(lesson.name)
            exercise = "passed" if entry["passed"] else ("gave up" if entry["gave_up"] else "·")
            walked = "✓" if entry["walked"] else "·"
            current = " ◀" if lesson.name == marked.name else ""
            title, *more = textwrap.wrap(shown(lesson.title), title_w - 2) or [""]
            console.print(f"{lesson.number:>2}  "
                          f"{lesson.name:<{name_w}}{title:<{title_w}}{walked:<8}{exercise}{current}")
            for line in more:
                console.print(" " * (4 + name_w) + line)
        console.print(LIST_LEGEND, style="dim", soft_wrap=False)
        passed = sum(progress.lesson(l.name)["passed"] for l in lessons)
        after = next_lesson(progress, lessons)  # what `lesson check` names after a pass: the first not done
        tail = f" · next: stepper lesson start {after.name}" if after else ""
        console.print(f"{passed} of {len(lessons)} exercises passed{tail}", style="dim", soft_wrap=False)
        console.print(f"progress file: {shown(progress.path)}", style="dim")


@lesson_app.command("start", short_help="Step through a lesson, predicting each tensor.")
def start_command(
    name: NameArg = None,
    workspace: WorkspaceOpt = WORKSPACE,
    plain: PlainOpt = False,
    prompt: Annotated[str | None, typer.Option("--prompt", metavar="TEXT", help="Walk the lesson on this text, "
                                                                                "tokenized by the --model "
                                                                                "checkpoint's tokenizer (needs: "
                                                                                f"{INSTALL}).")] = None,
    model: Annotated[str | None, typer.Option(metavar="NAME|PATH",
                                              help="Walk the lesson on this model instead of the lesson's own: a "
                                                   "preset, a checkpoint directory or a config.json.")] = None,
) -> None:
    """Step through a lesson: predict each tensor before it is shown, then explore it.

    At a prediction: ? shows how to write the answer (1,280, 1.25 KiB, 0-4, 1x7x512), Enter shows
    the answer. At each stop: Enter or c goes on to the next stop, n to the next tensor, and the debugger's
    commands work (p NAME[slice], e explain, s PICTURE (the model's own: ? lists them), w where, h history, q quit).
    Predictions and commands are read from the terminal, or line by line from a pipe.
    """
    with user_errors():
        progress = Progress()
        lesson, _ = chosen(name, progress)
        own = lesson.run.model
        lesson, planned = on_prompt(lesson, model, prompt)
        console = console_for(plain)
        path, created = Workspace(workspace).ensure(lesson)
        console.print(f"your exercise file: {shown(path)}" + (" (a fresh copy of the stub)" if created else
                                                       " (yours, left as it is)"), style="dim")
        if model is not None:  # the prose is written for the lesson's own model; the numbers are the other one's
            console.print(f"walking it on {shown(model)} instead of {own}, the model its text is written for: the "
                          f"numbers and sizes shown are {shown(model)}'s", style="dim")
        progress.current = lesson.name
        progress.save()
        source = CommandSource(console, sys.stdin, sys.stdin.isatty() and console.is_terminal)
        walked = walk(lesson, console, source, planned)
        entry = progress.lesson(lesson.name)
        # the latest walk's counts
        entry["first_try"], entry["retried"], entry["asked"] = walked.first_try, walked.retried, walked.asked
        entry["walked"] = entry["walked"] or walked.finished
        progress.save()
        functions = ", ".join(lesson.exercise.functions)
        where = workspace_option(workspace)
        if entry["passed"]:  # walked again after the exercise passed
            console.print(styled(f"\nyour {functions} in `{path}` passed already: `stepper lesson solution "
                                 f"{lesson.name}` shows ours"), soft_wrap=False)
            return
        console.print(styled(f"\nyour turn: write {functions} in `{path}`, then run `stepper lesson check "
                             f"{lesson.name}{where}` (or `stepper lesson watch {lesson.name}{where}` to re-check on "
                             f"every save; `stepper lesson hint {lesson.name}` if you are stuck)"), soft_wrap=False)


def on_prompt(lesson: Lesson, model: str | None, prompt: str | None) -> tuple[Lesson, RunPlan | None]:
    """The lesson walked on another model (one that computes every tensor it stops at; its run
    planned once, here), or on a text prompt instead of its token ids."""
    if prompt is not None and model is None:  # a lesson's own model is synthetic: it has no tokenizer
        raise StepperError(f"--prompt needs --model DIR, a checkpoint with its tokenizer: lesson {lesson.name}'s "
                           f"model {lesson.run.model} has synthetic weights and no tokenizer")
    run = lesson.run if model is None else replace(lesson.run, model=model)
    if prompt is not None:
        run = replace(run, ids=None, prompt=prompt)
    walked = replace(lesson, run=run)
    if model is None:
        return walked, None
    planned = planned_run(walked)
    missing = [step.stop for step in lesson.steps if step.stop not in set(planned.names)]
    if missing:
        raise StepperError(f"lesson {lesson.name} stops at {missing[0]}, which --model {shown(model)} does not "
                           f"compute: walk it on {lesson.run.model}'s family, or leave --model out")
    return walked, planned


@lesson_app.command("check", short_help="Check your exercise against the golden tensors.")
def check_command(
    name: NameArg = None,
    workspace: WorkspaceOpt = WORKSPACE,
    file: Annotated[Path | None, typer.Option("--file", metavar="FILE.py",
                                              help="Check this file instead of the workspace's (a pass is not "
                                                   "recorded).")] = None,
    plain: PlainOpt = False,
) -> None:
    """Check your exercise against the golden tensors of the lesson's runs."""
    with user_errors():
        progress = Progress()
        lesson, lessons = chosen(name, progress)
        path = file if file is not None else Workspace(workspace).existing(lesson)
        if file is not None and (there := found(file)) != "file":  # a file to fix is one that is there
            what = {None: "no such file", "folder": "is a folder; give the exercise's .py file in it"}
            raise StepperError(f"--file {shown(file)}: {what.get(there, 'is not a regular file')}")
        console = console_for(plain)
        passed = run_check(console, lesson, lessons, path, progress, record=file is None, workspace=workspace)
    raise typer.Exit(0 if passed else 1)


def workspace_option(workspace: Path) -> str:
    """' --workspace DIR' for the commands a message suggests, quoted for a shell; '' for the default."""
    return "" if workspace == WORKSPACE else f" --workspace {shlex.quote(str(workspace))}"


def run_check(console: Console, lesson: Lesson, lessons: list[Lesson], path: Path, progress: Progress,
              record: bool = True, workspace: Path = WORKSPACE) -> bool:
    """Check, show the outcome, and record a pass in `progress` (unless `record` is False: another
    file than the learner's). The commands it suggests name `workspace` unless it is the default."""
    console.print(f"checking {shown(path)} · lesson {lesson.number}, {lesson.name}: {shown(lesson.title)}",
                  style="bold")
    report = check.check(lesson, path)
    for outcome in report.outcomes:
        console.print(Text("✓ " if outcome.ok else "✗ ", style="bold green" if outcome.ok else "bold red")
                      + Text(shown(outcome.title)), soft_wrap=False)
        for line in outcome.detail:  # wrapped at words, indented
            indented(console, shown(line, lines=True))
    if report.passed and record:
        progress.lesson(lesson.name)["passed"] = True
        progress.save()
    if report.passed:
        after = next_lesson(progress, lessons, just_passed=lesson)
        model = "" if lesson.run.model == "tiny" else f" --model {lesson.run.model}"  # where the exercise runs
        ours = (f"`stepper lesson solution {lesson.name}` shows ours" if progress.lesson(lesson.name)["passed"] else
                f"not recorded: another file than your exercise's (`stepper lesson check {lesson.name}` records a "
                "pass, and opens our solution)")
        console.print(styled(f"passed! `stepper run --use {shlex.quote(str(path))}{model}` runs the whole model with "
                             f"your {', '.join(lesson.exercise.functions)}; {ours}"
                             + (f"; next: `stepper lesson start {after.name}{workspace_option(workspace)}`" if after
                                else "; every lesson is done")),
                      style="bold green", soft_wrap=False)
    else:
        console.print(styled(f"not yet: fix it and check again (`stepper lesson hint {lesson.name}` for a hint)"),
                      style="yellow", soft_wrap=False)
    return report.passed


@lesson_app.command("watch")
def watch_command(
    name: NameArg = None,
    workspace: WorkspaceOpt = WORKSPACE,
    interval: Annotated[float, typer.Option(metavar="SECONDS", min=0.01, max=3600,
                                            help="How often to look at the file's modification time.")] = 0.5,
    plain: PlainOpt = False,
) -> None:
    """Re-check your exercise every time you save it, until it passes."""
    with user_errors():
        progress = Progress()
        lesson, lessons = chosen(name, progress)
        path = Workspace(workspace).existing(lesson)
        console = console_for(plain)
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=read_lines, args=(lines,), daemon=True).start()
        banner = f"watching {shown(path)}: it is re-checked when you save it · press Enter to re-check, q to quit"
        console.print(banner, style="bold")
        stamp = modified(path)
        passed = run_check(console, lesson, lessons, path, progress, workspace=workspace)
        try:
            while not passed:
                try:
                    line = lines.get(timeout=interval)
                except queue.Empty:
                    now = modified(path)
                    if now == stamp:
                        continue
                    stamp = now
                    time.sleep(0.05)  # let the editor finish writing
                else:
                    if line is None or line.strip().lower() in ("q", "quit"):
                        console.print("stopped watching", style="dim")
                        break
                    stamp = modified(path)
                console.rule(style="dim")
                passed = run_check(console, lesson, lessons, path, progress, workspace=workspace)
                if not passed:
                    console.print("press Enter to re-check, q to quit (or just save the file)", style="dim")
        except KeyboardInterrupt:
            console.print("stopped watching", style="dim")


def read_lines(lines: queue.Queue) -> None:
    """Feed stdin's lines to the watch loop; None at the end of input."""
    try:
        for line in sys.stdin:
            lines.put(line)
    except (OSError, ValueError):
        pass
    lines.put(None)


def modified(path: Path) -> float | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


@lesson_app.command("hint")
def hint_command(name: NameArg = None, plain: PlainOpt = False) -> None:
    """Show the next hint for a lesson's exercise."""
    with user_errors():
        progress = Progress()
        lesson, _ = chosen(name, progress)
        entry = progress.lesson(lesson.name)
        hints = lesson.exercise.hints
        console = console_for(plain)
        given = entry["hints"]
        if given >= len(hints):
            console.print(styled(f"hint {len(hints)} of {len(hints)} (the last): {hints[-1]}"))
            console.print(styled(f"no more hints; `stepper lesson solution {lesson.name} --give-up` shows the "
                                 "solution"),
                          style="dim")
            return
        console.print(styled(f"hint {given + 1} of {len(hints)}: {hints[given]}"))
        entry["hints"] = given + 1
        progress.save()


@lesson_app.command("solution", short_help="Show the lesson's solution (after your exercise passes).")
def solution_command(
    name: NameArg = None,
    give_up: Annotated[bool, typer.Option("--give-up",
                                          help="Show it although your exercise has not passed yet.")] = False,
    plain: PlainOpt = False,
) -> None:
    """Show the lesson's solution: after your exercise passes, or with --give-up."""
    with user_errors():
        progress = Progress()
        lesson, _ = chosen(name, progress)
        entry = progress.lesson(lesson.name)
        if not entry["passed"] and not give_up:
            raise StepperError(f"the solution of {lesson.name} opens once your exercise passes "
                               f"(`stepper lesson check {lesson.name}`), or with --give-up")
        if not entry["passed"]:
            entry["gave_up"] = True
            progress.save()
        code = shown(lesson.solution.read_text(encoding="utf-8"), lines=True)
        console = console_for(plain)
        console.print(shown(lesson.solution), style="bold")
        fancy = not plain and console.is_terminal
        wraps = any(len(line) > console.width for line in code.splitlines())  # numbered, a wrapped line shows as one
        console.print(Syntax(code, "python", word_wrap=True, background_color="default", line_numbers=wraps)
                      if fancy else code, highlight=False)


@lesson_app.command("reset", short_help="Put the exercise stub back (your file is kept).")
def reset_command(name: NameArg = None, workspace: WorkspaceOpt = WORKSPACE, plain: PlainOpt = False) -> None:
    """Put the exercise stub back (your file is kept as a new backup, NAME.py.bak, NAME.py.bak2, ...) and forget the
    lesson's progress."""
    with user_errors():
        progress = Progress()
        lesson, _ = chosen(name, progress)
        path, backup = Workspace(workspace).reset(lesson)
        progress.data["lessons"].pop(lesson.name, None)
        progress.save()
        console = console_for(plain)
        console.print(f"{shown(path)} is the stub again"
                      + (f"; your previous file is {shown(backup)}" if backup else ""))
