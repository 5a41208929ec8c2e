"""`stepper diff A B`: two runs compared tensor by tensor, in execution order.

A and B are each a `--dump` file, a fixture folder, or a `stepper run` in one argument:
`"run --attn naive --decode 2"` (after `--`, the options alone: `-- "--attn naive" ""`, `""`
being the default run; `--only` keeps only some tensors). Exit 0 when no tensor differs beyond
round-off, 1 when one does, 2 on bad input.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Annotated

import numpy as np
import typer
from rich.console import Console

from stepper.cli import run as run_cli
from stepper.cli.common import PlainOpt, usage_message, user_errors
from stepper.errors import StepperError
from stepper.fixtures.run_diff import Diff, diff_tensors, read_side, release, side_path
from stepper.lessons import overrides
from stepper.planning.record import record, tensors
from stepper.seams.patching import parse_patch
from stepper.untrusted import shown
from stepper.views import diff_table
from stepper.views.sinks import line_width, print_fitted, print_whole, styles

SideArg = Annotated[str, typer.Argument(metavar="A",
    help="One side: a --dump file, a fixture folder, or a run in quotes: 'run --attn naive' ('run': the default "
         "run).",
                                                          show_default=False)]
# The run options a side may give; the others (what a run shows, or where it writes) have no meaning here
SIDE_OPTIONS = {"model", "layer", "layers", "ids", "prompt_len", "start_pos", "decode", "seed", "input_file", "attn",
                "weight_cache_mb", "only", "use", "patch", "cache_len", "index_scoring", "chunk"}


def diff_command(
    a: SideArg,
    b: Annotated[str, typer.Argument(metavar="B", help="The other side, in the same forms.", show_default=False)],
    changed: Annotated[bool, typer.Option("--changed",
                                          help="List only the tensors that are not the same bit for bit.")] = False,
    plain: PlainOpt = False,
) -> None:
    """Compare two runs tensor by tensor: max |B - A|, relative error, cosine, experts whose choice changed.

    Names the first tensor that differs beyond round-off (the tolerance of fixtures verify) and
    draws how the difference grows through each layer. Exit 0 when none differs, 1 when one does.
    """
    with user_errors():
        (ta, la), (tb, lb) = side("A", a), side("B", b)
        try:
            found = diff_tensors(ta, tb, la, lb)
        finally:
            release(ta, tb)
        console = Console(**styles(plain), highlight=False, markup=False, soft_wrap=True)
        show(console, found, changed)
    raise typer.Exit(1 if found.first is not None else 0)


def show(console: Console, found: Diff, changed: bool) -> None:
    listed = Diff(found.a, found.b, [r for r in found.rows if r.status != "same"] if changed else found.rows,
                  found.only_a, found.only_b, found.file_order)
    if listed.rows:
        print_whole(console, diff_table.table(listed, line_width(console)))
        console.print()
    growth = diff_table.growth(found, line_width(console))
    growth.rstrip()
    print_fitted(console, growth, indent=2)
    print_fitted(console, diff_table.summary(found), indent=2)


def side(which: str, text: str) -> tuple[Mapping[str, np.ndarray], str]:
    """One side's tensors in execution order, and how it is named in the summary."""
    words = text.split()
    is_run = not words or words[0] == "run" or words[0].startswith("-")
    if not is_run:
        return read_side(side_path(text, f"diff {which}", "a run such as 'run --attn naive'")), text
    params = run_options(which, text)
    spec = run_cli.run_spec(params["model"], params["layer"], params["layers"], params["ids"], params["prompt_len"],
                            params["start_pos"], params["decode"], params["seed"], params["input_file"],
                            params["attn"], params["weight_cache_mb"], cache_len=params["cache_len"],
                            index_scoring=params["index_scoring"])
    try:
        patches = [parse_patch(p) for p in params["patch"] or []]
        chunk = run_cli.parse_chunk(params["chunk"], bool(patches), False)
        recorded = record(spec, params["only"] or None, patches, lambda: overrides.use(params["use"] or []),
                          chunk=chunk)
    except StepperError as e:
        raise StepperError(f"diff {which} '{shown(text)}': {e}") from None
    return tensors(recorded), text or "the default run"


def run_options(which: str, text: str) -> dict:
    """The options of `stepper run`, parsed as that command parses them (but for --help, which is
    not for diff: it would print run's help and exit 0, read as "no tensor differs")."""
    app = typer.Typer(add_completion=False, context_settings={"help_option_names": []})
    app.command()(run_cli.run_command)
    command = typer.main.get_command(app)
    try:
        args = shlex.split(text)
        args = args[1:] if args[:1] == ["run"] else args
        params = command.make_context("stepper run", args).params
    except ValueError as e:
        raise StepperError(f"diff {which} '{shown(text)}': {e}") from None
    except typer.TyperException as e:  # typer's own click: bad or unknown options
        if getattr(e, "option_name", None) == "--help":
            raise StepperError(f"diff {which} '{shown(text)}': --help is not for diff; give the options of the run "
                               "itself (stepper run --help lists them)") from None
        raise StepperError(f"diff {which} '{shown(text)}': {usage_message(e, args)}") from None
    extra = sorted(k for k, v in params.items() if k not in SIDE_OPTIONS and v not in (None, False))
    if extra:
        raise StepperError(f"diff {which} '{shown(text)}': {typed_option(command, extra[0], args)} is not for "
                           "diff; give the options of the run itself")
    return params


def typed_option(command: typer.core.TyperCommand, name: str, args: list[str]) -> str:
    """The option of parameter `name` as it was typed among `args` (run's --json, whose parameter
    is as_json), or its first spelling."""
    spellings = next(p.opts + p.secondary_opts for p in command.params if p.name == name)
    return next((o for a in args for o in spellings if a == o or a.startswith(o + "=")), spellings[0])
