"""The `stepper` command line. Bad input exits with code 2 and one line on stderr."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text
from rich.tree import Tree

from stepper import __version__, catalog
from stepper.cli.common import parse_ids, parse_layers, user_errors
from stepper.errors import StepperError
from stepper.fp8 import BLOCK
from stepper.kernels import parallel
from stepper.lessons import overrides
from stepper.model.cache import cache_bytes_per_token
from stepper.session import (
    Plan,
    RunResult,
    RunSpec,
    check_layer,
    execute,
    load_model,
    prepare,
    shown_layers,
    step_attn,
)
from stepper.trace import Filter, Recorder, Sink, matches
from stepper.views import fp8_codes, inspect
from stepper.views.debugger import BLOCKS, CommandSource, Debugger, Quit, explain_text
from stepper.views.dump import check_writable, write_dump
from stepper.views.sinks import PICTURES, JsonLines, Pictures, ProgressBars, TensorRows
from stepper.weights.names import shape_of, storage_dtype
from stepper.weights.synth import synth_checkpoint
from stepper.weights.synthetic import SyntheticWeights

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    help="Step through a Kimi K2 / DeepSeek-V3 layer and see every named tensor.",
)


def main() -> None:
    """Console entry point: usage errors become one line on stderr and exit code 2."""
    parallel.single_threaded_blas()  # stepper splits the big products across the cores itself
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


# ---------------------------------------------------------------------------------------------
# Options shared by `run` and `step`

ModelOpt = Annotated[str, typer.Option(metavar="NAME|PATH", help="Preset (tiny, tiny-v3, kimi-k2, deepseek-v3), a checkpoint directory or a config.json.")]
LayerOpt = Annotated[int | None, typer.Option(metavar="N", help="Run layer N alone (on --input or the prompt's token embeddings).")]
LayersOpt = Annotated[str | None, typer.Option(metavar="A:B", help="Run the model up to layer B-1, showing layers A to B-1.")]
IdsOpt = Annotated[str | None, typer.Option(metavar="1,2,3", help="Prompt token ids, comma-separated.")]
PromptLenOpt = Annotated[int | None, typer.Option(metavar="T", help="Number of prompt tokens drawn from the seed [default: 7].")]
StartPosOpt = Annotated[int, typer.Option(metavar="P", help="Position of the first prompt token (empty cache).")]
DecodeOpt = Annotated[int, typer.Option(metavar="N", help="Decode steps after the prefill, with the cache (greedy tokens).")]
SeedOpt = Annotated[int, typer.Option(metavar="S", help="Seed of the synthetic weights and prompt.")]
InputOpt = Annotated[Path | None, typer.Option("--input", metavar="FILE", help="Residual stream for --layer N: a safetensors file (e.g. a --dump).")]
AttnOpt = Annotated[str, typer.Option(metavar="PATH", help="Attention: naive (per-head keys and values), absorb (over the latent cache), or auto (naive prefill, absorbed decode).")]
PlainOpt = Annotated[bool, typer.Option("--plain", help="No colour.")]
CacheOpt = Annotated[int, typer.Option(metavar="MB", help="Keep up to MB megabytes of decoded weights between decode steps.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Overwrite an existing output file.")]
UseOpt = Annotated[list[Path] | None, typer.Option("--use", metavar="FILE.py", help="Run with your own exercise functions (e.g. a lesson file) in place of stepper's; repeatable.")]


def run_spec(model, layer, layers, ids, prompt_len, start_pos, decode, seed, input_file, attn, cache_mb) -> RunSpec:
    if ids is not None and prompt_len is not None:
        raise StepperError("give --ids or --prompt-len, not both")
    if layer is not None and layers is not None:
        raise StepperError("give --layer or --layers, not both")
    return RunSpec(
        model=model, layer=layer, layers=parse_layers(layers), ids=parse_ids(ids),
        prompt_len=7 if prompt_len is None else prompt_len, start_pos=start_pos, decode=decode, seed=seed,
        input=input_file, attn=attn, weight_cache_mb=cache_mb,
    )


def describe(plan: Plan) -> str:
    """Two lines saying what is about to run, and what attention caches per position."""
    cfg, spec = plan.config, plan.spec
    dense = sum(not cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
    moe = f", {cfg.n_routed_experts} experts top-{cfg.num_experts_per_tok}" if dense < cfg.num_hidden_layers else ""
    weights = f"synthetic weights, seed {spec.seed}" if isinstance(plan.weights, SyntheticWeights) else f"weights from {spec.model}"
    what = f"layer {spec.layer} alone on {plan.input_source}" if plan.alone else f"layers {plan.shown.start}..{plan.shown.stop - 1}"
    steps = f", then {spec.decode} decode step{'s' if spec.decode > 1 else ''}" if spec.decode else ""
    paths = sorted({step_attn(spec, step) for step in range(spec.decode + 1)}, reverse=True)
    attn = " then ".join(f"{p}" for p in paths)
    naive, latent = cache_bytes_per_token(cfg, "naive"), cache_bytes_per_token(cfg, "absorb")
    return (
        f"model {cfg.name} ({cfg.model_type}): {cfg.num_hidden_layers} layers ({dense} dense), "
        f"{cfg.num_attention_heads} heads{moe} · {weights} · {what}{steps}\n"
        f"attention {attn} · cache per position per layer (float32): per-head keys and values "
        f"{naive:,} B, latent + rope key {latent:,} B ({naive / latent:.1f}x smaller)"
    )


def footer(plan: Plan, result: RunResult, shown: int, dump: Path | None) -> str:
    parts = [f"{shown} tensors"]
    if plan.hidden is None:
        parts.append(f"prompt {token_ids(result.prompt)} at positions {plan.spec.start_pos}..")
    if result.generated:
        parts.append(("generated " if not plan.alone else "decode tokens ") + token_ids(result.generated))
    if dump is not None:
        parts.append(f"dumped to {dump}")
    return " · ".join(parts)


def token_ids(ids, shown: int = 16) -> str:
    """Token ids as a list, a long one cut to its first and last few with its length, so that a
    512-token prompt does not fill the screen."""
    ids = [int(i) for i in ids]
    if len(ids) <= shown:
        return str(ids)
    head, tail = ids[: shown * 3 // 4], ids[-(shown // 4) :]
    return f"[{', '.join(map(str, head))}, … {', '.join(map(str, tail))}] ({len(ids)} tokens)"


def parse_show(show: str | None) -> set[str]:
    kinds = {k.strip() for k in (show or "").split(",") if k.strip()}
    unknown = kinds - set(PICTURES)
    if unknown:
        raise StepperError(f"--show {show}: unknown picture {min(unknown)!r}; choose from {', '.join(PICTURES)}")
    return kinds


class Counter:
    """Sink counting the events it sees."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, _event) -> None:
        self.count += 1


