"""What a layer emits, learned from the model code itself: the family's decoder layer runs once on
a miniature of the config (same branches, tiny sizes, synthetic weights), a prefill of two
positions then a decode step, with a recording emitter. The names it emits, in order, are the
layer's sequence for that config and those options; nothing keeps them a second time. Memoised
per (family, miniature, options): the first ask costs milliseconds, later ones nothing."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from stepper import families
from stepper.families.family import Family
from stepper.model.cache import KVCache
from stepper.model.options import Attention, IndexScoring, LayerOptions
from stepper.model.transformer import Transformer
from stepper.seams.trace import Emitter, Recorder
from stepper.weights.synthetic import SyntheticWeights

DEFAULT = LayerOptions()
PREFILL = 2  # positions of the miniature's prefill; a decode step of one follows


@dataclass(frozen=True)
class Emitted:
    key: str  # the catalogue name: `self_attn.k_pe`
    shape: tuple[int, ...]  # its shape in the miniature (full-size shapes come from the catalogue's dims)


def layer_emits(cfg: Any, layer: int, options: LayerOptions = DEFAULT, step: str = "prefill") -> tuple[Emitted, ...]:
    """The tensors layer `layer` of cfg emits, in order, with these options, in a prefill
    (step "prefill") or a decode step after it ("decode")."""
    family = families.family_for(cfg)
    prefill, decode = recorded(family, family.miniature(cfg, layer), options)
    return prefill if step == "prefill" else decode


def layer_keys(cfg: Any, layer: int, attention: Attention = "naive", index_scoring: IndexScoring = "exact") -> list[str]:
    """The names layer `layer` of cfg emits, in order, on this attention path and index scoring."""
    return [e.key for e in layer_emits(cfg, layer, LayerOptions(attention=attention, index_scoring=index_scoring))]


@lru_cache(maxsize=512)
def recorded(family: Family, mini: Any, options: LayerOptions) -> tuple[tuple[Emitted, ...], tuple[Emitted, ...]]:
    """Run the miniature's layer 0: a prefill of PREFILL positions, then one decode step.
    -> what each step emitted, in order"""
    model = Transformer(SyntheticWeights(mini, seed=0), options.dispatch, options.index_scoring, family.decoder_layer)
    cache = KVCache(1)
    hidden = np.random.default_rng(0).standard_normal((1, PREFILL + 1, mini.hidden_size), dtype=np.float32)  # [B, T, d]
    steps = []
    for span in (slice(0, PREFILL), slice(PREFILL, PREFILL + 1)):
        recorder = Recorder()
        positions = np.arange(span.start, span.stop)
        model.layer(0, hidden[:, span], model.rope(positions, Emitter()), cache, Emitter([recorder]), options.attention)
        steps.append(tuple(Emitted(e.key, tuple(e.array.shape)) for e in recorder.events))
    return steps[0], steps[1]
