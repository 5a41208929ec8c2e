"""What the `stepper` commands share: user errors as one line and exit code 2, the options that
several command groups take (--model, --seed, --plain), and the parsers of options several take
(--layers A:B, --ids 1,2,3)."""

from __future__ import annotations

import difflib
import errno
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.console import Console

from stepper.cli import output
from stepper.errors import StepperError
from stepper.presets import PRESETS, V4_PRESETS
from stepper.untrusted import shown
from stepper.views.sinks import print_wrapped
from stepper.weights.remote import without_credentials

PRESET_NAMES = ", ".join([*PRESETS, *V4_PRESETS])  # as an unknown name's error lists them


def note(text: str) -> None:
    """A line for the user on stderr, "stepper: " and `text` (already escaped): broken between words
    on a terminal, as every line stepper prints there, kept whole through a pipe or to a file."""
    print_wrapped(Console(stderr=True, highlight=False, markup=False, soft_wrap=True, no_color=True),
                  f"stepper: {text}")


class Refused(typer.BadParameter):
    """A value a parameter's callback refused, worded as stepper's other refusals: `--model VALUE: why`
    (an argument: `VALUE: why`), not typer's `Invalid value for '--model': VALUE: why`."""

    def format_message(self) -> str:
        option = self.param.opts[0] if self.param is not None and self.param.param_type_name == "option" else ""
        return f"{option} {self.message}".lstrip()


def url_option(value: str) -> str:
    """without_credentials as an option's callback: a malformed URL is a usage error (one line)."""
    try:
        return without_credentials(value)
    except StepperError as e:
        raise Refused(str(e)) from None


def model_option(ctx: typer.Context, param: typer.CallbackParam, value: str | None) -> str | None:
    """url_option, and a note where a preset's name given is also a file or folder here: the preset
    runs (a folder downloaded as kimi-k2 would otherwise be passed over with no word). None: not given."""
    if value is None:
        return None
    source = ctx.get_parameter_source(param.name) if param.name else None
    given = source is None or source.name != "DEFAULT"  # (typer's own copy of click's ParameterSource)
    if given and (value in PRESETS or value in V4_PRESETS) and os.path.lexists(value):
        kind = "folder" if os.path.isdir(value) else "file"
        note(f"note: '{value}' is the preset (synthetic weights), not the {kind} of that name here: write ./{value} "
             "for that")
    return url_option(value)


ModelOpt = Annotated[str, typer.Option(
    metavar="NAME|PATH", callback=model_option,
    help=f"Preset ({PRESET_NAMES}), a checkpoint directory, a remote checkpoint (hf://ORG/NAME[@REVISION], "
         "https://HOST/PATH/) or a config.json (./NAME for one named as a preset).")]
SeedOpt = Annotated[int, typer.Option(metavar="S", min=0, help="Seed of the synthetic weights and prompt.")]
PlainOpt = Annotated[bool, typer.Option(
    "--plain", help="Plain text: no colour, bold or other escape codes (as NO_COLOR).")]


INTERRUPTED = 130  # the exit code of a run ended by Ctrl-C (128 + SIGINT)


@contextmanager
def user_errors() -> Iterator[None]:
    """A StepperError or running out of memory becomes one line on stderr and exit code 2, its
    control characters escaped (a list of problems keeps its lines); Ctrl-C exit code 130 (main
    says "interrupted"); a closed pipe ends quietly, and output that cannot be written is one line
    (cli.output)."""
    try:
        yield
    except StepperError as e:
        note(f"error: {shown(e, lines=True)}")
        raise typer.Exit(2) from None
    except MemoryError as e:
        sys.stderr.write(f"stepper: error: out of memory: {str(e) or 'an allocation failed'}\n")
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        raise typer.Exit(INTERRUPTED) from None
    except BrokenPipeError:  # the reader (e.g. `head`) went away
        output.silence_stdout()
        raise typer.Exit(0) from None
    except OSError as e:
        if e.errno not in UNWRITABLE:
            raise
        output.silence_stdout()
        sys.stderr.write(f"stepper: error: the output cannot be written: {e.strerror}\n")
        raise typer.Exit(2) from None


