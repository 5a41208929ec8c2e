"""How --help reads: usage lines and argument names as command lines are written by hand
(`stepper diff [OPTIONS] A B`, `A  A --dump file...`), a default given as text once and as written
(`[default: 7; x>=1]`), and names never broken at a hyphen.

typer writes a required argument in braces and an argument's Python type after its name
(`stepper diff [OPTIONS] {A} {B}`, `A <str>`), in a form that has changed between its versions.
Its hook for a command's help is the command class (`cls=`): stepper's commands are `Command`s,
which name their arguments themselves, from each argument's metavar or name alone, so the help
reads the same under any typer the project installs. A default the function cannot hold (None
stands for "not given", the value depends on the model) is given to typer as text, `show_default="7"`,
which typer writes in parentheses, `[default: (7)]`: a `Command` writes it as given.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup


def whole_names_in_help() -> None:
    """click wraps --help text after any hyphen (`tiny-kimi-` / `linear`, `--allow-` / `missing`):
    a name copied off the screen must be whole, so its wrapper breaks lines at spaces only. (click
    is typer's own copy from typer 0.26, a package of its own before.)"""
    for module in ("typer._click._textwrap", "click._textwrap"):
        try:
            wrapper = importlib.import_module(module).TextWrapper
        except ImportError:
            continue
        wrapper.__init__ = functools.partialmethod(wrapper.__init__, break_on_hyphens=False)


def is_argument(param: Any) -> bool:
    return param.param_type_name == "argument"


def argument_name(param: Any) -> str:
    """An argument as the Arguments list names it: its metavar, else its name in capitals."""
    return param.metavar or param.name.upper()


def argument_usage(param: Any) -> str:
    """An argument in the usage line: NAME, [NAME] when it may be left out, NAME... when repeatable."""
    name = argument_name(param) if param.required else f"[{argument_name(param)}]"
    return name if param.nargs == 1 else f"{name}..."


def help_record(param: Any, ctx: Any) -> tuple[str, str] | None:
    """A parameter's row in --help: typer's, with a default given as text written as given."""
    record = param.get_help_record(ctx)
    said = param.show_default
    if record is None or not isinstance(said, str):
        return record
    return record[0], record[1].replace(f"default: ({said})", f"default: {said}", 1)


class Command(TyperCommand):
    """A typer command whose usage line and Arguments list name each argument as `argument_name` does."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            pieces.extend([argument_usage(param)] if is_argument(param) else param.get_usage_pieces(ctx))
        return pieces

    def format_options(self, ctx: Any, formatter: Any) -> None:
        write_parameters(self, ctx, formatter)


class Group(TyperGroup):
    """A typer group whose options are listed as a `Command`'s are (stepper's own: --cache-dir)."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        write_parameters(self, ctx, formatter)
        self.format_commands(ctx, formatter)


def write_parameters(command: Any, ctx: Any, formatter: Any) -> None:
    """The Arguments and Options sections, each row as `help_record` writes it."""
    records = [(param, help_record(param, ctx)) for param in command.get_params(ctx)]
    arguments = [(argument_name(param), record[1]) for param, record in records if record and is_argument(param)]
    options = [record for param, record in records if record and not is_argument(param)]
    for title, rows in (("Arguments", arguments), ("Options", options)):
        if rows:
            with formatter.section(title):
                formatter.write_dl(rows)


class Typer(typer.Typer):
    """A typer app that is a `Group` of `Command`s."""

    def __init__(self, *args: Any, cls: type[TyperGroup] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, cls=cls or Group, **kwargs)

    def command(self, *args: Any, cls: type[TyperCommand] | None = None, **kwargs: Any) -> Any:
        return super().command(*args, cls=cls or Command, **kwargs)
