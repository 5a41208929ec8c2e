"""The `stepper` command line. Bad input exits with code 2 and one line on stderr."""

from __future__ import annotations

import os
import signal
import sys
from typing import Annotated

import numpy as np
import typer

from stepper.cli import bench, cache, checkpoint, diff, explain, output, run, usage
from stepper.cli.common import INTERRUPTED, note, usage_message, user_errors
from stepper.cli.fixtures import fixtures_app
from stepper.cli.lessons import lesson_app
from stepper.errors import Terminated
from stepper.kernels import parallel
from stepper.untrusted import shown
from stepper.version import __version__

usage.whole_names_in_help()
app = usage.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    help="Step through a Kimi K2 / DeepSeek-V3 layer and see every named tensor.",
)


def terminated(signum: int, frame: object) -> None:
    raise Terminated


def main() -> None:
    """Console entry point: usage errors become one line on stderr and exit code 2."""
    parallel.single_threaded_blas()  # stepper splits the big products across the cores itself
    output.install()  # a closed pipe ends the printing, not the files a command writes
    signal.signal(signal.SIGTERM, terminated)
    try:
        with np.errstate(all="ignore"):  # what NaN or inf a run makes is in its figures (its first NaN named)
            code = app(prog_name="stepper", standalone_mode=False)
    except typer.TyperException as e:  # typer's usage errors: bad or unknown options
        ctx = getattr(e, "ctx", None)
        if type(e).__name__ == "NoArgsIsHelpError" and ctx is not None:
            print(ctx.get_help())
            code = 0
        else:
            command = ctx.command_path if ctx is not None else "stepper"
            note(f"error: {shown(usage_message(e, sys.argv[1:]))} (see {shown(command)} --help)")
            code = 2
    except Terminated:  # cleaned up on the way here: now ended as the signal ends a process
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        sys.exit(128 + signal.SIGTERM)  # not reached
    except typer.Abort:  # end of input at a prompt (typer has written the newline)
        sys.stderr.write("stepper: interrupted\n")
        sys.exit(INTERRUPTED)
    if code == INTERRUPTED:  # Ctrl-C, in a command or in typer itself (which ends quietly)
        sys.stderr.write("\nstepper: interrupted\n")
    sys.exit(code or 0)


@app.callback(invoke_without_command=True)
def global_options(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
    cache_dir: cache.CacheDirOpt = None,
    cache_max_gb: cache.CacheMaxOpt = None,
) -> None:
    if version:
        print(f"stepper {__version__}")
        raise typer.Exit(0)
    with user_errors():
        cache.choose(cache_dir, cache_max_gb)


# The commands, in the order `stepper --help` lists them
# each command's line in `stepper --help`: whole at 80 columns (click cuts a longer summary with "...")
app.command("run", short_help="Run a model on a prompt, printing every named tensor.")(run.run_command)
app.command("step", short_help="Step through a run one named tensor at a time.")(run.step_command)
app.command("diff", short_help="Compare two runs, dumps or fixtures tensor by tensor.")(diff.diff_command)
app.command("explain", short_help="What a tensor is: its formula, shape and references.")(explain.explain_command)
app.command("tree", short_help="A layer's named tensors in order, with their shapes.")(explain.tree_command)
app.command("bench", short_help="Measure full-size layers and the machine's ceilings.")(bench.bench_command)
app.command("synth", short_help="Write synthetic weights as a checkpoint directory.")(checkpoint.synth_command)
app.command("inspect")(checkpoint.inspect_command)
app.command("fp8", short_help="Show the number formats: FP8, INT4 and FP4.")(checkpoint.fp8_command)
app.add_typer(fixtures_app, name="fixtures", short_help="Golden fixtures: export, verify, names.")
app.add_typer(lesson_app, name="lesson", short_help="Guided lessons: predict each tensor, write the pieces.")
app.add_typer(cache.cache_app, name="cache", short_help="The local cache of remote checkpoints: ls, clear.")
