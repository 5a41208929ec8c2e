"""`stepper bench`: how fast a full-size layer runs here, and what bounds it.

Each figure is measured in a fresh subprocess, so its peak RSS is its own:

- the machine's ceilings: memory bandwidth (a large float32 copy), float32 GEMM rate, and the
  rate at which FP8 tiles are decoded and multiplied (`fp8_matmul`);
- one Kimi K2 MoE layer at full size (layer 1 of `kimi-k2`, 384 experts, FP8, read from a
  checkpoint written once by `stepper synth` into the work directory): decode one token over a
  1024-position latent cache, and a 512-token prefill;
- the same MoE layer with its routed experts in INT4 (compressed-tensors pack-quantized, as
  Kimi-K2-Thinking stores them; attention and the shared expert BF16), the same two ways, and
  each time as a ratio to the FP8 layer's; and one routed expert alone, INT4 against FP8, for 1,
  11 (a 512-token prefill's share of each expert) and 512 tokens;
- the dense layer 0 at full size, the same two ways;
- the same MoE layer shape with 16 routed experts, against transformers' DeepseekV3 in float32
  on the same weights and tokens (T = 1, 32, 512, and T = 1 again with stepper's weight cache
  warm), when torch and transformers are installed;
- with `--indexer`, DeepSeek-V3.2's first layer (dense: its attention and Lightning Indexer are
  those of every layer) prefilling 4096 tokens: the indexer alone, the attention under its mask
  alone, and the whole layer.

Timing medians use several repetitions, and the comparisons with transformers take the two
runs in turn (`paired_times`); nothing here is asserted in tests.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import platform
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from stepper import cpu_caches, files
from stepper.config import Config, load_config
from stepper.families import derive
from stepper.fp8 import quantize
from stepper.kernels import attention as kernels_attention
from stepper.kernels import fp8_workers, parallel
from stepper.kernels.fp8_matmul import linear_fp8
from stepper.kernels.weight_cache import CachedWeights
from stepper.model import KVCache, Transformer, synthetic_cache
from stepper.model.attention import mla_attention
from stepper.model.cache import LayerCache
from stepper.model.indexer import index_mask
from stepper.model.layer_weights import LayerWeights
from stepper.model.ops import swiglu
from stepper.model.options import LayerOptions
from stepper.prefill import in_chunks
from stepper.presets import PRESETS
from stepper.seams.trace import Emitter
from stepper.views import summary
from stepper.weights.checkpoint import INDEX, Checkpoint
from stepper.weights.names import layer_shapes
from stepper.weights.safetensors_reader import advise_checkpoint_map
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.stored import Fp8Matrix
from stepper.weights.synth_checkpoint import requantized, synth_checkpoint

FILL_BYTES = 1 << 26  # what fill_page_cache reads or maps at a time
WARM_CACHE_MB = 8192  # holds every decoded weight of the 16-expert layer (about 3.4 GB)
ATTENTION_CACHE_MB = 1024  # holds a full-size attention's decoded weights (about 0.4 GB)
GEMM_CEILING = "float32 GEMM 2048^3, BLAS on every core"
FP8_CEILING = "FP8 tile decode + matvec, 2048x7168, one core"
FP8_EVERY_CORE = "FP8 tile decode + matvec, 2048x7168, every core at once"
SHOWN_CHUNK = 1024  # a shown prefill runs this many positions at a time (stepper.prefill, as `run --chunk`)


@dataclass(frozen=True)
class Figure:
    name: str
    value: float
    unit: str
    peak_rss_mb: float | None = None
    note: str = ""
    floor: float | None = None  # in the figure's unit: what this run's ceilings allow, or the anchor a ratio is held to
    floor_note: str = ""  # how the floor was made

    def ratio(self) -> float | None:
        """The figure over its floor (None without one)."""
        return self.value / self.floor if self.floor else None


FEATURES = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile",
            "amx_bf16", "asimd", "sve")  # the CPU flags the products' speed depends on, where the CPU has them


def machine() -> str:
    """The CPU, its cores, its L2, the features the products use, Python, NumPy and the BLAS."""
    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
        flags = set(next((line.split(":", 1)[1].split() for line in info if line.startswith(("flags", "Features"))),
                         []))
    except OSError:
        pass
    features = " ".join(f for f in FEATURES if f in flags) or "not reported"
    return (f"{cpu}, {os.cpu_count()} cores, L2 {cpu_caches.l2_bytes() >> 10} KiB per core; CPU features: {features}; "
            f"Python {platform.python_version()}, NumPy {np.__version__}, BLAS: {parallel.blas_description()}")


@dataclass(frozen=True)
class Ceilings:
    """This run's rates that the floors are made of."""

    fp8: float  # FP8 weights decoded and multiplied per second, every core at once
    gemm: float  # float32 FLOP/s, BLAS on every core
    cores: int

    @classmethod
    def of(cls, figures: list[Figure]) -> Ceilings:
        rate = {f.name: f.value for f in figures}
        return cls(rate[FP8_EVERY_CORE] * 1e9, rate[GEMM_CEILING] * 1e9, parallel.cores())