# ---------------------------------------------------------------------------------------------
# run


@app.command("run")
def run_command(
    model: ModelOpt = "tiny",
    layer: LayerOpt = None,
    layers: LayersOpt = None,
    ids: IdsOpt = None,
    prompt_len: PromptLenOpt = None,
    start_pos: StartPosOpt = 0,
    decode: DecodeOpt = 0,
    seed: SeedOpt = 0,
    input_file: InputOpt = None,
    attn: AttnOpt = "auto",
    weight_cache_mb: CacheOpt = 0,
    only: Annotated[list[str] | None, typer.Option(metavar="GLOB", help="Show (and dump) only names matching GLOB, e.g. '*k_pe*'; repeatable.")] = None,
    show: Annotated[str | None, typer.Option(metavar="PICTURES", help=f"Draw pictures after their tensors: {','.join(PICTURES)}.")] = None,
    plain: PlainOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per tensor (JSON Lines) on stdout.")] = False,
    dump: Annotated[Path | None, typer.Option(metavar="FILE", help="Write every shown tensor to FILE.safetensors.")] = None,
    force: ForceOpt = False,
    use: UseOpt = None,
) -> None:
    """Run the model on a prompt and print every named tensor in execution order."""
    with user_errors():
        spec = run_spec(model, layer, layers, ids, prompt_len, start_pos, decode, seed, input_file, attn, weight_cache_mb)
        pictures = parse_show(show)
        if dump is not None:
            check_writable(dump, force)
        plan = prepare(spec)
        console = Console(no_color=plain, highlight=False, markup=False, soft_wrap=True)
        if not as_json:
            console.print(describe(plan), style="bold")
        counter, recorder = Counter(), Recorder()
        views: list[Sink] = [counter, JsonLines(sys.stdout, plan.config) if as_json else TensorRows(console, plan.config)]
        if pictures:
            views.append(Pictures(console, plan.config, pictures, plan.weights))
        if dump is not None:
            views.append(recorder)
        sinks: list[Sink] = [Filter(lambda e: matches(e.name, only), views)] if only else views
        sinks.append(ProgressBars(Console(stderr=True)))
        with overrides.use(use or [], announce=sys.stderr):
            result = execute(plan, sinks)
        if only and counter.count == 0:
            raise StepperError(f"--only {' '.join(only)} matched no tensor (names look like layers.0.self_attn.k_pe)")
        if dump is not None:
            write_dump(dump, recorder, {"model": plan.config.name, "prompt": json.dumps(result.prompt),
                                        "start_pos": str(spec.start_pos), "generated": json.dumps(result.generated)})
        if not as_json:
            console.print(footer(plan, result, counter.count, dump), style="dim")


