"""`stepper bench`'s default run: every figure of docs/performance.md's tables, each scenario in
its own process, with its floor from the ceilings measured first."""

from __future__ import annotations

from pathlib import Path

from stepper.bench import kda
from stepper.bench.ceilings import Ceilings, layer_floor
from stepper.bench.checkpoints import bench_checkpoints, bench_config, ensure_checkpoint, forget_page_cache
from stepper.bench.figures import Figure, anchored, in_subprocess, with_floor
from stepper.bench.layers import int4_versus_fp8, moe_figures

WARM_CACHE_MB = 8192  # holds every decoded weight of the 16-expert layer (about 3.4 GB)


def run_all(workdir: Path, with_torch: bool, say, with_int4: bool = True, with_indexer: bool = False,
            with_kda: bool = False) -> list[Figure]:
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
            pairs = {1: 9, 32: 7, 512: 5}[tokens]
            say(f"16-expert layer against transformers, T={tokens}")
            figures += anchored(in_subprocess("torch", checkpoint=small, tokens=tokens, pairs=pairs),
                                "no slower than transformers")
            # the same work as transformers' (float32 weights in memory): what the FP8 decoding adds is the difference
            say(f"16-expert layer against transformers, T={tokens}, stepper's weight cache warm")
            figures += anchored(in_subprocess("torch", checkpoint=small, tokens=tokens, pairs=pairs,
                                              cache_mb=WARM_CACHE_MB), "no slower than transformers")
    if with_indexer:
        figures += indexer_figures(workdir, say)
    if with_kda:
        figures += kda.kda_figures(say, in_subprocess)
    return figures


def indexer_figures(workdir: Path, say, model: str = "deepseek-v3.2", tokens: int = 4096,
                    repeat: int = 3) -> list[Figure]:
    """DeepSeek-V3.2's layer 0 (dense, about 0.6 GB), written once: a prefill's indexer apart from its attention."""
    say(f"writing (once) the {model} layer 0 checkpoint")
    folder = ensure_checkpoint(workdir, bench_config(model, None), range(1))
    forget_page_cache(folder)
    say(f"{model} layer 0: prefill {tokens} tokens, the indexer apart from the attention")
    return in_subprocess("indexed", checkpoint=folder, layer=0, tokens=tokens, repeat=repeat)