UNWRITABLE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)  # a full disk or a device that takes no more


NEGATIVE = re.compile(r"-(\d|\.\d)[\w.+-]*")


def usage_message(e: typer.TyperException, args: list[str]) -> str:
    """click's message, an unknown option's suggestions kept to the options close to what was typed
    (click offers any it finds remotely alike: --bogus would get --use), and a negative number among
    the typed `args` told to go after --."""
    if type(e).__name__ != "NoSuchOption":  # typer carries its own copy of click
        return bad_number(e) or e.format_message()
    number = next((a for a in args if a.startswith(e.option_name) and NEGATIVE.fullmatch(a)), None)
    if number is not None:  # click reads -0x01 as the option -0 and its value
        command = e.ctx.command_path if e.ctx is not None else "stepper"
        return f"{number} was read as an option; a negative number goes after --: {command} ... -- {number}"
    typed = e.option_name.lstrip("-")
    near = [o for o in e.possibilities or () if difflib.SequenceMatcher(None, typed, o.lstrip("-")).ratio() >= 0.75]
    suggestion = f" (did you mean {' or '.join(sorted(near))}?)" if near else ""
    return f"No such option: {e.option_name}{suggestion}"


BOUNDS = {"greater_than_equal": ("ge", ">="), "greater_than": ("gt", ">"), "less_than_equal": ("le", "<="),
          "less_than": ("lt", "<")}
NUMBERS = {"int_parsing": "an integer", "float_parsing": "a number"}


def bad_number(e: typer.TyperException) -> str | None:
    """A number option typer refused, in the words of stepper's own refusals ('--seed must be >= 0,
    got -1'; typer gives its validator's, 'Invalid value for '--seed': Input should be greater than
    or equal to 0'). None for any other refusal."""
    param, errors = getattr(e, "param", None), getattr(e.__cause__, "errors", None)
    if param is None or not getattr(param, "opts", None) or not callable(errors) or not errors():
        return None
    error, option = errors()[0], param.opts[0]
    kind, typed = error.get("type"), str(error.get("input"))
    if kind in NUMBERS:
        return f"{option} must be {NUMBERS[kind]}, got '{shown(typed)}'"
    if kind in BOUNDS:
        key, sign = BOUNDS[kind]
        return f"{option} must be {sign} {error.get('ctx', {}).get(key)}, got {shown(typed)}"
    return None


def one_prompt(prompt: str | None, ids: str | None, prompt_len: int | None) -> None:
    """The prompt is given one way at most: --prompt TEXT, --ids 1,2,3 or --prompt-len T."""
    given = [o for o, v in (("--prompt", prompt), ("--ids", ids), ("--prompt-len", prompt_len)) if v is not None]
    if len(given) > 1:
        raise StepperError(f"give {given[0]} or {given[1]}, not both")


def parse_layers(layers: str | None) -> tuple[int, int | None] | None:
    if layers is None:
        return None
    first, sep, stop = layers.partition(":")
    try:
        if not sep:
            raise ValueError
        start, end = int(first or 0), int(stop) if stop else None
    except ValueError:
        raise StepperError(f"--layers expects A:B (layers A to B-1), got '{layers}'") from None
    if end is not None and end < start:
        raise StepperError(f"--layers {layers} is reversed: A:B shows layers A to B-1, so A comes first "
                           f"(--layers {end}:{start})")
    if end is not None and end == start:
        raise StepperError(f"--layers {layers} is empty: A:B shows layers A to B-1 "
                           f"(--layers {start}:{start + 1} for layer {start})")
    return start, end


def parse_ids(ids: str | None) -> tuple[int, ...] | None:
    if ids is None:
        return None
    try:
        return tuple(int(part) for part in ids.split(","))
    except ValueError:
        raise StepperError(f"--ids expects comma-separated integers like 1,2,3, got '{ids}'") from None
