"""`stepper run` and `stepper step`: a run shown tensor by tensor, all at once or in the debugger."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import CONSOLE_HTML_FORMAT, Console

from stepper import untrusted
from stepper.cli import output
from stepper.cli.common import ModelOpt, PlainOpt, SeedOpt, note, one_prompt, parse_ids, parse_layers, user_errors
from stepper.cli.names import check_pictures, only_filter
from stepper.errors import StepperError
from stepper.files import check_output, write_output
from stepper.fixtures.implementation_names import explained
from stepper.lessons import overrides
from stepper.model.cache import cache_bytes_per_token
from stepper.planning import RunPlan, plan_run
from stepper.planning.memory import sizes, tiled_values, two_paths
from stepper.seams.first_nan import FirstNaN
from stepper.seams.patching import parse_patch
from stepper.seams.trace import Filter, Recorder, Sink
from stepper.session import Plan, RunResult, RunSpec, step_attn
from stepper.text import INSTALL, Tokens
from stepper.untrusted.paths import regular_file, why
from stepper.views.debugger import CommandSource, Debugger, Quit
from stepper.views.dump import DUMP_LIMIT_GB, check_dump_sizes, check_writable, dump_limit, write_dump
from stepper.views.family_pictures import drawn_pictures, every_picture, picture_sink, pictures_of
from stepper.views.sinks import JsonLines, ProgressBars, TensorRows, print_wrapped, styles
from stepper.views.summary import token_ids

# Options of both commands
LayerOpt = Annotated[int | None, typer.Option(metavar="N", min=0,
                                              help="Run layer N alone (on --input or the prompt's token embeddings).")]
LayersOpt = Annotated[str | None, typer.Option(metavar="A:B",
                                               help="Run the model up to layer B-1, showing layers A to B-1.")]
IdsOpt = Annotated[str | None, typer.Option(metavar="1,2,3", help="Prompt token ids, comma-separated.")]
PromptOpt = Annotated[str | None, typer.Option("--prompt", metavar="TEXT",
                                               help="The prompt as text, tokenized by the checkpoint's "
                                                    f"tokenizer.json or tiktoken.model (needs: {INSTALL}).")]
PromptLenOpt = Annotated[int | None, typer.Option(metavar="T", min=1, show_default="7",
                                                  help="Number of prompt tokens drawn from the seed.")]
StartPosOpt = Annotated[int, typer.Option(metavar="P", min=0, help="Position of the first prompt token (empty cache).")]
DecodeOpt = Annotated[int, typer.Option(metavar="N", min=0,
                                        help="Decode steps after the prefill, with the cache (greedy tokens; with "
                                             "--layer, drawn from the seed).")]
InputOpt = Annotated[Path | None, typer.Option("--input", metavar="FILE",
                                               help="Residual stream for --layer N: a safetensors file (e.g. a "
                                                    "--dump).")]
AttnOpt = Annotated[str, typer.Option(metavar="naive|absorb|auto",
    help="Attention: naive (per-head keys and values), absorb (over the latent cache), or auto (naive prefill and "
         "absorbed decode where the estimate is at most half the memory available, else absorbed, as for a prefill "
         "over a longer --cache-len cache; the run says which and why).")]
CacheLenOpt = Annotated[int, typer.Option(metavar="N",
    help="With --layer: start that layer's cache with N synthetic positions (seeded, with the statistics of real "
         "latents); the prompt follows them.")]
IndexScoringOpt = Annotated[str, typer.Option("--index-scoring", metavar="exact|fp8",
    help="DeepSeek-V3.2's Lightning Indexer: exact (float32 scores, as transformers) or fp8 (Hadamard-rotated q and k "
         "in FP8 e4m3, as DeepSeek's inference code; the run also says how many of the exactly chosen positions it "
         "kept).")]
ChunkOpt = Annotated[str | None, typer.Option(metavar="N|auto",
    help="Run the prefill N positions at a time, the cache carrying the earlier ones (each tensor is still shown once, "
         "whole, over every position, its figures gathered as each chunk runs); 0: the whole prompt "
         "at once; auto: in chunks only where the whole prompt would not fit in memory (the run says so).  [default: "
         "auto]")]
CacheOpt = Annotated[int, typer.Option(metavar="MB", min=0,
                                       help="Keep up to MB megabytes of decoded weights between decode steps.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace an existing output file if stepper wrote it.")]
UseOpt = Annotated[list[Path] | None, typer.Option("--use", metavar="FILE.py",
                                                   help="Run with your own exercise functions (e.g. a lesson file) in "
                                                        "place of stepper's; repeatable.")]
PatchOpt = Annotated[list[str] | None, typer.Option("--patch", metavar="NAME=EXPR",
                                                    help="Continue from NAME with EXPR of its tensor x: 0, x*0.5, "
                                                         "x+1e-3, x[..., 7]=0; repeatable.")]


def run_spec(model, layer, layers, ids, prompt_len, start_pos, decode, seed, input_file, attn, cache_mb,
             prompt=None, cache_len: int = 0, index_scoring: str = "exact") -> RunSpec:
    one_prompt(prompt, ids, prompt_len)
    if layer is not None and layers is not None:
        raise StepperError("give --layer or --layers, not both")
    return RunSpec(
        model=model, layer=layer, layers=parse_layers(layers), ids=parse_ids(ids),
        prompt_len=7 if prompt_len is None else prompt_len, start_pos=start_pos, decode=decode, seed=seed,
        input=input_file, attn=attn, weight_cache_mb=cache_mb, prompt=prompt, cache_len=cache_len,
        index_scoring=index_scoring,
    )


def describe(plan: Plan) -> str:
    """Two lines saying what is about to run, and what attention caches per position (a config
    class with a `summary()` and a `cache_line(layers)` says its own: DeepSeek-V4's)."""
    cfg, spec = plan.config, plan.spec
    dense = sum(not cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
    zero = f" + {cfg.zero_experts} zero" if getattr(cfg, "zero_experts", 0) else ""  # LongCat's identity experts
    experts = f", {cfg.n_routed_experts}{zero} experts top-{cfg.num_experts_per_tok}"
    moe = experts if dense < cfg.num_hidden_layers else ""
    layers = (cfg.summary() if hasattr(cfg, "summary")
              else f"{cfg.num_hidden_layers} layers ({dense} dense), {cfg.num_attention_heads} heads{moe}")
    weights = (f"synthetic weights, seed {spec.seed}" if plan.synthetic
               else f"weights from {untrusted.shown(spec.model)}")
    what = (f"layer {spec.layer} alone on {untrusted.shown(plan.input_source)}" if plan.alone
            else f"layers {plan.layers_shown.start}..{plan.layers_shown.stop - 1}")
    if plan.alone and spec.input and not (spec.ids or spec.prompt) and getattr(cfg, "is_hash_layer", None) \
            and cfg.is_hash_layer(spec.layer):  # DeepSeek-V4: a hash layer's experts follow the token ids
        what += ", its hash routing on token ids drawn from the seed (--ids gives the tokens of those streams)"
    steps = f", then {spec.decode} decode step{'s' if spec.decode > 1 else ''}" if spec.decode else ""
    if steps and plan.alone:
        steps += " on tokens drawn from the seed (a layer alone has no logits to choose them)"
    if spec.cache_len:
        steps += f", after a synthetic cache of {spec.cache_len:,} positions (seed {spec.seed})"
    wrapper = f"\n{untrusted.shown(cfg.wrapper.describe())}" if getattr(cfg, "wrapper", None) is not None else ""
    wrapper += f"\n{prompt_line(plan.tokens)}" if plan.tokens is not None else ""
    first = (f"model {untrusted.shown(cfg.name)} ({untrusted.shown(cfg.model_type)}): {layers} · {weights} · "
             f"{what}{steps}")
    if hasattr(cfg, "cache_line"):
        return f"{first}\n{cfg.cache_line(plan.layers_shown)}{wrapper}"
    attns = sorted({step_attn(spec, step) for step in range(spec.decode + 1)}, reverse=True)
    attn = " then ".join(attns)
    if spec.index_scoring == "fp8":
        attn += ", chosen by FP8 index scores (Hadamard-rotated, e4m3, as DeepSeek's inference code)"
    naive, latent = (cache_bytes_per_token(cfg, path, index_scoring=spec.index_scoring) for path in ("naive", "absorb"))
    keys = "" if not cfg.has_indexer else " + index key" + (" and its FP8 codes" if spec.index_scoring == "fp8" else "")
    if hasattr(cfg, "memory_line"):  # a family whose layers keep something else (Kimi Linear's KDA state)
        wrapper += "\n" + cfg.memory_line(spec.cache_len + len(plan.prompt) + spec.decode)
    if not two_paths(plan):  # a Kimi Linear KDA layer alone: no attention path, no per-head keys to cache
        return f"{first}{wrapper}"
    return (
        f"{first}\n"
        f"attention {attn} · cache per position per layer (float32): per-head keys and values "
        f"{naive:,} B, latent + {'rope ' if cfg.rotary else ''}key{keys} {latent:,} B ({naive / latent:.1f}x "
        f"smaller){wrapper}"
    )


def patched_line(patch: list[str] | None) -> str | None:
    """The header's line naming the --patch options: the run is not the model's own from there on."""
    if not patch:
        return None
    listed = " · ".join(untrusted.shown(p) for p in patch)
    return f"patched: {listed} (rows marked patched show the new values; the run goes on from them)"


def prompt_line(tokens: Tokens) -> str:
    """The text prompt's tokens, each id with its text (a long prompt cut like token_ids)."""
    pairs = [f"{i} {text}" for i, text in zip(tokens.ids, tokens.labels())]
    shown = pairs if len(pairs) <= 16 else [*pairs[:12], "…", *pairs[-4:]]
    tokenizer = untrusted.shown(tokens.tokenizer.file.name)
    return f"prompt: {len(pairs)} token{'s' if len(pairs) != 1 else ''} from {tokenizer}: {' · '.join(shown)}"


def print_header(console: Console, plan: Plan, patch: list[str] | None, said: Sequence[str]) -> None:
    """The run described (bold), then the --patch line and what planning the run said (dim)."""
    print_lines(console, describe(plan), "bold")
    for line in (patched_line(patch), *said):
        if line:
            print_lines(console, line, "dim")


def print_lines(console: Console, text: str, style: str) -> None:
    """Lines of prose, each wrapped at word boundaries on a terminal."""
    for line in text.splitlines():
        print_wrapped(console, line, style=style)


def footer(plan: Plan, result: RunResult, shown: int, dump: Path | None,
           agreement: IndexAgreement | None = None) -> str:
    parts = [f"{shown} tensor{'s' if shown != 1 else ''}"]
    if plan.hidden is None:
        first = plan.spec.start_pos + plan.spec.cache_len
        last = first + len(result.prompt) - 1
        parts.append(f"prompt {token_ids(result.prompt)} at "
                     f"position{f's {first}..{last}' if last > first else f' {first}'}")
    if result.generated:
        parts.append(("generated " if not plan.alone else "decode tokens ") + token_ids(result.generated))
        if plan.tokens is not None:
            parts[-1] += f" {untrusted.shown(repr(plan.tokens.tokenizer.decode(result.generated)))}"
    if dump is not None:
        parts.append(f"dumped to {untrusted.shown(dump)}")
    if hasattr(plan.weights, "transfer"):  # a remote checkpoint
        parts.append(plan.weights.note())
    if agreement is not None and agreement.queries:
        parts.append(agreement.summary())
    return " · ".join(parts)


def parse_show(show: str | None, choices: tuple[str, ...] = every_picture(), cfg=None) -> set[str]:
    """The pictures asked, each one of `choices` (a model's family's, with its config `cfg`: the
    refusal then names only those this model can draw)."""
    kinds = {k.strip() for k in (show or "").split(",") if k.strip()}
    unknown = kinds - set(choices)
    if elsewhere := unknown & set(every_picture()):  # a picture of another family's tensors
        drawn = choices if cfg is None else drawn_pictures(cfg)
        raise StepperError(f"--show {untrusted.shown(show)}: {min(elsewhere)} is not drawn for this model; its "
                           f"pictures are {', '.join(drawn)}")
    if unknown:
        raise StepperError(f"--show {untrusted.shown(show)}: unknown picture {untrusted.shown(min(unknown))!r}; "
                           f"choose from {', '.join(choices)}")
    return kinds


LONG_VALUES = 10**9  # tiled attention values past which a run says its statistics take a while


class IndexAgreement:
    """Sink adding up, over the run, how many of the positions the exact index scores choose the
    FP8 scores kept (self_attn.indexer.kept_of_exact against exact_topk_idx)."""

    def __init__(self) -> None:
        self.kept = self.chosen = self.queries = self.differing = 0
        self.exact: np.ndarray | None = None  # [B, T]: the last exact_topk_idx's chosen count per query

    def wants(self, event) -> bool:
        return event.key in ("self_attn.indexer.exact_topk_idx", "self_attn.indexer.kept_of_exact")

    def __call__(self, event) -> None:
        if event.key == "self_attn.indexer.exact_topk_idx":
            self.exact = np.count_nonzero(np.asarray(event.array) >= 0, axis=-1)
        elif event.key == "self_attn.indexer.kept_of_exact" and self.exact is not None:
            kept = np.asarray(event.array)
            self.kept, self.chosen = self.kept + int(kept.sum()), self.chosen + int(self.exact.sum())
            self.queries += kept.size
            self.differing += int(np.count_nonzero(kept < self.exact))

    def summary(self) -> str:
        share = f" ({100 * self.kept / self.chosen:.1f}%)" if self.chosen else ""
        return (f"fp8 index scoring kept {self.kept:,} of the {self.chosen:,} positions the exact scores keep{share}; "
                f"{self.differing:,} of {self.queries:,} queries (all layers and steps) chose differently")


class TensorCount:
    """Sink counting the tensors it sees."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, _event) -> None:
        self.count += 1


def run_command(
    model: ModelOpt = "tiny",
    layer: LayerOpt = None,
    layers: LayersOpt = None,
    ids: IdsOpt = None,
    prompt: PromptOpt = None,
    prompt_len: PromptLenOpt = None,
    start_pos: StartPosOpt = 0,
    decode: DecodeOpt = 0,
    seed: SeedOpt = 0,
    input_file: InputOpt = None,
    attn: AttnOpt = "auto",
    weight_cache_mb: CacheOpt = 0,
    cache_len: CacheLenOpt = 0,
    index_scoring: IndexScoringOpt = "exact",
    chunk: ChunkOpt = None,
    only: Annotated[list[str] | None, typer.Option(metavar="GLOB",
                                                   help="Show (and dump) only names matching GLOB, e.g. '*k_pe*'; "
                                                        "repeatable.")] = None,
    show: Annotated[str | None, typer.Option(
        metavar="PICTURES", help=f"Draw pictures after their tensors: {','.join(every_picture())} (each "
                                 "model draws its family's: MLA's attention,routing,hist,scales; DeepSeek-V4's "
                                 "hc,reach,routing,hist; Kimi Linear's adds state; routing where it has a router, "
                                 "scales where its weights are FP8).")] = None,
    plain: PlainOpt = False,
    as_json: Annotated[bool, typer.Option(
        "--json", help="One JSON object per tensor (JSON Lines) on stdout; --show's pictures and the run's notes "
                  "(a long run, say) on stderr.")] = False,
    dump: Annotated[Path | None, typer.Option(
        metavar="FILE.safetensors",
        help="Write every shown tensor to this file (its name ends in .safetensors).")] = None,
    dump_limit_gb: Annotated[float | None, typer.Option(
        metavar="GiB", show_default=f"{DUMP_LIMIT_GB:g}",
        help="Refuse a --dump with a tensor larger than this many GiB (2**30 bytes).")] = None,
    force: ForceOpt = False,
    use: UseOpt = None,
    patch: PatchOpt = None,
) -> None:
    """Run the model on a prompt and print every named tensor in execution order."""
    with user_errors(), ExitStack() as swapped:
        spec = run_spec(model, layer, layers, ids, prompt_len, start_pos, decode, seed, input_file, attn,
                        weight_cache_mb, prompt, cache_len, index_scoring)
        pictures = parse_show(show)
        asked = parse_chunk(chunk, bool(patch), bool(pictures))
        limit_gb = dump_limit(dump_limit_gb)
        if dump is not None:
            check_writable(dump, force)
            output.finish_files_when_the_reader_goes()
        planned, patcher, keep = checked_plan(spec, only or [], show, pictures, dump is not None, limit_gb, asked,
                                              patch)
        plan = planned.plan
        swapped.enter_context(overrides.use(use or [], announce=sys.stderr))  # a file that fails to load stops it here
        # with --json, stdout holds JSON Lines alone: the pictures (--show) go to stderr
        console = Console(stderr=as_json, **styles(plain), highlight=False, markup=False, soft_wrap=True)
        if not as_json:
            print_header(console, plan, patch, planned.said)
            long = tiled_values(plan, [n for n in planned.names if keep(n)])
            if long > LONG_VALUES:
                print_lines(console, f"note: the attention scores and weights shown hold {long:.2g} values, summarised "
                            "a tile at a time: their exact statistics take a while (--only can leave them out)", "dim")
        else:  # stdout holds the JSON Lines alone: the plan's notes (a long run, tensors no layer reads) go to stderr
            for line in planned.said:
                if line.startswith("note: "):
                    note(line)  # escaped as the header prints it
        shown = Shown(console, plan, keep, bool(only), as_json, plain)
        try:
            result = planned.execute(patcher + shown.sinks(pictures, dump is not None))
        finally:
            shown.bars.hide()
        if shown.nan.warning():
            note(f"warning: {shown.nan.warning()}")
        if dump is not None:
            write_dump(dump, shown.recorder, {"model": plan.config.name, "prompt": json.dumps(result.prompt),
                                              "start_pos": str(spec.start_pos),
                                              "generated": json.dumps(result.generated)}, force)
        if not as_json:
            print_lines(console, footer(plan, result, shown.counter.count, dump, shown.agreement), "dim")


IsShown = Callable[[str], bool]  # whether a tensor of this name is shown (--only)


def checked_plan(spec: RunSpec, only: list[str], show: str | None, pictures: set[str], dumping: bool,
                 limit_gb: float, asked: int | None, patch: list[str] | None) -> tuple[RunPlan, list[Sink], IsShown]:
    """The run planned with everything the user asked for checked before any work: --only's
    patterns, --show's pictures for this model's family, --patch, and a --dump's sizes. Returns the
    planned run, the patching sinks and which names are shown."""

    def shown_of(plan: Plan, names: list[str]) -> list[str]:
        keep = only_filter(only, names, lambda _: None)
        return [n for n in names if keep(n)]

    def kept_by(plan: Plan, names: list[str]) -> list[str]:
        return shown_of(plan, names) if dumping else []

    # the rows look at what --only shows; the pictures at every tensor
    planned = plan_run(spec, kept_by, "--only", asked, looked=None if pictures else shown_of)
    plan, names = planned.plan, planned.names
    parse_show(show, pictures_of(plan.config), plan.config)  # the pictures of this model's family
    planned.check("--only", only)
    patcher = patch_sink(patch, planned)
    keep = only_filter(only, names, note)
    check_pictures(pictures, [n for n in names if keep(n)], plan.config)
    kept = [n for n in names if keep(n)] if dumping else []
    check_dump_sizes(sizes(plan, kept), limit_gb)
    planned.check_fits(kept, "--only")
    return planned, patcher, keep


class Shown:
    """What a run shows, counts and records of its tensors: the rows (or JSON Lines), the pictures,
    the progress bars, the first NaN, the indexer's agreement and a --dump's recorder."""

    def __init__(self, console: Console, plan: Plan, keep: IsShown, filtered: bool, as_json: bool, plain: bool):
        self.console, self.plan, self.keep, self.filtered = console, plan, keep, filtered
        self.counter, self.recorder, self.nan, self.agreement = TensorCount(), Recorder(), FirstNaN(), IndexAgreement()
        self.bars = ProgressBars(Console(stderr=True, **styles(plain)))
        self.bars.beside(console)
        self.rows: Sink = (JsonLines(sys.stdout, plan.config, self.bars.hide) if as_json
                           else TensorRows(console, plan.config, plan.tokens))

    def sinks(self, pictures: set[str], dumping: bool) -> list[Sink]:
        """The sinks a run executes with: those of the shown tensors (behind --only's filter; the
        first NaN only of those: looking at others would make them), the pictures (which see every
        tensor: a routing map needs both of the router's choices), the agreement and the bars."""
        views: list[Sink] = [self.counter, self.rows, self.nan] + ([self.recorder] if dumping else [])
        sinks: list[Sink] = [Filter(lambda e: self.keep(e.name), views)] if self.filtered else views
        if pictures:
            sinks.append(picture_sink(self.console, self.plan, pictures, self.keep))
        return sinks + [self.agreement, self.bars]


EXPORT_KIND = "a session stepper recorded"
EXPORTS = {  # the file names --export takes, and how a session recorded in each begins
    ".html": r'<!DOCTYPE html>\s*<html>\s*<head>\s*<meta charset="UTF-8">',
    ".svg": r'<svg class="rich-terminal"',
    ".txt": r"model \S+ \(\S+\): \d+ layers",
}


# Rich's page, its long lines wrapped by the browser at the window's width, not behind a scrollbar
WRAPPED_HTML = CONSOLE_HTML_FORMAT.replace(
    '<pre style="', '<pre style="white-space:pre-wrap;overflow-wrap:anywhere;', 1)


def step_command(
    model: ModelOpt = "tiny",
    layer: LayerOpt = None,
    layers: LayersOpt = None,
    ids: IdsOpt = None,
    prompt: PromptOpt = None,
    prompt_len: PromptLenOpt = None,
    start_pos: StartPosOpt = 0,
    decode: DecodeOpt = 0,
    seed: SeedOpt = 0,
    input_file: InputOpt = None,
    attn: AttnOpt = "auto",
    weight_cache_mb: CacheOpt = 0,
    cache_len: CacheLenOpt = 0,
    index_scoring: IndexScoringOpt = "exact",
    breaks: Annotated[list[str] | None, typer.Option("--break", metavar="GLOB",
                                                     help="Stop at tensors matching GLOB (e.g. compressed_kv); "
                                                          "repeatable.")] = None,
    until: Annotated[str | None, typer.Option(metavar="NAME",
                                              help="Run until the first tensor matching NAME and stop there.")] = None,
    commands: Annotated[Path | None, typer.Option(metavar="FILE",
                                                  help="Read debugger commands from FILE first, one per line.")] = None,
    plain: PlainOpt = False,
    as_json: Annotated[bool, typer.Option("--json",
                                          help="Write each tensor the debugger stops at as a JSON line on stdout (the "
                                               "session goes to stderr).")] = False,
    export: Annotated[Path | None, typer.Option(metavar="FILE",
                                                help="Record the session to FILE.html, FILE.svg or FILE.txt.")] = None,
    force: ForceOpt = False,
    use: UseOpt = None,
    patch: PatchOpt = None,
) -> None:
    """Step through the run one named tensor at a time, like a debugger.

    At each stop: Enter or n next, c continue, b GLOB break, d delete, u NAME until,
    p NAME[slice] print, e explain, w where, x A B compare (tensors or slices), h history,
    s show PICTURE, set NAME[slice] = VALUE (the run goes on from the changed tensor), q quit,
    ? help (help CMD: one command, with examples).
    Commands are read from the terminal (with line editing and history), or line by line from a pipe.
    """
    with user_errors(), ExitStack() as swapped:
        spec = run_spec(model, layer, layers, ids, prompt_len, start_pos, decode, seed, input_file, attn,
                        weight_cache_mb, prompt, cache_len, index_scoring)
        if export is not None:
            check_export(export, force)
        script = read_commands(commands) if commands is not None else None
        planned = plan_run(spec, lambda plan, names: names)  # the debugger keeps every tensor
        plan, names = planned.plan, planned.names
        planned.check("--break", breaks or [])
        planned.check("--until", [until] if until else [])
        patcher = patch_sink(patch, planned)
        planned.check_fits(names, "--prompt-len")
        swapped.enter_context(overrides.use(use or [], announce=sys.stderr))  # a file that fails to load stops it here
        console = Console(**styles(plain), highlight=False, markup=False, soft_wrap=True, record=export is not None,
                          stderr=as_json)
        print_header(console, plan, patch, planned.said)
        interactive = sys.stdin.isatty() and console.is_terminal
        bars = ProgressBars(Console(stderr=True, **styles(plain)))
        bars.beside(console)
        source = CommandSource(console, sys.stdin, interactive, script, before_input=bars.hide)
        on_stop = JsonLines(sys.stdout, plan.config) if as_json else None
        debugger = Debugger(console, plan.config, source, plan.weights, list(breaks or []), until, on_stop, names,
                            tokens=plan.tokens, read=explained)  # e reads other implementations' names too
        try:
            agreement = IndexAgreement()
            result = planned.execute([*patcher, debugger, agreement, bars])
            print_lines(console, footer(plan, result, len(debugger.history), None, agreement), "dim")
        except Quit:
            seen = len(debugger.history)
            console.print(f"quit after {seen} tensor{'s' if seen != 1 else ''}", style="dim")
        if export is not None:
            save_export(console, export, force)


def parse_chunk(text: str | None, patched: bool, drawn: bool) -> int | None:
    """--chunk: positions per chunk of the prefill (0: the whole prompt), or None for auto. A patch
    changes a tensor as the prefill makes it and a picture is drawn from whole tensors, so with
    either the prompt runs whole (auto) or the run is refused (a number)."""
    if text is None or text == "auto":
        return 0 if patched or drawn else None
    if not text.isdigit():
        raise StepperError("--chunk must be a number of positions (0: the whole prompt at once) or auto, got "
                           f"{untrusted.shown(text)!r}")
    if int(text) and (patched or drawn):
        why = "--patch changes tensors as the prefill makes them" if patched else "--show draws from whole tensors"
        raise StepperError(f"--chunk {int(text)}: {why}, so the prompt must run whole: give --chunk 0")
    return int(text)


def patch_sink(patch: list[str] | None, planned: RunPlan) -> list[Sink]:
    """The --patch options as a sink that goes before the views (they show the patched tensors); none without them."""
    return planned.patcher([parse_patch(text) for text in patch or []])


def read_commands(path: Path) -> list[str]:
    regular_file(path, "a text file of debugger commands, one per line", "--commands")
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise StepperError(f"--commands {untrusted.shown(path)}: cannot be read ({why(e)})") from None
    except UnicodeDecodeError:
        raise StepperError(f"--commands {untrusted.shown(path)}: not UTF-8 text; expected debugger commands, "
                           "one per line") from None


def check_export(path: Path, force: bool) -> None:
    if path.suffix not in EXPORTS:
        raise StepperError(f"--export {path}: the file name must end in {', '.join(EXPORTS)}")
    check_output("--export", path, force, is_export, EXPORT_KIND)


def is_export(path: Path) -> bool:
    """Whether a file begins as a session recorded by `--export` in its format does."""
    try:
        with path.open(encoding="utf-8") as f:
            head = f.read(200)
    except (OSError, UnicodeDecodeError):
        return False
    return re.match(EXPORTS[path.suffix], head) is not None


def save_export(console: Console, path: Path, force: bool) -> None:
    if path.suffix == ".html":
        text = console.export_html(code_format=WRAPPED_HTML)
    elif path.suffix == ".svg":
        text = console.export_svg(title="stepper step")
    else:
        text = console.export_text()
    write_output("--export", path, lambda f: f.write(text.encode("utf-8")), force, is_export, EXPORT_KIND)
    sys.stderr.write(f"session recorded to {untrusted.shown(path)}\n")
