"""`stepper bench`: full-size layer timings and the machine's ceilings."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from stepper import files
from stepper.cli.common import user_errors
from stepper.errors import StepperError
from stepper.untrusted import shown
from stepper.views.sinks import line_width, styles

LONG_MODEL = "kimi-k2"  # --long's model unless --long-model names another
WORKDIR_HELP = "Where the synthetic full-size checkpoints are written once and reused (about 20 GB)."
TORCH_HELP = ("Also compare with transformers' DeepseekV3 on a 16-expert layer (needs the crosscheck extra): the two "
              "run in turn, and each figure is the median of the paired ratios, printed with the least time "
              "stepper's work could take (its FP8 decoding and products at rates measured beside it).")
INT4_HELP = ("Also the MoE layer with INT4 experts (Kimi-K2-Thinking's storage; about 10 GB more written once), and "
             "its ratio to the FP8 layer, the two timed in turn (decode, and a prefill whose chosen experts of both "
             "fit the page cache together), and one routed expert's.")
INDEXER_HELP = ("Also time DeepSeek-V3.2's layer 0 prefilling 4096 tokens: its Lightning Indexer, its attention under "
                "the indexer's mask, and the whole layer, each alone (writes a 0.6 GB checkpoint once).")
KDA_HELP = ("Also time one full-size Kimi Linear KDA layer's attention (synthetic weights in memory): decode 1 token, "
            "prefill 4096 tokens (chunked, and once token by token), with the share of the time in the state update.")
V4_HELP = ("Only DeepSeek-V4-Flash's figures (not part of the default run: they write 3.5 GB more and take several "
           "minutes): its CSA layer 4 (synthetic weights in the published layout, FP4 experts, FP8 "
           "attention) decoding 1 token after 1024 positions and prefilling 512, each with the time of its parts and "
           "its floor from the FP4, FP8 and GEMM rates measured in the same process; and a CSA attention's decode "
           "step over 1,048,576 seeded positions (time, peak memory).")
V4_HCA_HELP = ("With --v4 (and implying it), also V4-Flash's HCA layer 3 (compress ratio 128, no indexer) decoding 1 "
               "token after 1024 positions and prefilling 512, with its parts and its own floor: about 3.6 GB more "
               "written once, and several minutes more.")
LONG_HELP = ("Only the long-context figures: the attention of --long-model's layer 0 (synthetic weights) at naive "
             "prefills of 4096, 16384 and 32768 tokens (time, share of the GEMM rate, peak RSS; 4096 also with every "
             "tensor shown), an absorbed 32768-token prefill in chunks with every tensor shown (about an hour), and "
             "absorbed decode steps over 8K, 32K and 128K cached positions, shown.")


def bench_command(
    workdir: Annotated[Path | None, typer.Option(metavar="DIR", show_default="~/.cache/stepper/bench",
                                                 help=WORKDIR_HELP)] = None,
    torch: Annotated[bool, typer.Option("--torch/--no-torch", help=TORCH_HELP)] = True,
    int4: Annotated[bool, typer.Option("--int4/--no-int4", help=INT4_HELP)] = True,
    as_json: Annotated[bool, typer.Option("--json", help="The figures as JSON on stdout.")] = False,
    indexer: Annotated[bool, typer.Option("--indexer", help=INDEXER_HELP)] = False,
    kda: Annotated[bool, typer.Option("--kda", help=KDA_HELP)] = False,
    long: Annotated[bool, typer.Option("--long", help=LONG_HELP)] = False,
    v4: Annotated[bool, typer.Option("--v4", help=V4_HELP)] = False,
    v4_hca: Annotated[bool, typer.Option("--v4-hca", help=V4_HCA_HELP)] = False,
    long_model: Annotated[str | None, typer.Option(metavar="MODEL", show_default=LONG_MODEL,
                                                   help="A preset or config.json for --long.")] = None,
) -> None:
    """Measure full-size Kimi K2 layers (decode, prefill, peak memory) and the machine's ceilings.

    The first run writes about 20 GB of synthetic checkpoints into the work directory (several
    minutes); later runs reuse them and take 3-7 minutes, reading them back from disk
    included. Each checkpoint is first dropped from the page cache and read back as stepper
    reads it, so that every run finds it cached the same way whatever read it before, and each
    layer scenario reads its checkpoint through before it is timed (24 GB of RAM is enough for
    the 17 GB MoE layer): the figures measure compute, not the disk."""
    from stepper.bench import ceilings, long_context, runner, v4_layer

    with user_errors():
        check_together(long, "--v4-hca" if v4_hca else "--v4" if v4 else None, indexer, kda, long_model, workdir)
        console = Console(stderr=as_json, highlight=False, markup=False, **styles(False))
        whole = line_width(console) is None  # a terminal wraps at words; a pipe or a file keeps each line whole
        workdir = workdir or Path.home() / ".cache" / "stepper" / "bench"
        if not long:  # the checkpoints are written there: a folder that cannot be is refused before any measuring
            usable_workdir(workdir)
        say = lambda line: console.print(f"· {shown(line)}", style="dim", soft_wrap=whole)
        if long:
            figures = long_context.long_context(long_model or LONG_MODEL, say)
        elif v4 or v4_hca:
            figures = v4_layer.v4_figures(workdir, say, hca=v4_hca)
        else:
            figures = runner.run_all(workdir, torch and has_torch(), say, int4, indexer, kda)
        if as_json:
            print(json.dumps({"machine": ceilings.machine(), "figures": [f.__dict__ for f in figures]}, indent=1))
            return
        console.print(f"machine: {shown(ceilings.machine())}", soft_wrap=whole)
        for f in figures:
            rss = f"  peak RSS {f.peak_rss_mb:,.0f} MB" if f.peak_rss_mb else ""
            console.print(f"{f.name}: {f.value:.3g} {f.unit}{rss}{against_floor(f)}  {shown(f.note)}", soft_wrap=whole)


def check_together(long: bool, v4: str | None, indexer: bool, kda: bool, long_model: str | None,
                   workdir: Path | None) -> None:
    """Options the chosen run would not read, refused before it starts (a bench runs for minutes and writes
    gigabytes): --long and --v4 are runs of their own, --indexer and --kda add to the default one,
    --long-model is --long's, and --long writes no checkpoint in a --workdir."""
    own = [name for name, on in (("--long", long), (v4, v4 is not None)) if on]
    added = [name for name, on in (("--indexer", indexer), ("--kda", kda), ("--workdir", long and workdir)) if on]
    if own and (own[1:] or added):
        raise StepperError(f"{own[0]} is a run of its own: leave out {' and '.join(own[1:] + added)}")
    if long_model is not None and not long:
        raise StepperError(f"--long-model {shown(long_model)} is the model --long measures: add --long")


def usable_workdir(workdir: Path) -> None:
    """The work folder made if it is missing, and refused in one line where nothing can be written in
    it: the default run measures the machine's ceilings (seconds) before it writes its first checkpoint."""
    files.make_folder(workdir)
    if not os.access(workdir, os.W_OK):
        raise StepperError(f"--workdir {shown(workdir)}: the folder is not writable")


def against_floor(f) -> str:
    """'  = 1.23x its floor (how)' for a figure with a floor measured in the same run; '' without one."""
    if f.floor is None:
        return ""
    return f"  = {f.ratio():.2f}x its floor {f.floor:.3g} {f.unit} ({shown(f.floor_note)})"


def has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None and importlib.util.find_spec("transformers") is not None
