"""`stepper synth`, `stepper inspect` and `stepper fp8`: checkpoints written, listed, and their FP8 taken apart."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from stepper.cli.cache import byte_progress
from stepper.cli.common import PlainOpt, model_option, parse_layers, url_option, user_errors
from stepper.config import Config, Wrapper
from stepper.errors import StepperError
from stepper.fp8 import BLOCK
from stepper.presets import PRESETS, V4_PRESETS
from stepper.session import RunSpec, layers_shown, load_model
from stepper.untrusted import shown
from stepper.views import fp4_codes, fp8_codes, inspect, inspect_stats, int4_codes
from stepper.views.sinks import print_fitted, styles
from stepper.weights.names import shape_of, storage_dtype
from stepper.weights.published import FP4_DTYPE, PublishedCheckpoint, is_published_v4
from stepper.weights.remote import is_remote
from stepper.weights.remote_published import RemotePublishedCheckpoint, is_remote_published, open_published
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.stored import FP4, Stored
from stepper.weights.synth_checkpoint import QUANTS, no_progress, requantized, synth_checkpoint


def synth_command(
    out: Annotated[Path, typer.Option(metavar="DIR", help="Directory to create.")],
    model: Annotated[str, typer.Option(metavar="NAME|PATH",
                                       help="Preset or config.json to make weights for.")] = "tiny",
    layers: Annotated[str | None, typer.Option(metavar="A:B",
                                               help="Write only layers A to B-1 (no embedding, norm or "
                                                    "lm_head).")] = None,
    seed: Annotated[int, typer.Option(metavar="S", min=0, help="Seed of the synthetic weights.")] = 0,
    force: Annotated[bool, typer.Option(
        "--force", help="Replace DIR if it is a checkpoint stepper synth wrote.")] = False,
    layout: Annotated[str | None, typer.Option(metavar="LAYOUT", show_default="as the config says",
        help="hf (Kimi K2, DeepSeek-V3) or kimi_k25 (Kimi K2.5: the text model under language_model., a small vision "
             "tower beside it).")] = None,
    quant: Annotated[str | None, typer.Option(metavar="|".join(QUANTS), show_default="as the config says",
                                              help="How linear weights are stored: fp8 (128x128 "
                     "blocks, as Kimi K2 / DeepSeek-V3; one scale per tensor where experts are fused, as Mistral "
                     "Small 4), int4 (experts in compressed-tensors pack-quantized INT4, "
                     "groups of 32, the rest BF16, as Kimi-K2-Thinking), bf16.")] = None,
) -> None:
    """Write synthetic weights as a real HF-layout checkpoint directory, stored as the config or --quant says."""
    with user_errors():
        source = load_model(model, seed)
        progress = byte_progress if sys.stderr.isatty() else no_progress
        if hasattr(source, "write_checkpoint"):  # a family's synthetic weights in its published layout (DeepSeek-V4)
            given = [(o, value) for o, value in (("--layers", layers), ("--layout", layout), ("--quant", quant))
                     if value]
            if given:
                option, value = given[0]
                raise StepperError(f"{option} {shown(value)}: model {shown(source.config.name)} "
                                   f"({source.config.model_type}) is written whole and as published "
                                   f"({source.written_as}); leave {option} out")
            source.write_checkpoint(out, force, progress)
            return wrote(out)
        if not isinstance(source, SyntheticWeights):
            raise StepperError(f"--model {model}: synth makes weights for a preset or a config.json, not a checkpoint")
        if layout is not None:
            source = SyntheticWeights(with_layout(source.config, layout), seed)
        if quant is not None:
            source = SyntheticWeights(requantized(source.config, quant), seed)
        chosen = parse_layers(layers)
        if chosen is not None:
            chosen = layers_shown(RunSpec(layers=chosen), source.config)
        synth_checkpoint(source, out, chosen, force, progress)
        wrote(out)


def wrote(out: Path) -> None:
    """The line saying what synth wrote."""
    files = sorted(p.name for p in out.iterdir())
    size = sum(p.stat().st_size for p in out.iterdir())
    print_fitted(Console(highlight=False, markup=False, **styles(False)),
                 f"wrote {shown(out)}: {len(files)} files, {size / 2**20:.1f} MiB "
                 f"({', '.join(files[:3])}{', ...' if len(files) > 3 else ''})")


LAYOUTS = ("hf", "kimi_k25")


def with_layout(cfg: Config, layout: str) -> Config:
    """The config as a checkpoint of that layout carries it: plain, or wrapped as Kimi K2.5's."""
    if layout not in LAYOUTS:
        raise StepperError(f"--layout must be one of {', '.join(LAYOUTS)}, got {shown(layout)!r}")
    return replace(cfg, wrapper=None if layout == "hf" else Wrapper("kimi_k25"))