def layer_floor(cfg: Config, layer: int, tokens: int, cache: int, ceil: Ceilings) -> tuple[float, str]:
    """The least time a layer step could take here: every FP8 weight it uses decoded once at the
    FP8 rate measured with every core at once (two vCPUs need not give twice one's rate), and its
    products (2 x tokens x the weights each token uses, and the attention core over the cache) at
    the measured GEMM rate, every core. A prefill uses the
    experts its tokens choose: n x (1 - (1 - k/n)^T) of n routed experts, k per token, on average.
    -> (seconds, how it was made)"""
    shapes = layer_shapes(cfg, layer)
    matrices = {name: math.prod(shape) for name, shape in shapes.items()
                if len(shape) == 2 and ".gate.weight" not in name}  # the router stays float32
    routed = sum(v for name, v in matrices.items() if ".mlp.experts." in name)
    rest = sum(matrices.values()) - routed
    if cfg.is_moe_layer(layer) and cfg.n_routed_experts:
        n, k = cfg.n_routed_experts, cfg.num_experts_per_tok
        per_expert = routed / n
        decoded = rest + per_expert * n * (1 - (1 - k / n) ** tokens)
        per_token = rest + per_expert * k
    else:
        decoded = per_token = rest
    attn = "absorb" if cache else "naive"
    flops = 2.0 * tokens * per_token + core_flops(cfg, tokens, cache, attn)
    seconds = decoded / ceil.fp8 + flops / ceil.gemm
    how = (f"{decoded / 1e6:,.0f} M FP8 weights at {ceil.fp8 / 1e9:.2f} G/s on {ceil.cores} cores at once "
           f"+ {flops / 1e9:,.0f} GFLOP at {ceil.gemm / 1e9:.0f} GFLOP/s")
    return seconds, how


def with_floor(figures: list[Figure], floor: tuple[float, str]) -> list[Figure]:
    return [replace(f, floor=floor[0], floor_note=floor[1]) for f in figures]


def anchored(figures: list[Figure], why: str) -> list[Figure]:
    """The ratios among the figures held to 1 (no slower than the other side); the rest as they are."""
    return [replace(f, floor=1.0, floor_note=why) if f.unit == "x" else f for f in figures]


def median_time(fn, repeat: int) -> float:
    return float(np.median([seconds(fn) for _ in range(repeat)]))


def seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def paired_times(first, second, pairs: int) -> tuple[float, float, float]:
    """After one untimed run of each, `pairs` runs of each in turn, the order swapped every pair:
    the median of the ratios second / first, and the median time of each. Run this way, both see
    the same state of the machine (on this one, the same layer's time drifted by 20% between
    minutes), which times taken one after the other do not.  -> (ratio, first s, second s)"""
    first()
    second()
    ones, twos = [], []
    for p in range(pairs):
        if p % 2 == 0:
            ones.append(seconds(first))
            twos.append(seconds(second))
        else:
            twos.append(seconds(second))
            ones.append(seconds(first))
    ratios = np.array(twos) / np.array(ones)
    return float(np.median(ratios)), float(np.median(ones)), float(np.median(twos))


def peak_rss_mb() -> float:
    """This process's peak resident memory plus that of its FP8 helper processes (Linux)."""
    helpers = sum(helper_peak_kb(pid) for pid in fp8_workers.helper_pids())
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss + helpers) / 1024


def helper_peak_kb(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)


