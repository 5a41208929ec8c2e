"""The `stepper` command line. Bad input exits with code 2 and one line on stderr."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from . import __version__
from .dump import check_writable, write_dump
from .errors import StepperError
from .session import Plan, RunResult, RunSpec, execute, load_model, prepare, shown_layers
from .synth import synth_checkpoint
from .trace import Filter, Recorder, Sink, matches
from .ui import JsonLines, TensorRows
from .weights import SyntheticWeights

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    help="Step through a Kimi K2 / DeepSeek-V3 layer and see every named tensor.",
)


def fail(message: str) -> None:
    sys.stderr.write(f"stepper: error: {message}\n")
    raise typer.Exit(2)


def parse_layers(layers: str | None) -> tuple[int, int | None] | None:
    if layers is None:
        return None
    first, sep, stop = layers.partition(":")
    try:
        if not sep:
            raise ValueError
        return int(first or 0), int(stop) if stop else None
    except ValueError:
        raise StepperError(f"--layers expects A:B (layers A to B-1), got '{layers}'") from None


def parse_ids(ids: str | None) -> tuple[int, ...] | None:
    if ids is None:
        return None
    try:
        return tuple(int(part) for part in ids.split(","))
    except ValueError:
        raise StepperError(f"--ids expects comma-separated integers like 1,2,3, got '{ids}'") from None


def main() -> None:
    """Console entry point: usage errors become one line on stderr and exit code 2."""
    try:
        code = app(prog_name="stepper", standalone_mode=False)
    except typer.TyperException as e:  # typer's usage errors: bad or unknown options
        ctx = getattr(e, "ctx", None)
        if type(e).__name__ == "NoArgsIsHelpError" and ctx is not None:
            print(ctx.get_help())
            code = 0
        else:
            command = ctx.command_path if ctx is not None else "stepper"
            sys.stderr.write(f"stepper: error: {e.format_message()} (see {command} --help)\n")
            code = 2
    except typer.Abort:
        sys.stderr.write("stepper: interrupted\n")
        code = 130
    sys.exit(code or 0)


@app.callback(invoke_without_command=True)
def version_option(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        print(f"stepper {__version__}")
        raise typer.Exit(0)


def describe(plan: Plan) -> str:
    """One line saying what is about to run."""
    cfg, spec = plan.config, plan.spec
    dense = sum(not cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
    moe = f", {cfg.n_routed_experts} experts top-{cfg.num_experts_per_tok}" if dense < cfg.num_hidden_layers else ""
    weights = f"synthetic weights, seed {spec.seed}" if isinstance(plan.weights, SyntheticWeights) else f"weights from {spec.model}"
    what = f"layer {spec.layer} alone on {plan.input_source}" if plan.alone else f"layers {plan.shown.start}..{plan.shown.stop - 1}"
    steps = f", then {spec.decode} decode step{'s' if spec.decode > 1 else ''}" if spec.decode else ""
    return (
        f"model {cfg.name} ({cfg.model_type}): {cfg.num_hidden_layers} layers ({dense} dense), "
        f"{cfg.num_attention_heads} heads{moe} · {weights} · {what}{steps}"
    )


@app.command("run")
def run_command(
    model: Annotated[str, typer.Option(metavar="NAME|PATH", help="Preset (tiny, tiny-v3, kimi-k2, deepseek-v3), a checkpoint directory or a config.json.")] = "tiny",
    layer: Annotated[int | None, typer.Option(metavar="N", help="Run layer N alone (on --input or the prompt's embeddings).")] = None,
    layers: Annotated[str | None, typer.Option(metavar="A:B", help="Run the model up to layer B-1, showing layers A to B-1.")] = None,
    ids: Annotated[str | None, typer.Option(metavar="1,2,3", help="Prompt token ids, comma-separated.")] = None,
    prompt_len: Annotated[int | None, typer.Option(metavar="T", help="Number of prompt tokens drawn from the seed [default: 7].")] = None,
    start_pos: Annotated[int, typer.Option(metavar="P", help="Position of the first prompt token (empty cache).")] = 0,
    decode: Annotated[int, typer.Option(metavar="N", help="Decode steps after the prefill, with the cache (greedy tokens).")] = 0,
    seed: Annotated[int, typer.Option(metavar="S", help="Seed of the synthetic weights and prompt.")] = 0,
    input_file: Annotated[Path | None, typer.Option("--input", metavar="FILE", help="Residual stream for --layer N: a safetensors file (e.g. a --dump).")] = None,
    only: Annotated[list[str] | None, typer.Option(metavar="GLOB", help="Show (and dump) only names matching GLOB, e.g. '*k_pe*'; repeatable.")] = None,
    plain: Annotated[bool, typer.Option("--plain", help="No colour.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per tensor (JSON Lines) on stdout.")] = False,
    dump: Annotated[Path | None, typer.Option(metavar="FILE", help="Write every shown tensor to FILE.safetensors.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Let --dump overwrite an existing file.")] = False,
) -> None:
    """Run the model on a prompt and print every named tensor in execution order."""
    try:
        if ids is not None and prompt_len is not None:
            raise StepperError("give --ids or --prompt-len, not both")
        if layer is not None and layers is not None:
            raise StepperError("give --layer or --layers, not both")
        spec = RunSpec(
            model=model,
            layer=layer,
            layers=parse_layers(layers),
            ids=parse_ids(ids),
            prompt_len=7 if prompt_len is None else prompt_len,
            start_pos=start_pos,
            decode=decode,
            seed=seed,
            input=input_file,
        )
        if dump is not None:
            check_writable(dump, force)
        plan = prepare(spec)
        console = Console(no_color=plain, highlight=False, soft_wrap=True)
        if not as_json:
            console.print(describe(plan), style="bold")
        counter = Counter()
        recorder = Recorder()
        views: list[Sink] = [counter, JsonLines(sys.stdout, plan.config) if as_json else TensorRows(console, plan.config)]
        if dump is not None:
            views.append(recorder)
        sinks: list[Sink] = [Filter(lambda e: matches(e.name, only), views)] if only else views
        result = execute(plan, sinks)
        if only and counter.count == 0:
            raise StepperError(f"--only {' '.join(only)} matched no tensor (names look like layers.0.self_attn.k_pe)")
        if dump is not None:
            write_dump(dump, recorder, {"model": plan.config.name, "prompt": json.dumps(result.prompt),
                                        "start_pos": str(spec.start_pos), "generated": json.dumps(result.generated)})
        if not as_json:
            console.print(footer(plan, result, counter.count, dump), style="dim")
    except StepperError as e:
        fail(str(e))
    except BrokenPipeError:
        sys.stderr.close()  # the reader (e.g. `head`) went away: stop quietly
        raise typer.Exit(0) from None


def footer(plan: Plan, result: RunResult, shown: int, dump: Path | None) -> str:
    parts = [f"{shown} tensors"]
    if plan.hidden is None:
        parts.append(f"prompt {list(result.prompt)} at positions {plan.spec.start_pos}..")
    if result.generated:
        parts.append(("generated " if not plan.alone else "decode tokens ") + str(list(result.generated)))
    if dump is not None:
        parts.append(f"dumped to {dump}")
    return " · ".join(parts)


@app.command("synth")
def synth_command(
    out: Annotated[Path, typer.Option(metavar="DIR", help="Directory to create.")],
    model: Annotated[str, typer.Option(metavar="NAME|PATH", help="Preset or config.json to make weights for.")] = "tiny",
    layers: Annotated[str | None, typer.Option(metavar="A:B", help="Write only layers A to B-1 (no embedding, norm or lm_head).")] = None,
    seed: Annotated[int, typer.Option(metavar="S", help="Seed of the synthetic weights.")] = 0,
    force: Annotated[bool, typer.Option("--force", help="Replace DIR if it exists.")] = False,
) -> None:
    """Write synthetic weights as a real HF-layout FP8 checkpoint directory."""
    try:
        source = load_model(model, seed)
        if not isinstance(source, SyntheticWeights):
            raise StepperError(f"--model {model}: synth makes weights for a preset or a config.json, not a checkpoint")
        chosen = parse_layers(layers)
        if chosen is not None:
            chosen = shown_layers(RunSpec(layers=chosen), source.config)
        synth_checkpoint(source, out, chosen, force)
        files = sorted(p.name for p in out.iterdir())
        size = sum(p.stat().st_size for p in out.iterdir())
        print(f"wrote {out}: {len(files)} files, {size / 2**20:.1f} MiB ({', '.join(files[:3])}{', ...' if len(files) > 3 else ''})")
    except StepperError as e:
        fail(str(e))


class Counter:
    """Sink counting the events it sees."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, _event) -> None:
        self.count += 1
