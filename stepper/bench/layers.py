"""Full-size layers read from a checkpoint: one layer's decode and prefill, DeepSeek-V3.2's
indexer apart from its attention, one routed expert INT4 against FP8, and the MoE layer with
INT4 experts as a ratio to the FP8 one."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from stepper.bench.checkpoints import (
    bench_checkpoints,
    bench_config,
    ensure_checkpoint,
    fill_page_cache,
    forget_page_cache,
)
from stepper.bench.figures import Figure, in_subprocess, median_time, paired_times, peak_rss_mb, seconds
from stepper.kernels import fp8_workers
from stepper.model import KVCache, Transformer
from stepper.model.attention import mla_attention
from stepper.model.cache import LayerCache
from stepper.model.indexer import index_mask
from stepper.model.layer_weights import LayerWeights
from stepper.model.ops import swiglu
from stepper.model.options import LayerOptions
from stepper.seams.trace import Emitter
from stepper.weights.checkpoint import Checkpoint
from stepper.weights.synth_checkpoint import requantized


def layer_run(checkpoint: Path, layer: int, tokens: int, cache: int, repeat: int) -> list[Figure]:
    """One layer alone from a checkpoint: `tokens` new positions after `cache` cached ones."""
    filled = fill_page_cache(checkpoint)
    model = Transformer(Checkpoint(checkpoint))
    cfg = model.config
    rng = np.random.default_rng(7)
    times = []
    for rep in range(repeat):
        step = layer_step(model, layer, tokens, cache, rng)
        if rep == 1:
            faults = major_faults()
        times.append(seconds(step))
    first, rest = times[0], times[1:] or times
    read = f"; {major_faults() - faults} pages read from disk while timed" if repeat > 1 else ""
    return [Figure(f"{cfg.name} layer {layer} ({layer_kind(cfg, layer)}): {step_name(tokens, cache)}",
                   float(np.median(rest)), "s", peak_rss_mb(),
                   f"median of {len(rest)} after a first run of {first:.2f} s; checkpoint read into the page "
                   f"cache first ({filled:.0f} s){read}")]


def layer_step(model: Transformer, layer: int, tokens: int, cache: int, rng: np.random.Generator):
    """The layer's step on random inputs drawn now: `tokens` new positions after `cache` random
    cached ones (absorbed attention over a cache, naive for a prompt). -> a function making the
    step, each call with a fresh cache"""
    cfg, emit = model.config, Emitter()
    hidden = rng.standard_normal((1, tokens, cfg.hidden_size), dtype=np.float32)
    latent = rng.standard_normal((1, cache, cfg.kv_lora_rank), dtype=np.float32)
    k_pe = rng.standard_normal((1, 1, cache, cfg.qk_rope_head_dim), dtype=np.float32)
    positions = cache + np.arange(tokens)

    def step() -> np.ndarray:
        kv = KVCache(cfg.num_hidden_layers)
        if cache:
            kv.layers[layer].extend_latent(latent, k_pe)
        return model.layer(layer, hidden, model.rope(positions, emit), kv, emit, "absorb" if cache else "naive")

    return step


def layer_kind(cfg, layer: int) -> str:
    return "MoE" if cfg.is_moe_layer(layer) else "dense"


def step_name(tokens: int, cache: int) -> str:
    return f"decode 1 token, {cache}-position cache" if cache else f"prefill {tokens} tokens"


def major_faults() -> int:
    """Page faults that read from disk so far, in this process and its FP8 helpers (Linux; else 0)."""
    total = 0
    for pid in ["self", *fp8_workers.helper_pids()]:
        try:
            total += int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[9])
        except (OSError, IndexError, ValueError):
            pass
    return total


def indexed_prefill(checkpoint: Path, layer: int, tokens: int, repeat: int) -> list[Figure]:
    """A DeepSeek-V3.2 layer prefilling `tokens` positions: its Lightning Indexer (scores, top-k,
    mask), its attention under that mask, and the whole layer, each timed alone (medians)."""
    filled = fill_page_cache(checkpoint)
    source = Checkpoint(checkpoint)
    cfg, model, emit = source.config, Transformer(source), Emitter()
    x = np.random.default_rng(7).standard_normal((1, tokens, cfg.hidden_size), dtype=np.float32)  # a normed input
    rope = model.rope(np.arange(tokens), emit)
    w, options = LayerWeights(source, layer, model.scratch, rope), LayerOptions()
    mask = index_mask(x, w, LayerCache(), options, emit)  # [B, T, S]
    parts = {
        "its Lightning Indexer": lambda: index_mask(x, w, LayerCache(), options, emit),
        "its attention under the indexer's mask": lambda: mla_attention(x, w, LayerCache(), options, emit, mask),
        "the whole layer (indexer, attention, FFN)": lambda: model.layer(layer, x, rope, KVCache(cfg.num_hidden_layers),
                                                                         emit),
    }
    kept = f"{min(cfg.index_topk, tokens)} of up to {tokens} positions kept per query"
    return [Figure(f"{cfg.name} layer {layer}: prefill {tokens} tokens, {what}", median_time(fn, repeat), "s",
                   peak_rss_mb(),
                   f"median of {repeat}; {kept}; checkpoint read into the page cache first ({filled:.0f} s)")
            for what, fn in parts.items()]


def expert_products(fp8: str, int4: str, tokens: int, pairs: int, layer: int = 1, expert: int = 0) -> list[Figure]:
    """One routed expert (its gate and up as one product, then down), read from the FP8 and the
    INT4 checkpoint each time as a run reads it, on the same tokens, timed in turn (paired_times):
    the experts' products apart from the layer's attention and shared expert (BF16 in the INT4
    layout)."""
    sources = [Checkpoint(Path(fp8)), Checkpoint(Path(int4))]
    prefix = f"model.layers.{layer}.mlp.experts.{expert}."
    x = np.random.default_rng(5).standard_normal((tokens, sources[0].config.hidden_size), dtype=np.float32)

    def expert_of(source):
        return lambda: swiglu(x, *(source.matrix(prefix + f"{m}_proj.weight") for m in ("gate", "up", "down")))

    ratio, fp8_time, int4_time = paired_times(*map(expert_of, sources), pairs)
    name = sources[0].config.name
    return [Figure(f"{name} layer {layer}, one routed expert, {tokens} token(s): INT4 / FP8", ratio, "x", None,
                   f"median of {pairs} ratios, taken in turn; medians {int4_time * 1e3:.2f} ms against "
                   f"{fp8_time * 1e3:.2f} ms")]


def layers_in_turn(fp8: str, int4: str, tokens: int, pairs: int, cache: int = 0, layer: int = 1) -> list[Figure]:
    """The MoE layer from the FP8 and from the INT4 checkpoint making the same step (`tokens` new
    positions after `cache` cached ones, layer_step), timed in turn (paired_times): the layer's
    INT4 / FP8 ratio with both sides in the same minutes. The untimed first run of each reads
    what its step needs into the page cache: a full-size prompt's chosen experts of both
    checkpoints, about 14 GB of their 26, fit there together where the whole checkpoints do not."""
    models = [Transformer(Checkpoint(Path(checkpoint))) for checkpoint in (fp8, int4)]
    cfg = models[0].config
    steps = [layer_step(model, layer, tokens, cache, np.random.default_rng(7)) for model in models]
    faults = []
    ratio, fp8_time, int4_time = paired_times(*steps, pairs, warmed=lambda: faults.append(major_faults()))
    per_expert = tokens * cfg.num_experts_per_tok / cfg.n_routed_experts
    experts = "" if cache else f" ({per_expert:.1f} per expert)"
    name = f"{cfg.name} layer {layer}, {step_name(tokens, cache)}{experts}, in turn: INT4 experts / FP8 experts"
    return [Figure(name, ratio, "x", peak_rss_mb(),
                   f"median of {pairs} ratios, taken in turn after one of each; medians {int4_time:.3g} s against "
                   f"{fp8_time:.3g} s; {major_faults() - faults[0]} pages read from disk while timed")]


def moe_figures(checkpoint: Path, say, what: str, repeats: tuple[int, int] = (12, 3)) -> list[Figure]:
    """MoE layer 1 of the checkpoint: decode 1 token over a 1024-position cache, prefill 512 tokens."""
    say(f"MoE layer 1{what}: decode 1 token over a 1024-position cache")
    figures = in_subprocess("layer", checkpoint=checkpoint, layer=1, tokens=1, cache=1024, repeat=repeats[0])
    say(f"MoE layer 1{what}: prefill 512 tokens")
    return figures + in_subprocess("layer", checkpoint=checkpoint, layer=1, tokens=512, cache=0, repeat=repeats[1])


def int4_versus_fp8(workdir: Path, model: str, say, fp8: list[Figure] | None = None,
                    repeats: tuple[int, int] = (12, 3), pairs: tuple[int, int] = (21, 5)) -> list[Figure]:
    """The MoE layer with INT4 experts, decode and prefill, then each as a ratio to the same layer
    with FP8 experts, the two timed in turn (layers_in_turn; `pairs` of each), then one routed
    expert's (`fp8`: the FP8 layer's two figures, measured here when not given). An INT4 expert is
    half the bytes of an FP8 one; the INT4 layer's two times get the FP8 ones' floors, where
    they have them (the same products)."""
    cfg = bench_config(model, None)
    fp8_checkpoint = ensure_checkpoint(workdir, cfg, range(1, 2))
    if fp8 is None:
        forget_page_cache(fp8_checkpoint)
        fp8 = moe_figures(fp8_checkpoint, say, " (FP8)", repeats)
    say("writing (once) the layer 1 checkpoint with INT4 experts: about 10 GB at full size")
    int4 = ensure_checkpoint(workdir, replace(requantized(cfg, "int4"), name=f"{cfg.name}-int4-experts"), range(1, 2))
    for folder in bench_checkpoints(workdir):  # the FP8 layer's pages make room (see bench_checkpoints)
        forget_page_cache(folder)
    figures = [replace(mine, floor=theirs.floor, floor_note=f"the FP8 layer's, INT4 held to FP8: {theirs.floor_note}")
               if theirs.floor else mine
               for mine, theirs in zip(moe_figures(int4, say, " with INT4 experts", repeats), fp8)]
    say("the layer with INT4 experts and with FP8 ones in turn: decode 1 token, prefill 512 tokens")
    ratios = [f for tokens, cache, n in ((1, 1024, pairs[0]), (512, 0, pairs[1]))
              for f in in_subprocess("layers_in_turn", fp8=fp8_checkpoint, int4=int4, tokens=tokens, cache=cache,
                                     pairs=n)]
    say("one routed expert, INT4 against FP8: 1, 11 and 512 tokens")
    experts = [f for tokens, n in ((1, 21), (11, 11), (512, 5))
               for f in in_subprocess("experts", fp8=fp8_checkpoint, int4=int4, tokens=tokens, pairs=n)]
    return figures + ratios + experts
