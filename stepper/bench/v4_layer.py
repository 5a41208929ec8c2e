"""Full-size DeepSeek-V4-Flash layers, one of each kind asked for (CSA layer 4; with --v4-hca the
HCA layer 3, compress ratio 128 and no indexer), synthetic weights in the published layout (FP4
routed experts, FP8 attention with E8M0 block scales): decode one token and prefill 512 tokens,
each with its peak RSS and the time of its parts (hc_pre/hc_post, attention, compressor, the
indexer of a CSA layer, experts), and the layer's floor from the rates measured in the same process.

The layer's tensors are written once into the work directory as a checkpoint holding only the
layers asked for (deepseek_v4_synth's values and storage, V4Synthetic.stored), read back by
families.deepseek_v4_checkpoint and run through families.deepseek_v4.V4Model with its caches
(V4Caches): the model's own code.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from stepper import files
from stepper.bench.ceilings import gemm_rate
from stepper.bench.checkpoints import fill_page_cache, forget_page_cache
from stepper.bench.figures import Figure, in_subprocess, median_time, peak_rss_mb, side_by_side
from stepper.families.deepseek_v4 import V4Caches, V4Model, V4Step
from stepper.families.deepseek_v4_checkpoint import V4Checkpoint
from stepper.families.deepseek_v4_config import V4Config
from stepper.families.deepseek_v4_synth import V4Synthetic
from stepper.fp4 import quantize_fp4
from stepper.kernels import fp4_tiles, parallel
from stepper.model.layer_weights import LayerWeights
from stepper.model.v4_attention_cache import V4AttentionCache
from stepper.model.v4_synthetic_cache import seeded_cache
from stepper.presets import V4_PRESETS
from stepper.seams.trace import Emitter
from stepper.weights import deepseek_v4_names as names
from stepper.weights.checkpoint import INDEX
from stepper.weights.published_store import safetensors_dtype
from stepper.weights.safetensors_writer import Entry, write_safetensors
from stepper.weights.stored import Fp4Matrix

MODEL = "deepseek-v4-flash"
CSA_LAYER = 4  # the first score-routed layer with compress ratio 4 (layers 0-2 are hash-routed, 3 is HCA)
HCA_LAYER = 3  # the first score-routed layer with compress ratio 128 (no indexer: every closed entry is attended)
SHARD_BYTES = 1 << 29  # a shard is written once its tensors reach this many bytes (the writer holds one shard)
CONTEXT = 1024  # positions in the cache before the decode step (seeded: model.v4_synthetic_cache)
FP4_CEILING = "FP4 tile decode + matvec, 2048x4096, one core"


def flash_config() -> V4Config:
    return V4Config.from_hf(V4_PRESETS[MODEL], f"preset {MODEL}")


def ensure_layers(workdir: Path, cfg: V4Config, layers: tuple[int, ...], seed: int = 0) -> Path:
    """A checkpoint folder holding only these layers' tensors (with the whole model's config.json),
    written once into workdir and reused."""
    folder = workdir / f"{cfg.name}-v4-layers{'-'.join(map(str, layers))}-seed{seed}"
    if (folder / INDEX).exists():
        return folder
    files.make_folder(workdir)
    partial = files.temp_folder(folder)
    try:
        source, weight_map, shard, entries = V4Synthetic(cfg, seed), {}, 0, []

        def flush():
            nonlocal shard, entries
            name = f"layers-{shard + 1:05d}.safetensors"
            write_safetensors(partial / name, entries, {"format": "pt"})
            weight_map.update(dict.fromkeys((e.name for e in entries), name))
            shard, entries = shard + 1, []

        for layer in layers:
            for short, tensor in names.layer_tensors(cfg, layer).items():
                published = names.layer_prefix(layer) + short
                entries += [Entry(name, safetensors_dtype(a), a.shape, lambda a=a: a)
                            for name, a in source.stored(published, tensor).items()]
                if sum(e.nbytes for e in entries) >= SHARD_BYTES:
                    flush()
        if entries:
            flush()
        index = {"metadata": {"stepper_synthetic_seed": seed, "stepper_model": cfg.name}, "weight_map": weight_map}
        files.write_new(partial / INDEX, json.dumps(index, indent=2) + "\n")
        files.write_new(partial / "config.json", json.dumps(cfg.to_hf(), indent=2) + "\n")
        files.replace_folder(partial, folder)
    finally:
        files.remove_temp_folder(partial)
    return folder


class PartTimer:
    """Times functions of the model's modules while in a `with` block: {part: (module, name)}; a
    part's seconds include whatever it calls (the attention includes its compressors and indexer)."""

    def __init__(self, parts: dict[str, tuple[object, str]]):
        self.parts = parts

    def __enter__(self):
        self.seconds = dict.fromkeys(self.parts, 0.0)
        self.originals = {part: getattr(module, name) for part, (module, name) in self.parts.items()}
        for part, (module, name) in self.parts.items():
            setattr(module, name, self.timed(part, self.originals[part]))
        return self

    def timed(self, part: str, fn):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - start
        return run

    def __exit__(self, *_):
        for part, (module, name) in self.parts.items():
            setattr(module, name, self.originals[part])


