"""Every `stepper ...` command a lesson's text suggests is one the command line takes as written:
its subcommand and options exist and the options it needs are given (parsed, not run). A command
quoted only to name an option (`stepper run --use`, the option's value left out) is not a command line."""

import re
import shlex

import pytest
import typer.main

from stepper.cli.main import app
from stepper.lessons.schema import all_lessons

LESSONS = all_lessons()


def texts(lesson) -> list[str]:
    said = [lesson.intro, lesson.outro, *lesson.exercise.hints]
    for step in lesson.steps:
        said += [step.text, step.explain]
        for pred in step.predict:
            said += [pred.question, *pred.option_why, *(w.why for w in pred.wrong)]
    return said


def commands(lesson) -> list[str]:
    quoted = [c for text in texts(lesson) for c in re.findall(r"`(stepper [^`]*)`", " ".join(text.split()))]
    return [c for c in quoted if not c.split()[-1].startswith("--")]


def parse_error(command: str) -> str | None:
    """What the command line says of `command` before running it, or None when it takes it."""
    args = shlex.split(command)[1:]
    group = typer.main.get_command(app)
    try:
        ctx = group.make_context("stepper", args, resilient_parsing=False)
        while hasattr(group, "resolve_command") and ctx._protected_args + ctx.args:  # a group: on to its command
            name, group, rest = group.resolve_command(ctx, ctx._protected_args + ctx.args)
            ctx = group.make_context(name, rest, parent=ctx)
    except Exception as e:  # the usage errors of the click that typer carries
        if not hasattr(e, "format_message"):
            raise
        return e.format_message()
    return None


@pytest.mark.parametrize("lesson", LESSONS, ids=[lesson.name for lesson in LESSONS])
def test_every_command_a_lesson_suggests_is_taken_as_written(lesson):
    assert {c: parse_error(c) for c in commands(lesson)} == {c: None for c in commands(lesson)}


def test_a_command_missing_what_it_needs_is_caught():
    assert "--out" in parse_error("stepper synth --quant int4")
    assert "No such option" in parse_error("stepper run --model tiny --no-such-option")
    assert parse_error("stepper fp8 --int4 0x89ABCDEF") is None
