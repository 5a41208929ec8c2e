"""`stepper fixtures`: export golden fixtures, verify another implementation's dump against one.

Bad input exits with code 2 and one line on stderr; `verify` exits 1 when a tensor differs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from stepper.cli import output, usage
from stepper.cli.common import (
    PRESET_NAMES,
    PlainOpt,
    model_option,
    note,
    one_prompt,
    parse_ids,
    parse_layers,
    user_errors,
)
from stepper.errors import StepperError
from stepper.fixtures import aliases, show, verify
from stepper.fixtures.export import export
from stepper.fixtures.fixture import load
from stepper.fixtures.spec import ExportSpec
from stepper.session import load_model, text_prompt_ids
from stepper.text import INSTALL
from stepper.untrusted import shown
from stepper.views.sinks import line_width, styles

fixtures_app = usage.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    help="Golden fixtures: every named tensor of a run, for other implementations to test against.",
)


def console_for(plain: bool, stderr: bool = False) -> Console:
    """A console whose lines a terminal gets wrapped at words, and a pipe or a file whole."""
    console = Console(**styles(plain), highlight=False, markup=False, stderr=stderr)
    console.soft_wrap = line_width(console) is None
    return console




@fixtures_app.command("export")
def export_command(
    out: Annotated[Path, typer.Argument(metavar="OUT_DIR", help="Fixture folder to create.", show_default=False)],
    model: Annotated[str, typer.Option(
        metavar="NAME|PATH", callback=model_option,
        help=f"Preset ({PRESET_NAMES}), a checkpoint directory or a config.json (./NAME for one named as a "
             "preset).")] = "tiny",
    layer: Annotated[int | None, typer.Option(
        metavar="N", min=0, help="Run layer N alone, on the prompt's token embeddings.")] = None,
    layers: Annotated[str | None, typer.Option(
        metavar="A:B", help="Run the model up to layer B-1, capturing layers A to B-1.")] = None,
    ids: Annotated[str | None, typer.Option(metavar="1,2,3", help="Prompt token ids, comma-separated.")] = None,
    prompt: Annotated[str | None, typer.Option(
        "--prompt", metavar="TEXT",
        help="The prompt as text, tokenized by the checkpoint's tokenizer; the fixture records its ids (needs: "
             f"{INSTALL}).")] = None,
    prompt_len: Annotated[int | None, typer.Option(
        metavar="T", min=1, show_default="7", help="Number of prompt tokens drawn from the seed.")] = None,
    start_pos: Annotated[int, typer.Option(metavar="P", min=0,
                                           help="Position of the first prompt token (empty cache).")] = 0,
    decode: Annotated[int, typer.Option(metavar="N", min=0,
                                        help="Decode steps after the prefill, with the cache.")] = 0,
    attn: Annotated[str, typer.Option(
        metavar="naive|absorb|auto",
        help="Attention: naive, absorb, or auto (naive prefill, absorbed decode).")] = "auto",
    seed: Annotated[int, typer.Option(metavar="S", min=0, help="Seed of the synthetic weights and prompt.")] = 0,
    index_scoring: Annotated[str, typer.Option(
        "--index-scoring", metavar="exact|fp8",
        help="DeepSeek-V3.2's Lightning Indexer: exact (float32 scores) or fp8 (Hadamard-rotated FP8 q and k, as "
             "DeepSeek's inference code).")] = "exact",
    weights_dtype: Annotated[str, typer.Option(metavar="fp8|bf16",
        help="How the fixture's weights are stored: fp8 (as Kimi K2 / DeepSeek-V3 ship) or bf16 (dequantized as "
             "fp8_cast_bf16.py does). A model published in BF16 (DeepSeek-V2, Kimi Linear) is stored as published "
             "either way.")] = "fp8",
    weights_dir: Annotated[Path | None, typer.Option(metavar="DIR",
        help="Write the weights to DIR (shared by several fixtures; if DIR exists it must hold the same files) instead "
             "of OUT_DIR/weights.")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Replace OUT_DIR if it is a fixture folder stepper wrote.")] = False,
    plain: PlainOpt = False,
) -> None:
    """Run the model and write every named tensor as a fixture folder.

    OUT_DIR gets manifest.json, tensors.safetensors and, for small synthetic models, the weights
    as an HF-layout checkpoint (weights/). Full-size synthetic weights are named by preset and
    seed instead, with the sha256 of every tensor the run read.
    """
    with user_errors():
        one_prompt(prompt, ids, prompt_len)
        if layer is not None and layers is not None:
            raise StepperError("give --layer or --layers, not both")
        chosen = text_prompt_ids(model, prompt, seed) if prompt is not None else parse_ids(ids)
        spec = ExportSpec(model=model, layer=layer, layers=parse_layers(layers), ids=chosen,
                          prompt_len=7 if prompt_len is None else prompt_len, start_pos=start_pos,
                          decode=decode, attn=attn, seed=seed, weights_dtype=weights_dtype, index_scoring=index_scoring)
        output.finish_files_when_the_reader_goes()
        export(spec, out, force=force, weights_dir=weights_dir, console=console_for(plain))


@fixtures_app.command("verify", short_help="Compare a candidate's tensors with a fixture's, in order.")
def verify_command(
    fixture: Annotated[Path, typer.Argument(metavar="FIXTURE", help="A fixture folder (or its manifest.json).",
                                            show_default=False)],
    candidate: Annotated[Path, typer.Argument(metavar="CANDIDATE",
                                              help="Another implementation's dump: .safetensors or .npz.",
                                              show_default=False)],
    map_file: Annotated[Path | None, typer.Option("--map", metavar="FILE.json",
                                                  help="Your names -> canonical names, a JSON object.")] = None,
    names: Annotated[str | None, typer.Option(
        "--names", metavar="NAMING", show_default="all of them, a shared name read canonically",
        help="The candidate's naming: transformers, inference, llama.cpp or canonical (its names are read beside "
             "the canonical ones, and it decides a name both spell).")] = None,
    allow_missing: Annotated[bool, typer.Option("--allow-missing",
                                                help="Tensors of the fixture missing from CANDIDATE do not fail (exit "
                                                     "0 if the rest match).")] = False,
    report: Annotated[Path | None, typer.Option(metavar="FILE.json",
                                                help="Write the full result as JSON (a new file; --force replaces a "
                                                     "report stepper wrote).")] = None,
    force: Annotated[bool, typer.Option("--force",
                                        help="Replace the --report file if it is a report stepper wrote.")] = False,
    rtol: Annotated[float | None, typer.Option(metavar="R",
                                               help="Relative tolerance for every float tensor, instead of the "
                                                    "manifest's.")] = None,
    atol: Annotated[float | None, typer.Option(metavar="A",
                                               help="Absolute tolerance for every float tensor, instead of the "
                                                    "manifest's per-tensor value.")] = None,
    problems: Annotated[bool, typer.Option("--problems", help="List only tensors that differ or are missing.")] = False,
    plain: PlainOpt = False,
) -> None:
    """Compare CANDIDATE with FIXTURE tensor by tensor, in execution order.

    Names may be canonical (layers.1.self_attn.k_pe, with prefill./decode0. in multi-step fixtures),
    transformers module paths, DeepSeek inference/model.py variables or llama.cpp callback names,
    each read through that implementation's naming table (see `stepper fixtures names`).
    Exit code 0: every tensor matches; 1: a tensor differs or is missing (unless --allow-missing);
    2: bad input.
    """
    with user_errors():
        for value, option in ((rtol, "--rtol"), (atol, "--atol")):
            if value is not None and not (0 <= value < math.inf):  # inf would pass every tensor
                raise StepperError(f"{option} must be a finite number >= 0, got {value}")
        if names is not None and names not in (*aliases.NAMINGS, "canonical"):
            raise StepperError(f"--names must be one of {', '.join(aliases.NAMINGS)} or canonical, got "
                               f"'{shown(names)}'")
        if report is not None:
            verify.check_report(report, force)
        loaded = load(fixture)
        mapping = aliases.read_map(map_file) if map_file is not None else None
        verdict = verify.verify(loaded, candidate, mapping, not allow_missing, rtol, atol, names)
        if report is not None:
            verify.write_report(report, verdict, force)
        show.verdict(console_for(plain), loaded, verdict, problems_only=problems)
        missing = verdict.count("missing")
        if missing and not allow_missing:
            note(f"{missing} of the fixture's {len(verdict.checks)} tensors are missing from {shown(candidate)}; "
                 "pass --allow-missing to accept that")
    raise typer.Exit(verdict.exit_code)


@fixtures_app.command("names", short_help="The other implementations' names that verify reads.")
def names_command(
    system: Annotated[str | None, typer.Option(
        "--names", "--system", metavar="NAMING",
        help="Only the names of transformers, inference or llama.cpp (as verify's --names).")] = None,
    model: Annotated[str | None, typer.Option(
        metavar="NAME|PATH", callback=model_option,
        help="Only the tables read for this model's family (a preset, a checkpoint or a config.json, as run "
             "takes it).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per name (JSON Lines).")] = False,
    plain: PlainOpt = False,
) -> None:
    """The names `verify` reads: every name of transformers, inference/model.py and llama.cpp.

    From each implementation's naming table (stepper/fixtures/naming/), in its source's order: the
    fixture tensor it holds (empty, with the reason in the note, when none), where it exists only
    (attention path, dense or MoE layers, KDA or MLA ones, layers without RoPE), its source line and
    revision. {i} is the layer; #n a variable's n-th value (fixtures/README.md, Names); multi-step
    fixtures prefix every name with prefill. or decode{k}.
    """
    with user_errors():
        if system is not None and system not in aliases.NAMINGS:
            raise StepperError(f"--names must be one of {', '.join(aliases.NAMINGS)}, got '{shown(system)}'")
        model_type = None if model is None else load_model(model, 0).config.model_type
        rows = aliases.names_table(system, model_type)
        if not rows:
            raise StepperError(f"no {system or 'naming'} table names the tensors of {model_type} models "
                               "(stepper fixtures names lists each table's families; "
                               "stepper fixtures verify --map FILE.json reads a dump under your own names)")
        if as_json:
            for row in rows:
                print(json.dumps(row))
            return
        console = console_for(plain)
        for naming, revision, models in dict.fromkeys((row["naming"], row["revision"], row["models"]) for row in rows):
            mine = [row for row in rows if (row["naming"], row["revision"],
                                            row["models"]) == (naming, revision, models)]
            columns = tuple((c, "left") for c in ("name", "canonical", "only", "source", "note"))
            show.print_fitting(console, f"{naming}, {models} (read at {revision})", columns, mine, "name",
                               ("source", "note"))