def inspect_command(
    path: Annotated[str, typer.Argument(
        metavar="PATH", callback=url_option, show_default=False,
        help="A .safetensors file, a checkpoint directory, or a remote checkpoint (hf://ORG/NAME[@REVISION], "
             "https://HOST/PATH/).")],
    stats: Annotated[bool, typer.Option("--stats",
                                        help="Decode every tensor (FP8 with its scales) and add min, max, mean, std, "
                                             "absmax, NaN and Inf counts.")] = False,
    only: Annotated[list[str] | None, typer.Option(metavar="GLOB",
                                                   help="List only tensors whose name (or scale's name) matches GLOB, "
                                                        "e.g. '*layers.1.*'; repeatable.")] = None,
    layers: Annotated[str | None, typer.Option(metavar="A:B",
                                               help="Check and list only layers A to B-1 (no embedding, norm or "
                                                    "lm_head).")] = None,
    experts: Annotated[bool, typer.Option("--experts",
                                          help="One row per routed expert instead of one row per projection of all "
                                               "experts.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per tensor (JSON Lines, experts never "
                                                         "folded) on stdout, then one with every problem.")] = False,
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
            example = "layers.1.attn.wq_a.weight" if source.published else "model.layers.1.self_attn.o_proj.weight"
            raise StepperError(f"--only {' '.join(only)} matched no tensor (names look like {example})")
        if stats:
            tensors = inspect_stats.with_stats(source, tensors, progress=sys.stderr.isatty(), plain=plain)
            problems = problems + inspect.value_problems(source, tensors)
        groups = inspect.group(tensors, source.config, fold_experts=not experts and not as_json, unused=source.unused,
                               published=source.published)
        if as_json:
            inspect.write_json(sys.stdout, groups, problems, source.notes)
        else:
            console = Console(**styles(plain), highlight=False, soft_wrap=True)
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
    return layers_shown(RunSpec(layers=chosen), source.config)


def fp8_command(
    code: Annotated[str | None, typer.Argument(
        metavar="CODE", show_default=False,
        help="One byte to take apart: 0xCD, 205 or 0b11001101 (with --int4: a 32-bit word, 0x89ABCDEF; with --fp4: "
             "a packed byte, 0x2F).")] = None,
    weight: Annotated[str | None, typer.Option(
        metavar="NAME",
        help="Show one block of this FP8 weight, e.g. model.layers.1.self_attn.kv_a_proj_with_mqa.weight, or one "
             "group of this INT4 or FP4 weight (DeepSeek-V4: layers.1.ffn.experts.0.w1.weight).")] = None,
    model: Annotated[str | None, typer.Option(metavar="NAME|PATH", callback=model_option, show_default="tiny",
                                              help="With --weight: a preset (synthetic weights), a checkpoint "
                                                   "directory or a remote one (hf://ORG/NAME, https://HOST/PATH/; "
                                                   "of a DeepSeek-V4 one only the headers, the weight's scales and "
                                                   "the rows shown are fetched).")] = None,
    block: Annotated[str | None, typer.Option(metavar="R,C", show_default="0,0",
        help="With --weight: the block's row and column in the weight's scale grid; for an INT4 or FP4 weight its "
             "row and group.")] = None,
    int4: Annotated[bool, typer.Option("--int4",
                                       help="INT4 (compressed-tensors pack-quantized) instead of e4m3fn: the 16 "
                                            "codes, or CODE as one word.")] = False,
    fp4: Annotated[bool, typer.Option("--fp4",
                                      help="FP4 e2m1 (DeepSeek-V4's experts) instead of e4m3fn: the 16 codes, or "
                                           "CODE as one packed byte.")] = False,
    seed: Annotated[int | None, typer.Option(
        metavar="S", min=0, show_default="0",
        help="With --weight and a preset: seed of the synthetic weights.")] = None,
    as_json: Annotated[bool, typer.Option("--json",
                                          help="JSON on stdout: the 256 codes, the byte, or the block.")] = False,
    plain: PlainOpt = False,
) -> None:
    """Show the checkpoints' number formats: e4m3fn and FP8 blocks, INT4 words and groups, FP4 bytes and groups.

    \b
    stepper fp8                    all 256 codes' values, as a 16x16 table
    stepper fp8 0xCD               one byte bit by bit (also 205 or 0b11001101)
    stepper fp8 --weight NAME      an FP8 weight's 128x128 block: scale_inv,
                                   codes, values (--model, --block R,C); an
                                   INT4 or FP4 weight's group of 32 inputs,
                                   nibble by nibble (--block ROW,GROUP)
    stepper fp8 --int4             the 16 INT4 codes and their values
    stepper fp8 --int4 0x89ABCDEF  one packed word nibble by nibble
    stepper fp8 --fp4              the 16 e2m1 codes, bit by bit
    stepper fp8 --fp4 0x2F         one packed FP4 byte: its two codes
    """
    with user_errors():
        check_fp8_options(code, weight, model, block, seed, int4, fp4)
        console = Console(**styles(plain), highlight=False, soft_wrap=True)
        if int4:
            int4_view(console, code, as_json)
        elif fp4:
            fp4_view(console, code, as_json)
        elif weight is not None:
            weight_view(console, weight, model or "tiny", parse_block(block or "0,0"), seed or 0, as_json)
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


def check_fp8_options(code: str | None, weight: str | None, model: str | None, block: str | None, seed: int | None,
                      int4: bool, fp4: bool) -> None:
    """The options of `stepper fp8` that go together: --model, --block and --seed only with --weight."""
    if weight is None:
        given = [f"--{o}" for o, value in (("model", model), ("block", block), ("seed", seed)) if value is not None]
        if given:
            raise StepperError(f"{', '.join(given)} only go{'es' if len(given) == 1 else ''} with --weight NAME")
    elif code is not None:
        raise StepperError("give a CODE or --weight NAME, not both")
    elif int4 or fp4:
        raise StepperError(f"--{'int4' if int4 else 'fp4'} is for the codes or a {'word' if int4 else 'byte'}; "
                           "--weight NAME shows whichever format the weight has")
    if int4 and fp4:
        raise StepperError("--int4 and --fp4 are two formats: give one")


def weight_view(console: Console, weight: str, model: str, index: tuple[int, int], seed: int, as_json: bool) -> None:
    """One INT4 or FP4 group or one FP8 block of a weight, whichever format it is stored in."""
    folder = model not in PRESETS and model not in V4_PRESETS and Path(model).is_dir()  # a preset's name: the preset
    if is_remote(model) and is_remote_published(model) or folder and is_published_v4(Path(model)):
        source = open_published(model)
        label = source.label if is_remote(model) else model  # a URL without its credentials
        published_view(console, weight, source.has, reader_of(source, index), f"checkpoint {label}", index, as_json)
        return
    synthetic = None if folder else load_model(model, seed)
    if hasattr(synthetic, "published_stored"):  # a V4 preset: its weights as they would be stored, by DeepSeek's names
        published_view(console, weight, synthetic.has_published, synthetic.published_stored,
                       f"synthetic weights of {synthetic.config.name}, seed {seed}", index, as_json)
        return
    if weight_dtype(weight, model, seed) == "INT4":
        group = int4_group(weight, model, index, seed)
        if as_json:
            print(json.dumps(int4_codes.group_record(group), allow_nan=False))
        else:
            int4_codes.render_group(console, group)
        return
    block = fp8_block(weight, model, index, seed)
    if as_json:
        print(json.dumps(fp8_codes.block_record(block), allow_nan=False))
    else:
        fp8_codes.render_block(console, block)


def fp4_view(console: Console, code: str | None, as_json: bool) -> None:
    """The 16 e2m1 codes, or one packed byte's two codes."""
    if code is None:
        if as_json:
            print(json.dumps(fp4_codes.code_records()))
        else:
            fp4_codes.render_codes(console)
        return
    byte = fp4_codes.parse_byte(code)
    if as_json:
        print(json.dumps(fp4_codes.byte_record(byte)))
    else:
        fp4_codes.render_byte(console, byte)


def reader_of(source, index: tuple[int, int]) -> Callable[[str], Stored]:
    """A published checkpoint's weights as stored; of a remote one only the headers, the weight's
    scales and the rows the block or group `index` shows are fetched."""
    if isinstance(source, RemotePublishedCheckpoint):
        return lambda name: source.stored_rows(name, shown_rows(source, name, index))
    return source.stored


def published_view(console: Console, name: str, has: Callable[[str], bool], stored_of: Callable[[str], Stored],
                   where: str, index: tuple[int, int], as_json: bool) -> None:
    """A weight of DeepSeek-V4 (a checkpoint's, or a preset's as stored) by its published name: an FP4
    expert's group of 32 inputs, or an FP8 weight's 128x128 block with its E8M0 scale."""
    if not has(name):
        raise StepperError(f"{where}: no tensor named '{shown(name)}' (DeepSeek-V4's published names, e.g. "
                           "layers.1.ffn.experts.0.w1.weight)")
    stored = stored_of(name)
    if stored.dtype == FP4:
        group = fp4_codes.load_group(stored, name, index, where)
        if as_json:
            print(json.dumps(fp4_codes.group_record(group), allow_nan=False))
        else:
            fp4_codes.render_group(console, group)
        return
    block = fp8_codes.load_block(stored, name, index, BLOCK, where)
    if as_json:
        print(json.dumps(fp8_codes.block_record(block), allow_nan=False))
    else:
        fp8_codes.render_block(console, block)


def shown_rows(source: PublishedCheckpoint, name: str, index: tuple[int, int]) -> range:
    """The rows of the weight that --block R,C shows: row R of an FP4 weight, an FP8 weight's block row R."""
    stored = source.local(name)
    height = 1 if source.shard_of(stored).info(stored).dtype == FP4_DTYPE else BLOCK[0]
    return range(index[0] * height, (index[0] + 1) * height)


def int4_view(console: Console, code: str | None, as_json: bool) -> None:
    """The 16 INT4 codes, or one packed word nibble by nibble."""
    if code is None:
        if as_json:
            print(json.dumps(int4_codes.nibble_records()))
        else:
            int4_codes.render_nibbles(console)
        return
    word = int4_codes.parse_word(code)
    if as_json:
        print(json.dumps(int4_codes.word_record(word)))
    else:
        int4_codes.render_word(console, word)


def weight_dtype(name: str, model: str, seed: int) -> str:
    """How the model stores the weight (a checkpoint's config decides INT4 as for a run)."""
    return storage_dtype(load_model(model, seed).config, name)


def int4_group(name: str, model: str, index: tuple[int, int], seed: int) -> int4_codes.Group:
    """Group `index` (row, group) of INT4 weight `name` from synthetic weights or a checkpoint."""
    source = load_model(model, seed)
    if not isinstance(source, SyntheticWeights) and not source.has(name):
        raise StepperError(f"{model}: no tensor named '{name}' (an INT4 weight is stored as '{name}_packed')")
    where = (f"synthetic weights of {source.config.name}, seed {seed}" if isinstance(source, SyntheticWeights)
             else f"checkpoint {model}")
    return int4_codes.load_group(source.stored(name), name, index, where)


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
    where = (f"synthetic weights of {cfg.name}, seed {seed}" if isinstance(source, SyntheticWeights)
             else f"checkpoint {model}")
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
        raise StepperError("--block expects R,C (the block's row and column in the scale grid, e.g. 1,2), got "
                           f"'{text}'") from None