# ---------------------------------------------------------------------------------------------
# step

EXPORTS = (".html", ".svg", ".txt")


@app.command("step")
def step_command(
    model: ModelOpt = "tiny",
    layer: LayerOpt = None,
    layers: LayersOpt = None,
    ids: IdsOpt = None,
    prompt_len: PromptLenOpt = None,
    start_pos: StartPosOpt = 0,
    decode: DecodeOpt = 0,
    seed: SeedOpt = 0,
    input_file: InputOpt = None,
    attn: AttnOpt = "auto",
    weight_cache_mb: CacheOpt = 0,
    breaks: Annotated[list[str] | None, typer.Option("--break", metavar="GLOB", help="Stop at tensors matching GLOB (e.g. compressed_kv); repeatable.")] = None,
    until: Annotated[str | None, typer.Option(metavar="NAME", help="Run until the first tensor matching NAME and stop there.")] = None,
    commands: Annotated[Path | None, typer.Option(metavar="FILE", help="Read debugger commands from FILE first, one per line.")] = None,
    plain: PlainOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="Write each tensor the debugger stops at as a JSON line on stdout (the session goes to stderr).")] = False,
    export: Annotated[Path | None, typer.Option(metavar="FILE", help="Record the session to FILE.html, FILE.svg or FILE.txt.")] = None,
    force: ForceOpt = False,
    use: UseOpt = None,
) -> None:
    """Step through the run one named tensor at a time, like a debugger.

    At each stop: Enter or n next, c continue, b GLOB break, d delete, u NAME until,
    p NAME[slice] print, e explain, w where, x A B compare, h history, s show PICTURE, q quit, ? help.
    Commands are read from the terminal, or line by line from a pipe.
    """
    with user_errors():
        spec = run_spec(model, layer, layers, ids, prompt_len, start_pos, decode, seed, input_file, attn, weight_cache_mb)
        if export is not None:
            check_export(export, force)
        script = read_commands(commands) if commands is not None else None
        plan = prepare(spec)
        console = Console(no_color=plain, highlight=False, markup=False, soft_wrap=True, record=export is not None,
                          stderr=as_json)
        console.print(describe(plan), style="bold")
        interactive = sys.stdin.isatty() and console.is_terminal
        source = CommandSource(console, sys.stdin, interactive, script)
        on_stop = JsonLines(sys.stdout, plan.config) if as_json else None
        debugger = Debugger(console, plan.config, source, plan.weights, list(breaks or []), until, on_stop)
        try:
            with overrides.use(use or [], announce=sys.stderr):
                result = execute(plan, [debugger, ProgressBars(Console(stderr=True))])
            console.print(footer(plan, result, len(debugger.history), None), style="dim")
        except Quit:
            console.print(f"quit after {len(debugger.history)} tensors", style="dim")
        if export is not None:
            save_export(console, export)


