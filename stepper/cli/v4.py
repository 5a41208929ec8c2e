"""`stepper run` and `stepper synth` for DeepSeek-V4 (`deepseek_v4`), which has a family of its own
(stepper.families.deepseek_v4*): a header saying what runs, one row per named tensor, a footer."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console

from stepper.cli.common import parse_ids, parse_layers
from stepper.cli.names import only_filter
from stepper.errors import StepperError
from stepper.planning.memory import available_bytes, gib
from stepper.seams.trace import Filter, Sink
from stepper.session import (
    V4Config,
    V4Synthetic,
    is_v4_model,
    open_v4,
    run_v4_model,
    synth_v4,
    v4_layer_emits,
    v4_run_bytes,
)
from stepper.untrusted import shown
from stepper.views import v4_catalog
from stepper.views.sinks import TensorRows, print_fitted, print_wrapped
from stepper.views.v4_pictures import V4_PICTURES, V4Pictures


def refuse(options: dict[str, object]) -> None:
    """One line naming the first option given that a V4 run does not take yet."""
    given = [name for name, value in options.items() if value not in (None, False, 0, [])]
    if given:
        raise StepperError(f"{given[0]}: not available for DeepSeek-V4 models yet (they take --layers, --ids, "
                           "--prompt-len, --decode, --seed, --only, --show, --plain)")


def describe(cfg: V4Config, weights, layers: range, decode: int, seed: int) -> str:
    """The header: the model's layer kinds and routing, the weights, what runs."""
    kinds = [cfg.layer_kind(i) for i in range(cfg.num_hidden_layers)]
    count = ", ".join(f"{kinds.count(k)} {k.upper() if k != 'sliding' else k}" for k in ("sliding", "csa", "hca"))
    synthetic = isinstance(weights, V4Synthetic)
    source = f"synthetic weights, seed {seed}" if synthetic else f"weights from {shown(weights.label)}"
    steps = f", then {decode} decode step{'s' if decode != 1 else ''}" if decode else ""
    return (f"model {shown(cfg.name)} (deepseek_v4): {cfg.num_hidden_layers} layers ({count}; the first "
            f"{cfg.num_hash_layers} hash-routed), {cfg.num_attention_heads} heads sharing one key-value head, "
            f"{cfg.n_routed_experts} experts top-{cfg.num_experts_per_tok}, {cfg.hc_mult} residual streams · "
            f"{source} · "
            f"layers {layers.start}..{layers.stop - 1}{steps}")


def run(model: str, layers: str | None, ids: str | None, prompt_len: int | None, decode: int, seed: int,
        only: list[str] | None, plain: bool, show: str | None = None) -> None:
    """stepper run on a V4 model (the options V4 takes; the others are refused by the caller)."""
    weights = open_v4(model, seed)
    cfg = weights.config
    chosen = parse_layers(layers)
    n = cfg.num_hidden_layers
    first, stop = (0, n) if chosen is None else (chosen[0], n if chosen[1] is None else chosen[1])
    if not 0 <= first < stop <= n:
        raise StepperError(f"--layers {first}:{stop}: model {shown(cfg.name)} has layers 0..{n - 1}")
    weights_check = getattr(weights, "check", None)
    if weights_check is not None:
        weights_check(range(n), True)  # every layer runs: a missing tensor is one line before anything runs
    pictures = set() if show is None else {p.strip() for p in show.split(",") if p.strip()}
    if pictures - set(V4_PICTURES):
        raise StepperError(f"--show: a DeepSeek-V4 run draws {', '.join(V4_PICTURES)}, got {shown(show)}")
    parsed = parse_ids(ids)
    length = len(parsed) if parsed is not None else 7 if prompt_len is None else prompt_len
    need, room = v4_run_bytes(cfg, length + decode), available_bytes()
    if room is not None and need > room:
        raise StepperError(f"model {shown(cfg.name)} over {length + decode} positions needs about {gib(need)}, "
                           f"and {gib(room)} is available: a shorter prompt, or a smaller model")
    console = Console(no_color=plain, highlight=False, markup=False, soft_wrap=True)
    print_wrapped(console, describe(cfg, weights, range(first, stop), decode, seed), style="bold")
    rows = TensorRows(console, cfg)
    rows.catalog = v4_catalog.catalogue()  # V4's entries name each tensor's dims
    counted: list[str] = []
    views: list[Sink] = [rows, lambda event: counted.append(event.name)]
    keep = only_filter(only or [], [], lambda note: sys.stderr.write(f"stepper: {note}\n"))
    sinks: list[Sink] = [Filter(lambda e: keep(e.name), views)] if only else views
    if pictures:
        sinks = [*sinks, V4Pictures(console, cfg, pictures, length, lambda e: keep(e.name))]
    result = run_v4_model(weights, parsed, length, decode, seed, sinks, range(first, stop))
    generated = f" · generated {', '.join(map(str, result.generated))}" if result.generated else ""
    prompt = ", ".join(map(str, result.prompt))
    print_wrapped(console, f"{len(counted)} tensors · prompt {prompt}{generated}", style="dim")


def synth(model: str, out: Path, seed: int, force: bool) -> None:
    """stepper synth of a V4 preset or config.json, in the published layout."""
    synth_v4(model, out, seed, force)
    names = sorted(p.name for p in out.iterdir())
    size = sum(p.stat().st_size for p in out.iterdir())
    print_wrapped(Console(highlight=False, markup=False), f"wrote {shown(out)}: {len(names)} files, "
                  f"{size / 2**20:.1f} MiB ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})")


def explain(name: str, model: str, plain: bool) -> None:
    """stepper explain on a V4 model: the entries of its catalogue parts."""
    cfg = open_v4(model).config
    found = v4_catalog.find(name)
    if not found:
        raise StepperError(f"no DeepSeek-V4 tensor matches '{shown(name)}' "
                           f"(stepper tree --model {shown(model)} lists them)")
    console = Console(no_color=plain, highlight=False, markup=False, soft_wrap=True)
    for entry in found:
        print_fitted(console, v4_catalog.explain(entry, cfg))
        console.print()


def tree(model: str, layer: int | None, plain: bool) -> None:
    """stepper tree on a V4 model: one layer of each kind (or layer N), its tensors in order."""
    cfg = open_v4(model).config
    n = cfg.num_hidden_layers
    if layer is not None and not 0 <= layer < n:
        raise StepperError(f"--layer {layer}: model {shown(cfg.name)} has layers 0..{n - 1}")
    kinds = {(cfg.layer_kind(i), cfg.is_hash_layer(i)): i for i in reversed(range(n))}
    console = Console(no_color=plain, highlight=False, markup=False, soft_wrap=True)
    for i in [layer] if layer is not None else sorted(kinds.values()):
        print_fitted(console, v4_catalog.tree(cfg, i, v4_layer_emits(cfg, i)), indent=6)


__all__ = ["describe", "explain", "is_v4_model", "refuse", "run", "synth", "tree"]
