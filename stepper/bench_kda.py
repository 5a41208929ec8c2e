"""`stepper bench --kda`: one full-size Kimi Linear KDA layer's attention (Kimi-Linear-48B-A3B's
layer 0: 32 heads of 128, synthetic float32 weights held in memory, nothing read from disk):
decode one token after a 4096-token prefill's state, and a 4096-token prefill, each with its peak
RSS and the share of its time spent in the state update (the delta rule: stepper.model.kda's
`gated_delta_rule`, or the chunked form in kernels.kda_chunked). Run in a subprocess by stepper.bench."""

from __future__ import annotations

import time

import numpy as np

from stepper.families import kimi_linear as kl
from stepper.kernels import kda_chunked
from stepper.model import kda
from stepper.seams.trace import Emitter

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


def kda_layer(tokens: int, repeat: int, form: str = "chunked") -> list:
    """The KDA attention of layer 0 on `tokens` new positions (1: a decode step from the state a
    4096-token prompt leaves, made once untimed); the median of `repeat` runs."""
    from stepper.bench import Figure, peak_rss_mb

    cfg = kl.preset(MODEL)
    rng = np.random.default_rng(3)
    arrays = {name: kl.synthetic_value(name, shape, rng) for name, shape in kl.layer_shapes(cfg, 0).items()}
    w = kl.PublishedLayerWeights(kl.KimiLinearWeights.of_arrays(cfg, arrays), 0)
    start_cache = kda.KdaCache()
    if tokens == 1:
        kda.kda_attention(rng.standard_normal((1, 4096, cfg.hidden_size), dtype=np.float32), w, cfg, start_cache,
                          Emitter())
    x = rng.standard_normal((1, tokens, cfg.hidden_size), dtype=np.float32)
    times, shares = [], []
    for _ in range(repeat):
        cache = kda.KdaCache({k: v.copy() for k, v in start_cache.conv.items()},
                             None if start_cache.state is None else start_cache.state.copy(), start_cache.length)
        with DeltaRuleTimer() as update:
            begin = time.perf_counter()
            kda.kda_attention(x, w, cfg, cache, Emitter(), form)
            times.append(time.perf_counter() - begin)
        shares.append(update.seconds / times[-1])
    what = "decode 1 token after a 4096-token prompt" if tokens == 1 else f"prefill {tokens} tokens ({form})"
    note = (f"median of {repeat}; state update {np.median(shares):.0%} of the time; the layer keeps "
            f"{kl.kda_layer_bytes(cfg):,} B (S and conv inputs) at any length")
    return [Figure(f"{cfg.name} layer 0 KDA attention: {what}", float(np.median(times)), "s", peak_rss_mb(), note)]


def kda_figures(say, in_subprocess) -> list:
    say(f"{MODEL} KDA layer 0: decode 1 token, prefill 4096 tokens")
    return (in_subprocess("kda", tokens=1, repeat=11) + in_subprocess("kda", tokens=4096, repeat=3)
            + in_subprocess("kda", tokens=4096, repeat=1, form="recurrent"))