# ---------------------------------------------------------------------------------------------
# Scenarios: each runs in its own process (`python -m stepper.bench SCENARIO ARGS`) and prints JSON


def ceilings() -> list[Figure]:
    a, b = np.empty(2**27, np.float32), np.ones(2**27, np.float32)  # 512 MiB each
    copy = median_time(lambda: np.copyto(a, b), 5)
    m = np.ones((2048, 2048), np.float32)
    gemm = median_time(lambda: m @ m, 5)
    parallel.single_threaded_blas()  # from here on, as stepper runs: its own split, BLAS on one thread
    gemm_one = median_time(lambda: m @ m, 5)
    [one_core] = fp8_rate()
    together = side_by_side("fp8_rate", parallel.cores())
    return [
        Figure("memory bandwidth (float32 copy, read + write)", 2 * a.nbytes / copy / 1e9, "GB/s"),
        Figure(GEMM_CEILING, 2 * 2048**3 / gemm / 1e9, "GFLOP/s"),
        Figure("float32 GEMM 2048^3, BLAS on one core", 2 * 2048**3 / gemm_one / 1e9, "GFLOP/s"),
        one_core,
        Figure(FP8_EVERY_CORE, sum(f.value for f in together), "G weights/s",
               note=f"one process per core at once ({len(together)}), each "
                    f"{', '.join(f'{f.value:.2f}' for f in together)}: "
                    f"{sum(f.value for f in together) / one_core.value:.2f}x one core alone"),
    ]


def fp8_rate() -> list[Figure]:
    """FP8 tiles decoded and multiplied by one token, [2048, 7168], in this process alone."""
    codes, scales = quantize(np.random.default_rng(0).standard_normal((2048, 7168), dtype=np.float32))
    w = Fp8Matrix.of(codes, scales)
    x = np.ones((1, 7168), np.float32)
    decode = median_time(lambda: linear_fp8(x, w), 7)
    return [Figure(FP8_CEILING, codes.size / decode / 1e9, "G weights/s",
                   note="weights in memory, so no helper process: the rate of one core")]


def side_by_side(name: str, copies: int) -> list[Figure]:
    """A scenario run in `copies` processes at once (each core busy, as when a product is
    shared): each one's figures."""
    argv = [sys.executable, "-m", "stepper.bench", name, "{}"]
    running = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(copies)]
    figures = []
    for process in running:
        out, err = process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"bench scenario {name} failed:\n{err[-2000:]}")
        figures += [Figure(**f) for f in json.loads(out.splitlines()[-1])]
    return figures


def fill_page_cache(checkpoint: Path) -> float:
    """Read every shard of the checkpoint once, so the timed runs find it in the page cache;
    returns the seconds taken. (A machine whose memory reclaim drops file pages nobody has read
    for a while, as the one docs/performance.md's figures come from does after about a minute, has
    otherwise lost part of a cache filled by hand before `stepper bench` by the time a scenario
    runs.) The pages are read as the checkpoint reader reads them, through a map advised by
    `advise_checkpoint_map`, so that what was dropped comes back in 2 MB folios: `read()` brings
    back the start of each stretch it finds missing in smaller ones."""
    start = time.perf_counter()
    for shard in sorted(checkpoint.glob("*.safetensors")):
        with open(shard, "rb", buffering=0) as f:
            if os.fstat(f.fileno()).st_size == 0:
                continue
            view = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            if advise_checkpoint_map(view) == mmap.PAGESIZE:  # a fault would read one page: read() instead
                read_through(f)
            else:
                touch_through(view)
            view.close()
    return time.perf_counter() - start


def read_through(f) -> None:
    chunk = bytearray(FILL_BYTES)
    while f.readinto(chunk):
        pass


def touch_through(view: mmap.mmap) -> None:
    """Fault in every page of the map, a chunk at a time, letting each chunk go after."""
    pages = np.frombuffer(view, np.uint8)
    for first in range(0, pages.size, FILL_BYTES):
        int(pages[first : first + FILL_BYTES : mmap.PAGESIZE].sum())
        view.madvise(mmap.MADV_DONTNEED, first, min(FILL_BYTES, pages.size - first))
    del pages