def layer_parts(has_indexer: bool) -> dict[str, tuple[object, str]]:
    """The parts timed: an HCA layer has no indexer, so none is shown for it."""
    from stepper.families import deepseek_v4
    from stepper.model import clamped_experts, compressed_attention, v4_layer

    indexer = {"indexer (its compressor included)": (compressed_attention, "index_entries")} if has_indexer else {}
    return {"hc_pre": (v4_layer, "hc_pre"), "hc_post": (v4_layer, "hc_post"),
            "attention": (deepseek_v4, "attention"), "compressor": (compressed_attention, "compress"),
            **indexer, "MoE": (v4_layer, "v4_moe"), "routed experts": (clamped_experts, "routed_experts")}


def fp4_rate() -> list[Figure]:
    """FP4 tiles decoded and multiplied by one token, a V4-Flash expert's w1 [2048, 4096] in memory,
    on one thread (the tiles of kernels.fp4_tiles, as a product runs them)."""
    w = Fp4Matrix.of(*quantize_fp4(np.random.default_rng(0).standard_normal((2048, 4096), dtype=np.float32)))
    inputs, rows = np.ones((4096, 1), np.float32), np.empty((2048, 1), np.float32)  # [in, N], [out, N]
    decode = median_time(lambda: fp4_tiles.apply_tiles(inputs, w, fp4_tiles.row_tiles(w, 1), rows), 7)
    return [Figure(FP4_CEILING, w.shape[0] * w.shape[1] / decode / 1e9, "G weights/s")]


def rates() -> dict[str, float]:
    """The rates the floors are made of, measured now: FP4 and FP8 weights decoded (and multiplied
    by one token) per second with every core at once (one process per core, as the Kimi K2 floors
    count them: two vCPUs need not give twice one's rate), float32 FLOP/s with stepper's split."""
    cores = parallel.cores()
    fp4 = sum(f.value for f in side_by_side("fp4_rate", cores))
    fp8 = sum(f.value for f in side_by_side("fp8_rate", cores))
    return {"fp4": fp4 * 1e9, "fp8": fp8 * 1e9, "gemm": gemm_rate()}


def weights_used(cfg: V4Config, layer: int, tokens: int) -> dict[str, float]:
    """Weights the layer decodes (FP4 experts: those its tokens choose, n (1 - (1 - k/n)^T) of n on
    average; FP8; BF16 and F32 products) and the products' FLOPs for `tokens` new positions."""
    n, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    counts = {names.EXPERT: 0.0, names.LINEAR: 0.0, names.FLOAT: 0.0}
    per_token = 0.0
    for short, tensor in names.layer_tensors(cfg, layer).items():
        if len(tensor.shape) != 2 or short.startswith("hc_") or not short.endswith(".weight"):
            continue  # products only: not the hc mixing, a compressor's added positions (ape), a hash table
        size = float(np.prod(tensor.shape))
        if tensor.kind == names.EXPERT:
            counts[tensor.kind] += size * (1 - (1 - k / n) ** tokens)
            per_token += size * k / n
        else:
            counts[tensor.kind] += size
            per_token += size
    return {"fp4": counts[names.EXPERT], "fp8": counts[names.LINEAR], "flops": 2.0 * tokens * per_token}


def keys_attended(dims, tokens: int) -> int:
    """Keys summed over the queries: a prefill's query at p sees min(p + 1, window) window keys and
    its entries (HCA: every one of the (p + 1) // m closed; CSA: at most index_topk of them); the
    decode step, at position CONTEXT, the same."""
    positions = np.arange(tokens) if tokens > 1 else np.array([CONTEXT])  # [T]
    window = np.minimum(positions + 1, dims.sliding_window)
    entries = (positions + 1) // dims.compress_ratio if dims.compress_ratio else np.zeros_like(positions)
    if dims.has_indexer:
        entries = np.minimum(entries, dims.index_topk)
    return int((window + entries).sum())