def read_commands(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise StepperError(f"--commands {path}: cannot read it ({e})") from None


def check_export(path: Path, force: bool) -> None:
    if path.suffix not in EXPORTS:
        raise StepperError(f"--export {path}: the file name must end in {', '.join(EXPORTS)}")
    if path.exists() and not force:
        raise StepperError(f"--export {path}: file exists; pass --force to overwrite it")
    if not path.parent.is_dir():
        raise StepperError(f"--export {path}: folder {path.parent} does not exist")


def save_export(console: Console, path: Path) -> None:
    if path.suffix == ".html":
        console.save_html(str(path))
    elif path.suffix == ".svg":
        console.save_svg(str(path), title="stepper step")
    else:
        console.save_text(str(path))
    sys.stderr.write(f"session recorded to {path}\n")


# ---------------------------------------------------------------------------------------------
# explain, tree


@app.command("explain")
def explain_command(
    name: Annotated[str, typer.Argument(metavar="NAME", help="A tensor name (layers.1.self_attn.k_pe, k_pe), a glob ('*gate*') or another implementation's name (kv_cmpr, model.layers.1.self_attn.kv_a_proj_with_mqa).", show_default=False)],
    model: ModelOpt = "tiny",
    plain: PlainOpt = False,
) -> None:
    """The catalogue entry of a tensor: what it is, its formula and shape, the reference lines."""
    with user_errors():
        cfg = load_model(model, 0).config
        cat = catalog.load()
        entries = cat.find(name)
        if not entries:
            raise StepperError(f"no tensor named '{name}' in the catalogue (stepper tree lists them)")
        console = Console(no_color=plain, highlight=False, markup=False, soft_wrap=True)
        for entry in entries:
            console.print(explain_text(cat, entry, cfg))
            console.print()


@app.command("tree")
def tree_command(
    model: ModelOpt = "tiny",
    layer: Annotated[int | None, typer.Option(metavar="N", help="Only layer N's kind (dense or MoE).")] = None,
    attn: Annotated[str, typer.Option(metavar="PATH", help="naive or absorb: which attention tensors to list.")] = "naive",
    plain: PlainOpt = False,
) -> None:
    """The structure of a layer: every named tensor in order, its shape for this model, what it is."""
    with user_errors():
        cfg = load_model(model, 0).config
        if attn not in ("naive", "absorb"):
            raise StepperError(f"--attn must be naive or absorb, got '{attn}'")
        if layer is not None:
            check_layer(layer, cfg)
        console = Console(no_color=plain, highlight=False, markup=False)
        kinds = {cfg.is_moe_layer(i): i for i in range(cfg.num_hidden_layers)}
        layers = [layer] if layer is not None else sorted(kinds.values())
        for i in layers:
            console.print(layer_tree(catalog.load(), cfg, i, attn))


def layer_tree(cat: catalog.Catalog, cfg, layer: int, attn: str) -> Tree:
    kind = "MoE" if cfg.is_moe_layer(layer) else "dense"
    same = [i for i in range(cfg.num_hidden_layers) if cfg.is_moe_layer(i) == cfg.is_moe_layer(layer)]
    span = f"layers {same[0]}..{same[-1]}" if len(same) > 1 else f"layer {same[0]}"
    root = Tree(Text(f"{cfg.name}: {span} ({kind}), {attn} attention", style="bold"))
    branch, current = root, None
    for entry in cat.layer_sequence(cfg, layer, attn):
        block = BLOCKS.get(entry["block"], entry["block"])
        if block != current:  # consecutive tensors of one block share a branch, in execution order
            branch, current = root.add(Text(block, style="magenta")), block
        dims = ", ".join(d if (size := cat.expected_size(d, cfg)) is None else f"{size} {cat.raw['dims'][d]['label']}"
                         for d in entry["dims"])
        row = Text(entry["name"], style="bold cyan")
        row.append(f"  [{dims}]", style="yellow")
        row.append(f"  {entry['description']}")
        branch.add(row)
    return root


# ---------------------------------------------------------------------------------------------
# bench


@app.command("bench")
def bench_command(
    workdir: Annotated[Path | None, typer.Option(metavar="DIR", help="Where the synthetic full-size checkpoints are written once and reused (about 20 GB) [default: ~/.cache/stepper/bench].")] = None,
    torch: Annotated[bool, typer.Option("--torch/--no-torch", help="Also compare with transformers' DeepseekV3 on a 16-expert layer (needs the crosscheck extra): the two run in turn, and each figure is the median of the paired ratios.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="The figures as JSON on stdout.")] = False,
) -> None:
    """Measure full-size Kimi K2 layers (decode, prefill, peak memory) and the machine's ceilings.

    The first run writes about 20 GB of synthetic checkpoints into the work directory (several
    minutes); later runs reuse them and take 3-6 minutes, reading them back from disk
    included. Each checkpoint is first dropped from the page cache and read back as stepper
    reads it, so that every run finds it cached the same way whatever read it before, and each
    layer scenario reads its checkpoint through before it is timed (24 GB of RAM is enough for
    the 17 GB MoE layer): the figures measure compute, not the disk."""
    from stepper import bench

    with user_errors():
        console = Console(stderr=as_json, highlight=False, markup=False)
        workdir = workdir or Path.home() / ".cache" / "stepper" / "bench"
        figures = bench.run_all(workdir, torch and has_torch(), lambda line: console.print(f"· {line}", style="dim"))
        if as_json:
            print(json.dumps({"machine": bench.machine(), "figures": [f.__dict__ for f in figures]}, indent=1))
            return
        console.print(f"machine: {bench.machine()}")
        for f in figures:
            rss = f"  peak RSS {f.peak_rss_mb:,.0f} MB" if f.peak_rss_mb else ""
            console.print(f"{f.name}: {f.value:.3g} {f.unit}{rss}  {f.note}")


def has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None and importlib.util.find_spec("transformers") is not None


# ---------------------------------------------------------------------------------------------
# synth, inspect, fp8


@app.command("synth")
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
        print(f"wrote {out}: {len(files)} files, {size / 2**20:.1f} MiB ({', '.join(files[:3])}{', ...' if len(files) > 3 else ''})")


@app.command("inspect")
def inspect_command(
    path: Annotated[Path, typer.Argument(metavar="PATH", help="A .safetensors file or a checkpoint directory.", show_default=False)],
    stats: Annotated[bool, typer.Option("--stats", help="Decode every tensor (FP8 with its scales) and add min, max, mean, std, absmax, NaN and Inf counts.")] = False,
    only: Annotated[list[str] | None, typer.Option(metavar="GLOB", help="List only tensors whose name (or scale's name) matches GLOB, e.g. '*layers.1.*'; repeatable.")] = None,
    experts: Annotated[bool, typer.Option("--experts", help="One row per routed expert instead of one row per projection of all experts.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per tensor (JSON Lines, experts never folded) on stdout.")] = False,
    plain: Annotated[bool, typer.Option("--plain", help="No colour.")] = False,
) -> None:
    """List a checkpoint's tensors, layer by layer.

    PATH is a checkpoint directory (config.json, index, shards) or one .safetensors file. Each row
    shows a tensor's dtype, shape, FP8 scale grid (the weight_scale_inv shape), size and shard; a
    layer's routed experts share one row per projection unless --experts.
    """
    with user_errors():
        source = inspect.open_source(path)
        tensors = inspect.collect(source, only)
        if only and not tensors:
            raise StepperError(f"--only {' '.join(only)} matched no tensor (names look like model.layers.1.self_attn.o_proj.weight)")
        if stats:
            tensors = inspect.with_stats(source, tensors, progress=sys.stderr.isatty(), plain=plain)
        groups = inspect.group(tensors, source.config, fold_experts=not experts and not as_json)
        if as_json:
            inspect.write_json(sys.stdout, groups)
        else:
            console = Console(no_color=plain, highlight=False, soft_wrap=True)
            inspect.render(console, source, groups, tensors, inspect.total_tensors(source), stats)


@app.command("fp8")
def fp8_command(
    code: Annotated[str | None, typer.Argument(metavar="CODE", help="One byte to take apart: 0xCD, 205 or 0b11001101.", show_default=False)] = None,
    weight: Annotated[str | None, typer.Option(metavar="NAME", help="Show one block of this FP8 weight, e.g. model.layers.1.self_attn.kv_a_proj_with_mqa.weight.")] = None,
    model: Annotated[str | None, typer.Option(metavar="NAME|DIR", help="With --weight: a preset (synthetic weights) or a checkpoint directory [default: tiny].")] = None,
    block: Annotated[str | None, typer.Option(metavar="R,C", help="With --weight: the block's row and column in the weight's scale grid [default: 0,0].")] = None,
    seed: Annotated[int | None, typer.Option(metavar="S", help="With --weight and a preset: seed of the synthetic weights [default: 0].")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout: the 256 codes, the byte, or the block.")] = False,
    plain: Annotated[bool, typer.Option("--plain", help="No colour.")] = False,
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
            shown = fp8_block(weight, model or "tiny", fp8_codes.parse_block(block or "0,0"), seed or 0)
            if as_json:
                print(json.dumps(fp8_codes.block_record(shown), allow_nan=False))
            else:
                fp8_codes.render_block(console, shown)
        elif code is not None:
            byte = fp8_codes.parse_code(code)
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


from stepper.cli.fixtures import fixtures_app

app.add_typer(fixtures_app, name="fixtures")


from stepper.cli.lessons import lesson_app

app.add_typer(lesson_app, name="lesson")