def forget_page_cache(checkpoint: Path) -> None:
    """Let the page cache drop the checkpoint's pages (those no process maps), so that the
    scenarios after it find the checkpoint as a first read from disk leaves it, whatever read or
    mapped it before: in large folios. The same bytes cached as 4 KB pages, as earlier versions of
    the reader left them, cost ten times as much to map (`advise_checkpoint_map`)."""
    if not hasattr(os, "posix_fadvise"):
        return
    for shard in sorted(checkpoint.glob("*.safetensors")):
        with open(shard, "rb", buffering=0) as f:
            os.fsync(f.fileno())  # pages not yet written back are not dropped
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def layer_run(checkpoint: Path, layer: int, tokens: int, cache: int, repeat: int) -> list[Figure]:
    """One layer alone from a checkpoint: `tokens` new positions after `cache` cached ones."""
    filled = fill_page_cache(checkpoint)
    source = Checkpoint(checkpoint)
    cfg = source.config
    model = Transformer(source)
    rng = np.random.default_rng(7)
    emit = Emitter()
    times = []
    for rep in range(repeat):
        kv = KVCache(cfg.num_hidden_layers)
        if cache:
            latent = rng.standard_normal((1, cache, cfg.kv_lora_rank), dtype=np.float32)
            k_pe = rng.standard_normal((1, 1, cache, cfg.qk_rope_head_dim), dtype=np.float32)
            kv.layers[layer].extend_latent(latent, k_pe)
        hidden = rng.standard_normal((1, tokens, cfg.hidden_size), dtype=np.float32)
        positions = cache + np.arange(tokens)
        attn = "absorb" if cache else "naive"
        if rep == 1:
            faults = major_faults()
        start = time.perf_counter()
        model.layer(layer, hidden, model.rope(positions, emit), kv, emit, attn)
        times.append(time.perf_counter() - start)
    kind = "MoE" if cfg.is_moe_layer(layer) else "dense"
    what = f"decode 1 token, {cache}-position cache" if cache else f"prefill {tokens} tokens"
    first, rest = times[0], times[1:] or times
    read = f"; {major_faults() - faults} pages read from disk while timed" if repeat > 1 else ""
    return [Figure(f"{cfg.name} layer {layer} ({kind}): {what}", float(np.median(rest)), "s", peak_rss_mb(),
                   f"median of {len(rest)} after a first run of {first:.2f} s; checkpoint read into the page "
                   f"cache first ({filled:.0f} s){read}")]


def major_faults() -> int:
    """Page faults that read from disk so far, in this process and its FP8 helpers (Linux; else 0)."""
    total = 0
    for pid in ["self", *fp8_workers.helper_pids()]:
        try:
            total += int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[9])
        except (OSError, IndexError, ValueError):
            pass
    return total


def versus_torch(checkpoint: Path, tokens: int, pairs: int, cache_mb: int = 0) -> list[Figure]:
    """stepper (FP8 from the checkpoint) and transformers (float32 resident) on the same layer,
    timed in turn (paired_times).

    transformers runs its experts with its eager loop: what it picks by default for a model it
    loads, grouped_mm, measured slower on this CPU (16-expert layer at 512 tokens: 4.5-5.4 s
    against 3.7-4.5 s). With cache_mb, stepper keeps decoded weights (--weight-cache-mb) and is
    timed once it is warm."""
    import torch
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer, DeepseekV3RotaryEmbedding

    torch.set_grad_enabled(False)
    source = Checkpoint(checkpoint)  # (load_layer below reads every tensor: the page cache is filled then)
    cfg = source.config
    raw = {k: v for k, v in cfg.to_hf().items() if k != "quantization_config"}
    raw.update(model_type="deepseek_v3", rope_interleave=True)
    hf_cfg = DeepseekV3Config(**raw)
    hf_cfg._attn_implementation = "eager"
    hf_cfg._experts_implementation = "eager"
    layer = DeepseekV3DecoderLayer(hf_cfg, 1).float().eval()
    load_layer(layer, source, layer_shapes(cfg, 1), cfg)
    rotary = DeepseekV3RotaryEmbedding(hf_cfg)
    hidden = np.random.default_rng(3).standard_normal((1, tokens, cfg.hidden_size), dtype=np.float32)
    h = torch.from_numpy(hidden)
    positions = torch.arange(tokens)[None]
    cos_sin = rotary(h, positions)
    mask = torch.full((tokens, tokens), float("-inf")).triu(1)[None, None]
    model = Transformer(CachedWeights(source, cache_mb << 20) if cache_mb else source)
    emit = Emitter()

    def ours_once():
        model.layer(1, hidden, model.rope(np.arange(tokens), emit), None, emit, "naive")

    if cache_mb:  # a weight is kept from its second use: two runs fill the cache
        ours_once()
        ours_once()
    ratio, torch_time, ours = paired_times(
        lambda: layer(h, attention_mask=mask, position_ids=positions, position_embeddings=cos_sin), ours_once, pairs)
    how = "weight cache warm" if cache_mb else "FP8"
    return [Figure(f"{cfg.name} layer 1, T={tokens}: stepper ({how}) / transformers (float32)", ratio, "x", None,
                   f"median of {pairs} ratios, runs taken in turn after one of each; medians: stepper {ours:.3f} s, "
                   f"transformers {torch_time:.3f} s")]