def layer_floor(cfg: V4Config, layer: int, tokens: int, measured: dict[str, float]) -> tuple[float, str]:
    """The least time the layer could take here: its FP4 and FP8 weights decoded once at the rates
    of every core at once, its products (and the attention core over the window and the entries
    each query sees) at the GEMM rate.  -> (seconds, how)"""
    used = weights_used(cfg, layer, tokens)
    dims = cfg.dims(layer)
    flops = used["flops"] + 4.0 * dims.num_heads * dims.head_dim * keys_attended(dims, tokens)
    seconds = used["fp4"] / measured["fp4"] + used["fp8"] / measured["fp8"] + flops / measured["gemm"]
    how = (f"{used['fp4'] / 1e6:,.0f} M FP4 weights at {measured['fp4'] / 1e9:.2f} G/s and {used['fp8'] / 1e6:,.0f} M "
           f"FP8 at {measured['fp8'] / 1e9:.2f} G/s, every core at once, + {flops / 1e9:,.1f} GFLOP at "
           f"{measured['gemm'] / 1e9:.0f} GFLOP/s (rates measured in the same process)")
    return seconds, how


def v4_layer_run(checkpoint: Path, layer: int, tokens: int, repeat: int) -> list[Figure]:
    """Layer `layer` of the checkpoint on `tokens` new positions: a prefill from position 0, or
    (tokens 1) decode steps after a CONTEXT-position cache (seeded: model.v4_synthetic_cache).
    The median time of `repeat` runs after an untimed one, each part's median share, the floor."""
    filled = fill_page_cache(checkpoint)
    source = V4Checkpoint(checkpoint)
    cfg, model, rng = source.config, V4Model(source), np.random.default_rng(7)
    caches = V4Caches(cfg)
    dims = cfg.dims(layer)

    def fresh_cache() -> V4AttentionCache:
        if tokens > 1:
            return V4AttentionCache()
        sample = rng.standard_normal((1, 16, cfg.hidden_size), dtype=np.float32)
        return seeded_cache(sample, LayerWeights(source, layer), dims, CONTEXT, seed=0)

    streams = rng.standard_normal((1, tokens, cfg.hc_mult, cfg.hidden_size), dtype=np.float32)  # [B, T, n, d]
    ids = rng.integers(0, cfg.vocab_size, (1, tokens))  # [B, T]
    times, cpu, shares = [], [], []
    for run in range(repeat + 1):
        caches.layers[layer] = fresh_cache()
        with PartTimer(layer_parts(dims.has_indexer)) as parts:
            start, start_cpu = time.perf_counter(), time.process_time()
            model.layer(layer, streams, V4Step(ids), caches, Emitter())
            seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
        if run:  # the first run maps the weights: untimed
            times.append(seconds)
            cpu.append(cpu_seconds)
            shares.append({part: s / seconds for part, s in parts.seconds.items()})
    measured = rates()
    kind = {4: "CSA", 0: "sliding"}.get(dims.compress_ratio, "HCA")
    what = f"decode 1 token after {CONTEXT} positions" if tokens == 1 else f"prefill {tokens} tokens"
    split = ", ".join(f"{part} {np.median([s[part] for s in shares]):.0%}" for part in shares[0])
    figure = Figure(f"{cfg.name} layer {layer} ({kind}): {what}", float(np.median(times)), "s", peak_rss_mb(),
                    f"median of {repeat}; CPU {np.median(cpu):.3g} s in this process's threads (the helper processes' "
                    f"not counted; under cores x the time when other work shares the machine); {split}; checkpoint "
                    f"read into the page cache first ({filled:.0f} s)")
    seconds, how = layer_floor(cfg, layer, tokens, measured)
    return [replace(figure, floor=seconds, floor_note=how)]


def v4_figures(workdir: Path, say, hca: bool = False) -> list[Figure]:
    """DeepSeek-V4-Flash: its CSA layer (and with `hca` its HCA layer) decoding one token and
    prefilling 512, each in its own process, and a CSA attention's decode step over 1,048,576
    positions (v4_attention)."""
    cfg = flash_config()
    figures = layer_figures(workdir, cfg, CSA_LAYER, "CSA", "3.7 GB", say)
    if hca:
        figures += layer_figures(workdir, cfg, HCA_LAYER, "HCA", "3.6 GB", say)
    say(f"{cfg.name} CSA attention: decode over 1,048,576 positions")
    return figures + in_subprocess("v4_long")


def layer_figures(workdir: Path, cfg: V4Config, layer: int, kind: str, size: str, say) -> list[Figure]:
    """One layer of the kind a V4 layer comes in, written once, decoding one token and prefilling 512."""
    say(f"writing (once) {cfg.name} layer {layer} ({kind}): about {size}, several minutes")
    folder = ensure_layers(workdir, cfg, (layer,))
    forget_page_cache(folder)
    say(f"{cfg.name} layer {layer} ({kind}): decode 1 token, prefill 512 tokens")
    figures = in_subprocess("v4_layer", checkpoint=folder, layer=layer, tokens=1, repeat=5)
    return figures + in_subprocess("v4_layer", checkpoint=folder, layer=layer, tokens=512, repeat=1)
