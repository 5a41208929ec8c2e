"""Long contexts: the attention of one layer alone (synthetic weights, nothing read from disk),
naive and absorbed prefills and decode steps over long caches, silent or with every tensor shown."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from stepper.bench.ceilings import core_flops, gemm_rate
from stepper.bench.checkpoints import bench_config
from stepper.bench.figures import Figure, in_subprocess, peak_rss_mb
from stepper.config import Config, load_config
from stepper.families import derive
from stepper.kernels import attention as kernels_attention
from stepper.kernels.weight_cache import CachedWeights
from stepper.model import KVCache, Transformer, synthetic_cache
from stepper.model.attention import mla_attention
from stepper.model.cache import LayerCache
from stepper.model.layer_weights import LayerWeights
from stepper.model.options import LayerOptions
from stepper.prefill import in_chunks
from stepper.presets import PRESETS
from stepper.seams.trace import Emitter
from stepper.views import summary
from stepper.weights.seeded import SyntheticWeights

ATTENTION_CACHE_MB = 1024  # holds a full-size attention's decoded weights (about 0.4 GB)


SHOWN_CHUNK = 1024  # a shown prefill runs this many positions at a time (stepper.prefill, as `run --chunk`)


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
        note += f"; in chunks of {chunk} positions"
    if core.seconds:
        note += (f"; attention core (kernels.attend) {core.seconds:.3g} s, {flops / core.seconds / 1e9:.1f} GFLOP/s = "
                 f"{flops / core.seconds / gemm:.0%} of the float32 GEMM rate here "
                 f"({gemm / 1e9:.1f} GFLOP/s, every core)")
    return [Figure(f"{cfg.name} attention ({attn}): {what}", float(np.median(times)), "s", peak_rss_mb(), note)]


def shown_like_run(event) -> None:
    """What `stepper run` computes of every tensor it shows (views.sinks.TensorRows)."""
    summary.histogram(event.array)  # the statistics too (summary.look)
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


def long_context(model: str, say, prefills=(4096, 16384, 32768), caches=(8192, 32768, 131072),
                 shown_prefills=(4096,), shown_chunked=(32768,)) -> list[Figure]:
    """The long-context figures: naive prefills (what --attn auto runs where it fits; time, GEMM
    share and peak RSS), the shorter ones also with every tensor shown; absorbed prefills in
    chunks of SHOWN_CHUNK with every tensor shown (the memory bound of a long shown prefill: the
    32768-token one gathers 70 G scores and weights, the chunks binned before their ranges were
    final a second time, and took about an hour on two cores); and decode steps over long caches (absorbed), shown."""
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