def load_layer(layer, source, shapes: dict[str, tuple[int, ...]], cfg: Config) -> None:
    import torch

    params = dict(layer.named_parameters())
    params.update(dict(layer.named_buffers()))
    experts = {}
    for name in shapes:
        short = name.split(".", 3)[3]
        value = torch.from_numpy(np.array(source.get(name)))  # a writable copy of the mapped bytes
        if ".experts." in short:
            _, _, e, proj, _ = short.split(".")
            experts.setdefault(int(e), {})[proj] = value
        else:
            params[short].data.copy_(value)
    for e, parts in experts.items():
        params["mlp.experts.gate_up_proj"].data[e].copy_(torch.cat([parts["gate_proj"], parts["up_proj"]]))
        params["mlp.experts.down_proj"].data[e].copy_(parts["down_proj"])


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



# ---------------------------------------------------------------------------------------------
# Long contexts: the attention of one layer alone (synthetic weights, nothing read from disk)


def attention_run(model: str, tokens: int, cache: int, attn: str, shown: bool, repeat: int,
                  chunk: int | None = None) -> list[Figure]:
    """Layer 0's attention (MLA, synthetic weights decoded once and kept) on `tokens` new
    positions after `cache` cached ones (random latents); shown: every tensor's statistics, histogram and corners are
    gathered as `stepper run` shows them, the prefill `chunk` positions at a time (default: SHOWN_CHUNK
    shown, the whole prompt silent; 0: the whole prompt). Reports the time, the attention core's share of the
    float32 GEMM rate measured here, and the peak RSS."""
    cfg = load_config(Path(model)) if model not in PRESETS else bench_config(model, None)
    source = CachedWeights(SyntheticWeights(cfg, 0), ATTENTION_CACHE_MB << 20)  # decoded once: the attention is timed
    transformer = Transformer(source)
    w, rng = LayerWeights(source, 0, transformer.scratch), np.random.default_rng(11)
    options = LayerOptions(attention=attn)
    emit = Emitter([shown_like_run] if shown else [])
    chunk = (SHOWN_CHUNK if shown else 0) if chunk is None else chunk
    core, times = CoreTimer(), []
    with core:
        for _ in range(2):  # untimed: a weight is kept from its second use on
            w.rope = transformer.rope(np.arange(1), Emitter())
            one = rng.standard_normal((1, 1, cfg.hidden_size), dtype=np.float32)
            mla_attention(one, w, LayerCache(), options, Emitter())
        for run in range(repeat):
            kv = KVCache(1)
            kv.layers[0] = random_cache(w, cfg, cache, attn, rng)

            def step(span: slice, kv: KVCache, emit: Emitter, run: int = run) -> None:
                x = np.random.default_rng([11, run, span.start]).standard_normal(
                    (1, span.stop - span.start, cfg.hidden_size), dtype=np.float32)  # made per chunk, never whole
                w.rope = transformer.rope(cache + np.arange(span.start, span.stop), Emitter())
                mla_attention(x, w, kv.layers[0], options, emit)

            core.seconds = 0.0
            start = time.perf_counter()
            in_chunks(step, tokens, chunk or tokens, kv, emit, derive.masked_future(cfg, 0, attn))
            times.append(time.perf_counter() - start)
    what = f"decode 1 token over {cache} cached positions" if tokens == 1 else f"prefill {tokens} tokens"
    flops, gemm = core_flops(cfg, tokens, cache, attn), gemm_rate()
    seen = "every tensor shown (statistics, histogram, corners)" if shown else "no tensor shown"
    note = f"{seen}; median of {repeat}"
    if 0 < chunk < tokens:
        note += f"; in chunks of {chunk} positions{' (each run twice: statistics, then histograms)' if shown else ''}"
    if core.seconds:
        note += (f"; attention core (kernels.attend) {core.seconds:.3g} s, {flops / core.seconds / 1e9:.1f} GFLOP/s = "
                 f"{flops / core.seconds / gemm:.0%} of the float32 GEMM rate here "
                 f"({gemm / 1e9:.1f} GFLOP/s, every core)")
    return [Figure(f"{cfg.name} attention ({attn}): {what}", float(np.median(times)), "s", peak_rss_mb(), note)]


