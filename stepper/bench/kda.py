"""`stepper bench --kda`: one full-size Kimi Linear KDA layer's attention (Kimi-Linear-48B-A3B's
layer 0: 32 heads of 128, synthetic float32 weights held in memory, nothing read from disk):
decode one token after a 4096-token prefill's state, and a 4096-token prefill, each with its peak
RSS and the share of its time spent in the state update (the delta rule: stepper.model.kda's
`gated_delta_rule`, or the chunked form in kernels.kda_chunked). Run in a subprocess (scenario `kda`)."""

from __future__ import annotations

import time

import numpy as np

from stepper.bench.figures import Figure, peak_rss_mb
from stepper.families import kimi_linear as kl
from stepper.kernels import kda_chunked
from stepper.model import kda
from stepper.model.cache import KdaCache
from stepper.model.kimi_linear_layer import published
from stepper.model.layer_weights import LayerWeights
from stepper.model.options import LayerOptions
from stepper.presets import preset
from stepper.seams.trace import Emitter
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.source import ArrayWeights

MODEL = "kimi-linear-48b-a3b"


class DeltaRuleTimer:
    """Times the state update (both forms) while in a `with` block."""

    def __enter__(self):
        self.seconds = 0.0
        self.originals = kda_chunked.chunked, kda.gated_delta_rule

        def timed(fn):
            def run(*args, **kwargs):
                start = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    self.seconds += time.perf_counter() - start
            return run

        kda_chunked.chunked, kda.gated_delta_rule = (timed(fn) for fn in self.originals)
        return self

    def __exit__(self, *_):
        kda_chunked.chunked, kda.gated_delta_rule = self.originals


def kda_layer(tokens: int, repeat: int, form: str = "chunked") -> tuple[str, float, str]:
    """The KDA attention of layer 0 on `tokens` new positions (1: a decode step from the state a
    4096-token prompt leaves, made once untimed): what was timed, the median of `repeat` runs in
    seconds, and a note with the state update's share."""
    cfg, options, rng = preset(MODEL), LayerOptions(delta_rule=form), np.random.default_rng(3)
    source = SyntheticWeights(cfg, 0)
    arrays = {name: source.get(name) for name in cfg.layer_shapes(0)}  # float32, in memory: nothing read when timed
    w = published(LayerWeights(ArrayWeights(cfg, arrays), 0))
    start_cache = KdaCache()
    if tokens == 1:
        prompt = rng.standard_normal((1, 4096, cfg.hidden_size), dtype=np.float32)
        kda.kda_attention(prompt, w, start_cache, options, Emitter())
    x = rng.standard_normal((1, tokens, cfg.hidden_size), dtype=np.float32)
    times, shares = [], []
    for _ in range(repeat):
        cache = KdaCache({k: v.copy() for k, v in start_cache.conv.items()},
                             None if start_cache.state is None else start_cache.state.copy(), start_cache.length)
        with DeltaRuleTimer() as update:
            begin = time.perf_counter()
            kda.kda_attention(x, w, cache, options, Emitter())
            times.append(time.perf_counter() - begin)
        shares.append(update.seconds / times[-1])
    what = "decode 1 token after a 4096-token prompt" if tokens == 1 else f"prefill {tokens} tokens ({form})"
    note = (f"median of {repeat}; state update {np.median(shares):.0%} of the time; the layer keeps "
            f"{kl.kda_layer_bytes(cfg):,} B (S and conv inputs) at any length")
    return f"{cfg.name} layer 0 KDA attention: {what}", float(np.median(times)), note


def kda_figures(say, in_subprocess) -> list:
    """The three figures, each measured in a fresh subprocess (stepper.bench.figures.in_subprocess)."""
    say(f"{MODEL} KDA layer 0: decode 1 token, prefill 4096 tokens")
    return (in_subprocess("kda", tokens=1, repeat=11) + in_subprocess("kda", tokens=4096, repeat=3)
            + in_subprocess("kda", tokens=4096, repeat=1, form="recurrent"))


def kda_run(tokens: int, repeat: int, form: str = "chunked") -> list[Figure]:
    """A full-size Kimi Linear KDA layer's attention (kda_layer), with the peak RSS."""
    name, seconds, note = kda_layer(tokens, repeat, form)
    return [Figure(name, seconds, "s", peak_rss_mb(), note)]
