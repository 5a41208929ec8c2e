"""`stepper synth`, `stepper inspect` and `stepper fp8`: checkpoints written, listed, and their FP8 taken apart."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from stepper.cli.common import PlainOpt, SeedOpt, parse_layers, user_errors
from stepper.errors import StepperError
from stepper.fp8 import BLOCK
from stepper.session import RunSpec, load_model, shown_layers
from stepper.untrusted import shown
from stepper.views import fp8_codes, inspect, inspect_stats
from stepper.weights.names import shape_of, storage_dtype
from stepper.weights.synth import synth_checkpoint
from stepper.weights.synthetic import SyntheticWeights


def synth_command(
    out: Annotated[Path, typer.Option(metavar="DIR", help="Directory to create.")],
    model: Annotated[str, typer.Option(metavar="NAME|PATH", help="Preset or config.json to make weights for.")] = "tiny",
    layers: Annotated[str | None, typer.Option(metavar="A:B", help="Write only layers A to B-1 (no embedding, norm or lm_head).")] = None,
    seed: SeedOpt = 0,
    force: Annotated[bool, typer.Option("--force", help="Replace DIR if it exists.")] = False,
) -> None:
    """Write synthetic weights as a real HF-layout FP8 checkpoint directory."""
    with user_errors():
        source = load_model(model, seed)
        if not isinstance(source, SyntheticWeights):
            raise StepperError(f"--model {model}: synth makes weights for a preset or a config.json, not a checkpoint")
        chosen = parse_layers(layers)
        if chosen is not None:
            chosen = shown_layers(RunSpec(layers=chosen), source.config)
        synth_checkpoint(source, out, chosen, force)
        files = sorted(p.name for p in out.iterdir())
        size = sum(p.stat().st_size for p in out.iterdir())
        print(f"wrote {shown(out)}: {len(files)} files, {size / 2**20:.1f} MiB "
              f"({', '.join(files[:3])}{', ...' if len(files) > 3 else ''})")


def inspect_command(
    path: Annotated[str, typer.Argument(metavar="PATH", help="A .safetensors file, a checkpoint directory, or a remote checkpoint (hf://ORG/NAME[@REVISION], https://HOST/PATH/).", show_default=False)],
    stats: Annotated[bool, typer.Option("--stats", help="Decode every tensor (FP8 with its scales) and add min, max, mean, std, absmax, NaN and Inf counts.")] = False,
    only: Annotated[list[str] | None, typer.Option(metavar="GLOB", help="List only tensors whose name (or scale's name) matches GLOB, e.g. '*layers.1.*'; repeatable.")] = None,
    layers: Annotated[str | None, typer.Option(metavar="A:B", help="Check and list only layers A to B-1 (no embedding, norm or lm_head).")] = None,
    experts: Annotated[bool, typer.Option("--experts", help="One row per routed expert instead of one row per projection of all experts.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per tensor (JSON Lines, experts never folded) on stdout, then one with every problem.")] = False,
    plain: PlainOpt = False,
) -> None:
    """List a checkpoint's tensors, layer by layer, and check them.

    PATH is a checkpoint directory (config.json, index, shards) or one .safetensors file. Each row
    shows a tensor's dtype, shape, FP8 scale grid (the weight_scale_inv shape), size and shard; a
    layer's routed experts share one row per projection unless --experts.

    Everything a run of any layer checks is checked, for every layer, and more: every block
    scale's values, shards no run could read, tensors in no layer of the config. Exit code 0:
    sound; 1: problems found (each in its tensor's row and listed at the end); 2: PATH cannot be
    read at all.
    """
    with user_errors():
        source = inspect.open_source(path)
        chosen = inspect_layers(layers, source)
        problems = inspect.find_problems(source, chosen)
        tensors = inspect.collect(source, only, problems, chosen)
        if only and not tensors:
            raise StepperError(f"--only {' '.join(only)} matched no tensor (names look like model.layers.1.self_attn.o_proj.weight)")
        if stats:
            tensors = inspect_stats.with_stats(source, tensors, progress=sys.stderr.isatty(), plain=plain)
        groups = inspect.group(tensors, source.config, fold_experts=not experts and not as_json)
        if as_json:
            inspect.write_json(sys.stdout, groups, problems)
        else:
            console = Console(no_color=plain, highlight=False, soft_wrap=True)
            inspect.render(console, source, groups, tensors, inspect.total_tensors(source), stats, problems)
    if problems:
        raise typer.Exit(1)


def inspect_layers(layers: str | None, source: inspect.Source) -> range | None:
    """--layers A:B as a range, checked against the config's layers (a file has no config)."""
    chosen = parse_layers(layers)
    if chosen is None:
        return None
    if source.config is None:
        return range(chosen[0], chosen[1] if chosen[1] is not None else 2**63)
    return shown_layers(RunSpec(layers=chosen), source.config)


def fp8_command(
    code: Annotated[str | None, typer.Argument(metavar="CODE", help="One byte to take apart: 0xCD, 205 or 0b11001101.", show_default=False)] = None,
    weight: Annotated[str | None, typer.Option(metavar="NAME", help="Show one block of this FP8 weight, e.g. model.layers.1.self_attn.kv_a_proj_with_mqa.weight.")] = None,
    model: Annotated[str | None, typer.Option(metavar="NAME|DIR", help="With --weight: a preset (synthetic weights) or a checkpoint directory [default: tiny].")] = None,
    block: Annotated[str | None, typer.Option(metavar="R,C", help="With --weight: the block's row and column in the weight's scale grid [default: 0,0].")] = None,
    seed: Annotated[int | None, typer.Option(metavar="S", min=0, help="With --weight and a preset: seed of the synthetic weights [default: 0].")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout: the 256 codes, the byte, or the block.")] = False,
    plain: PlainOpt = False,
) -> None:
    """Show the e4m3fn format and FP8 weight blocks.

    \b
    stepper fp8                   the value of all 256 codes, as a 16x16 table
    stepper fp8 0xCD              one byte bit by bit (also 205 or 0b11001101)
    stepper fp8 --weight NAME     one 128x128 block of an FP8 weight: its scale_inv,
                                  codes and values (--model, --block R,C)
    """
    with user_errors():
        if weight is None:
            given = [f"--{o}" for o, value in (("model", model), ("block", block), ("seed", seed)) if value is not None]
            if given:
                raise StepperError(f"{', '.join(given)} only go{'es' if len(given) == 1 else ''} with --weight NAME")
        elif code is not None:
            raise StepperError("give a CODE or --weight NAME, not both")
        console = Console(no_color=plain, highlight=False, soft_wrap=True)
        if weight is not None:
            shown = fp8_block(weight, model or "tiny", parse_block(block or "0,0"), seed or 0)
            if as_json:
                print(json.dumps(fp8_codes.block_record(shown), allow_nan=False))
            else:
                fp8_codes.render_block(console, shown)
        elif code is not None:
            byte = parse_code(code)
            if as_json:
                print(json.dumps(fp8_codes.code_record(byte)))
            else:
                fp8_codes.render_code(console, byte)
        elif as_json:
            print(fp8_codes.table_json())
        else:
            fp8_codes.render_table(console)


def fp8_block(name: str, model: str, index: tuple[int, int], seed: int) -> fp8_codes.Block:
    """Block `index` of weight `name` from a preset's synthetic weights or a checkpoint."""
    source = load_model(model, seed)
    cfg = source.config
    size = cfg.quantization.weight_block_size if cfg.quantization else BLOCK
    example = "FP8 weights are the layers' projections, e.g. model.layers.1.self_attn.kv_a_proj_with_mqa.weight"
    if isinstance(source, SyntheticWeights):  # check before making it: an embedding can be gigabytes
        try:
            shape = shape_of(cfg, name)
        except StepperError as e:
            raise StepperError(f"{e}; {example}") from None
        fp8_codes.require_fp8(name, storage_dtype(cfg, name), shape)
    elif not source.has(name):
        raise StepperError(f"{model}: no tensor named '{name}'; {example}")
    where = f"synthetic weights of {cfg.name}, seed {seed}" if isinstance(source, SyntheticWeights) else f"checkpoint {model}"
    return fp8_codes.load_block(source.stored(name), name, index, size, where)


def parse_code(text: str) -> int:
    """A byte given as hex (0xCD), decimal (205) or binary (0b11001101)."""
    expected = "a byte as hex 0x00..0xFF, decimal 0..255 or binary 0b00000000..0b11111111"
    try:
        code = int(text, 0)
    except ValueError:
        try:
            code = int(text, 10)  # decimal with leading zeros, e.g. 007
        except ValueError:
            raise StepperError(f"CODE: expected {expected} (e.g. 0xCD, 205, 0b11001101), got '{text}'") from None
    if not 0 <= code <= 255:
        raise StepperError(f"CODE: '{text}' is {code}, which is not one byte: expected {expected}")
    return code


def parse_block(text: str) -> tuple[int, int]:
    """--block R,C: the block's row and column in the weight's scale grid."""
    parts = text.split(",")
    try:
        if len(parts) != 2:
            raise ValueError
        return int(parts[0]), int(parts[1])
    except ValueError:
        raise StepperError(f"--block expects R,C (the block's row and column in the scale grid, e.g. 1,2), got '{text}'") from None