def shown_like_run(event) -> None:
    """What `stepper run` computes of every tensor it shows (views.sinks.TensorRows)."""
    st = summary.stats(event.array)
    summary.histogram(event.array, known=st)
    summary.corners(event.array)


class CoreTimer:
    """Times kernels.attention.attend, the tiled attention core, while in a `with` block."""

    def __enter__(self):
        self.seconds, self.original = 0.0, kernels_attention.attend

        def timed(ops):
            start = time.perf_counter()
            result = self.original(ops)
            self.seconds += time.perf_counter() - start
            return result

        kernels_attention.attend = timed
        return self

    def __exit__(self, *_):
        kernels_attention.attend = self.original


def random_cache(w: LayerWeights, cfg: Config, cache: int, attn: str, rng: np.random.Generator) -> LayerCache:
    layer_cache = LayerCache()
    if cache:
        latents = rng.standard_normal((1, cache, cfg.kv_lora_rank), dtype=np.float32)
        k_pe = rng.standard_normal((1, 1, cache, cfg.qk_rope_head_dim), dtype=np.float32)
        for part in (slice(0, cache - 1), slice(cache - 1, cache)):  # two appends: the cache has room, as after a step
            layer_cache.extend_latent(latents[:, part], k_pe[:, :, part])
            if attn == "naive":
                layer_cache.extend_heads(*synthetic_cache.per_head_keys(latents[:, part], k_pe[:, :, part], w, cfg))
    return layer_cache


def core_flops(cfg: Config, tokens: int, cache: int, attn: str) -> float:
    """Multiply-adds x 2 of the attention core: the scores and the weighted values over the keys
    each query may attend (cache + t + 1 for query t)."""
    attended = tokens * cache + tokens * (tokens + 1) / 2  # summed over the queries
    per_key = (cfg.qk_head_dim + cfg.v_head_dim if attn == "naive"
               else 2 * cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    return 2.0 * cfg.num_attention_heads * attended * per_key


def gemm_rate() -> float:
    """float32 GEMM FLOP/s with stepper's own split: one 2048^3 product per core, side by side."""
    m = np.ones((2048, 2048), np.float32)
    cores = parallel.cores()
    once = median_time(lambda: parallel.split(list(range(cores)), lambda share: [m @ m for _ in share]), 3)
    return cores * 2 * 2048**3 / once


def long_context(model: str, say, prefills=(4096, 16384, 32768), caches=(8192, 32768, 131072),
                 shown_prefills=(4096,), shown_chunked=(32768,)) -> list[Figure]:
    """The long-context figures: naive prefills (what --attn auto runs where it fits; time, GEMM
    share and peak RSS), the shorter ones also with every tensor shown; absorbed prefills in
    chunks of SHOWN_CHUNK with every tensor shown (the memory bound of a long shown prefill: the
    32768-token one gathers 70 G scores and weights, twice, and takes about an hour on two
    cores); and decode steps over long caches (absorbed), shown."""
    figures = []
    for tokens in prefills:
        for shown in (False, True) if tokens in shown_prefills else (False,):
            say(f"{model} attention: prefill {tokens} tokens, {'every tensor shown' if shown else 'silent'}")
            figures += in_subprocess("attention", model=model, tokens=tokens, cache=0, attn="naive", shown=shown,
                                     repeat=1)
    for tokens in shown_chunked:
        say(f"{model} attention: absorbed prefill {tokens} tokens in chunks of {SHOWN_CHUNK}, every tensor shown")
        figures += in_subprocess("attention", model=model, tokens=tokens, cache=0, attn="absorb", shown=True, repeat=1)
    for cache in caches:
        say(f"{model} attention: decode over {cache} cached positions")
        figures += in_subprocess("attention", model=model, tokens=1, cache=cache, attn="absorb", shown=True, repeat=5)
    return figures


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


SCENARIOS = {"ceilings": ceilings, "fp8_rate": fp8_rate, "layer": layer_run, "torch": versus_torch,
             "indexed": indexed_prefill,
             "attention": attention_run, "experts": expert_products}


def scenario_main(argv: list[str]) -> None:
    name, *args = argv
    if name != "ceilings":
        parallel.single_threaded_blas()  # as the command line runs
    kwargs = json.loads(args[0]) if args else {}
    if "checkpoint" in kwargs:
        kwargs["checkpoint"] = Path(kwargs["checkpoint"])
    figures = SCENARIOS[name](**kwargs)
    print(json.dumps([f.__dict__ for f in figures]))


def in_subprocess(name: str, **kwargs) -> list[Figure]:
    argv = [sys.executable, "-m", "stepper.bench", name, json.dumps({k: str(v) if isinstance(v, Path) else v
                                                                      for k, v in kwargs.items()})]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"bench scenario {name} failed:\n{done.stderr[-2000:]}")
    return [Figure(**f) for f in json.loads(done.stdout.splitlines()[-1])]


# ---------------------------------------------------------------------------------------------
# Checkpoints the scenarios read


def bench_config(model: str, experts: int | None) -> Config:
    raw = dict(PRESETS[model])
    if experts is not None:
        raw.update(n_routed_experts=experts, _name_or_path=f"{model}-{experts}-experts")
    return Config.from_hf(raw, f"bench {model}")


def ensure_checkpoint(workdir: Path, cfg: Config, layers: range, seed: int = 0) -> Path:
    """The synthetic checkpoint of these layers, written once into workdir and reused."""
    folder = workdir / f"{cfg.name}-layers{layers.start}-{layers.stop - 1}-seed{seed}"
    if not (folder / INDEX).exists():
        files.make_folder(workdir)
        synth_checkpoint(SyntheticWeights(cfg, seed), folder, layers, force=True)
    return folder


def bench_checkpoints(workdir: Path) -> list[Path]:
    """The checkpoints the bench wrote into workdir. All are dropped from the page cache before
    the full-size MoE layer's is read back: 24 GB held its 16 GB beside the others' pages and
    the libraries only in part, and decode steps read 25-36 pages from disk while timed in two
    runs of three."""
    return sorted(folder for folder in workdir.iterdir() if (folder / INDEX).exists())


def moe_figures(checkpoint: Path, say, what: str, repeats: tuple[int, int] = (12, 3)) -> list[Figure]:
    """MoE layer 1 of the checkpoint: decode 1 token over a 1024-position cache, prefill 512 tokens."""
    say(f"MoE layer 1{what}: decode 1 token over a 1024-position cache")
    figures = in_subprocess("layer", checkpoint=checkpoint, layer=1, tokens=1, cache=1024, repeat=repeats[0])
    say(f"MoE layer 1{what}: prefill 512 tokens")
    return figures + in_subprocess("layer", checkpoint=checkpoint, layer=1, tokens=512, cache=0, repeat=repeats[1])


def int4_versus_fp8(workdir: Path, model: str, say, fp8: list[Figure] | None = None,
                    repeats: tuple[int, int] = (12, 3)) -> list[Figure]:
    """The MoE layer with INT4 experts, decode and prefill, and each as a ratio to the same layer
    with FP8 experts (`fp8`: its two figures, measured here when not given). An INT4 expert is
    half the bytes of an FP8 one."""
    cfg = bench_config(model, None)
    fp8_checkpoint = ensure_checkpoint(workdir, cfg, range(1, 2))
    if fp8 is None:
        forget_page_cache(fp8_checkpoint)
        fp8 = moe_figures(fp8_checkpoint, say, " (FP8)", repeats)
    say("writing (once) the layer 1 checkpoint with INT4 experts: about 10 GB at full size")
    int4 = ensure_checkpoint(workdir, replace(requantized(cfg, "int4"), name=f"{cfg.name}-int4-experts"), range(1, 2))
    for folder in bench_checkpoints(workdir):  # the FP8 layer's pages make room (see bench_checkpoints)
        forget_page_cache(folder)
    figures = moe_figures(int4, say, " with INT4 experts", repeats)
    ratios = [Figure(f"{cfg.name} layer 1, {kind}: INT4 experts / FP8 experts", mine.value / theirs.value, "x", None,
                     f"{mine.value:.3g} s against {theirs.value:.3g} s")
              for kind, mine, theirs in zip(("decode 1 token", "prefill 512 tokens"), figures, fp8)]
    say("one routed expert, INT4 against FP8: 1, 11 and 512 tokens")
    experts = [f for tokens, pairs in ((1, 21), (11, 11), (512, 5))
               for f in in_subprocess("experts", fp8=fp8_checkpoint, int4=int4, tokens=tokens, pairs=pairs)]
    return figures + ratios + experts


def run_all(workdir: Path, with_torch: bool, say, with_int4: bool = True, with_indexer: bool = False) -> list[Figure]:
    """Every figure of docs/performance.md's tables; `say` reports progress lines."""
    say("measuring the machine's ceilings")
    figures = in_subprocess("ceilings")
    ceil = Ceilings.of(figures)
    kimi = bench_config("kimi-k2", None)
    say("writing (once) the full-size layer 1 checkpoint: about 17 GB, several minutes")
    moe = ensure_checkpoint(workdir, kimi, range(1, 2))
    for folder in bench_checkpoints(workdir):  # the others' too: see bench_checkpoints
        forget_page_cache(folder)
    decode, prefill = moe_figures(moe, say, "")  # decode steps vary: a median of 11
    fp8 = (with_floor([decode], layer_floor(kimi, 1, 1, 1024, ceil))
           + with_floor([prefill], layer_floor(kimi, 1, 512, 0, ceil)))
    figures += fp8
    if with_int4:
        figures += anchored(int4_versus_fp8(workdir, "kimi-k2", say, fp8), "no slower than FP8")
    dense = ensure_checkpoint(workdir, kimi, range(1))
    forget_page_cache(dense)
    say("dense layer 0: decode and prefill")
    figures += with_floor(in_subprocess("layer", checkpoint=dense, layer=0, tokens=1, cache=1024, repeat=8),
                          layer_floor(kimi, 0, 1, 1024, ceil))
    figures += with_floor(in_subprocess("layer", checkpoint=dense, layer=0, tokens=512, cache=0, repeat=3),
                          layer_floor(kimi, 0, 512, 0, ceil))
    if with_torch:
        small = ensure_checkpoint(workdir, bench_config("kimi-k2", 16), range(1, 2))
        forget_page_cache(small)
        for tokens in (1, 32, 512):
            say(f"16-expert layer against transformers, T={tokens}")
            figures += anchored(in_subprocess("torch", checkpoint=small, tokens=tokens,
                                              pairs={1: 9, 32: 7, 512: 5}[tokens]), "no slower than transformers")
        say("16-expert layer against transformers, T=1, stepper's weight cache warm")
        figures += anchored(in_subprocess("torch", checkpoint=small, tokens=1, pairs=9, cache_mb=WARM_CACHE_MB),
                            "no slower than transformers")
    if with_indexer:
        figures += indexer_figures(workdir, say)
    return figures


def indexer_figures(workdir: Path, say, model: str = "deepseek-v3.2", tokens: int = 4096,
                    repeat: int = 3) -> list[Figure]:
    """DeepSeek-V3.2's layer 0 (dense, about 0.6 GB), written once: a prefill's indexer apart from its attention."""
    say(f"writing (once) the {model} layer 0 checkpoint")
    folder = ensure_checkpoint(workdir, bench_config(model, None), range(1))
    forget_page_cache(folder)
    say(f"{model} layer 0: prefill {tokens} tokens, the indexer apart from the attention")
    return in_subprocess("indexed", checkpoint=folder, layer=0, tokens=tokens, repeat=repeat)


if __name__ == "__main__":
    scenario_main(sys.argv[1:])
