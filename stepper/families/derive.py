"""What a layer emits, learned from the model code itself: the family's decoder layer runs once on
a miniature of the config (same branches, tiny sizes, synthetic weights), a prefill of two
positions then a decode step, with a recording emitter. The names it emits, in order, are the
layer's sequence for that config and those options; nothing keeps them a second time. Memoised
per (family, miniature, options): the first ask costs milliseconds, later ones nothing.

The same run says what a tensor over the attended positions of its new positions (attention
scores, an indexer's choices) holds at a masked future position: a tensor with an axis that
shrinks from the prefill to the decode step (its new positions, 2 -> 1) and one that grows (its
attended positions, 2 -> 3) holds, for query 0 at attended position 1, that value (`masked_future`;
a chunked prefill widens each chunk's rows with it: stepper.prefill)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import numpy as np

from stepper import families
from stepper.families.family import Family
from stepper.model.options import Attention, IndexScoring, LayerOptions
from stepper.seams.trace import Emitter, Recorder

DEFAULT = LayerOptions()
PREFILL = 2  # positions of the miniature's prefill; a decode step of one follows


@dataclass(frozen=True)
class Emitted:
    key: str  # the catalogue name: `self_attn.k_pe`
    shape: tuple[int, ...]  # its shape in the miniature (full-size shapes come from the catalogue's dims)


def global_names(cfg: Any, keys) -> list[str]:
    """The model's names outside the layers among `keys` (embed, rope_cos, rope_sin, norm, logits),
    each followed by MiniCPM3's scaled one (embed_scaled, norm_scaled: model.transformer, model.scalings)."""
    scaled = {"embed": "embed_scaled", "norm": "norm_scaled"} if getattr(cfg, "has_mup_scalings", False) else {}
    return list(dict.fromkeys(name for key in keys for name in (key, scaled.get(key)) if name))


@dataclass(frozen=True)
class ModelNames:
    """What the model around the layers emits: before its first layer, after its last, and for a
    lone layer (the step's context: MLA's rotary tables; nothing for DeepSeek-V4)."""

    start: tuple[str, ...]
    end: tuple[str, ...]
    lone: tuple[str, ...]


def model_names(cfg: Any) -> ModelNames:
    """The names cfg's model emits outside its layers, learned from a whole pass of its layer 0's
    miniature (the model's code around the layers takes no per-layer branch)."""
    family = families.family_for(cfg)
    return around(family, family.miniature(cfg, 0))


@lru_cache(maxsize=64)
def around(family: Family, mini: Any) -> ModelNames:
    model = family.build(family.synthetic(mini, 0))
    ids, positions = np.arange(PREFILL)[None] % mini.vocab_size, np.arange(PREFILL)  # [B, T], [T]
    whole, lone = Recorder(), Recorder()
    model.forward(ids, positions, Emitter([whole]), family.cache(mini))
    model.context(ids, positions, Emitter([lone]))
    inside = [k for k, e in enumerate(whole.events) if e.layer is not None]
    names = [e.name for e in whole.events]
    return ModelNames(tuple(names[:inside[0]]), tuple(names[inside[-1] + 1:]), tuple(e.name for e in lone.events))


def layer_emits(cfg: Any, layer: int, options: LayerOptions = DEFAULT,
                step: Literal["prefill", "decode"] = "prefill") -> tuple[Emitted, ...]:
    """The tensors layer `layer` of cfg emits, in order, with these options, in a prefill
    (step "prefill") or a decode step after it ("decode")."""
    family = families.family_for(cfg)
    prefill, decode = recorded(family, family.miniature(cfg, layer), options)
    return prefill if step == "prefill" else decode


def layer_keys(cfg: Any, layer: int, attention: Attention = "naive",
               index_scoring: IndexScoring = "exact") -> list[str]:
    """The names layer `layer` of cfg emits, in order, on this attention path and index scoring."""
    return [e.key for e in layer_emits(cfg, layer, LayerOptions(attention=attention, index_scoring=index_scoring))]


def masked_future(cfg: Any, layer: int, attention: Attention = "naive",
                  index_scoring: IndexScoring = "exact") -> dict[str, float]:
    """Name -> the value at a masked future position, for each tensor of the layer that has one."""
    family = families.family_for(cfg)
    options = LayerOptions(attention=attention, index_scoring=index_scoring)
    return dict(traced(family, family.miniature(cfg, layer), options)[2])


def recorded(family: Family, mini: Any, options: LayerOptions) -> tuple[tuple[Emitted, ...], tuple[Emitted, ...]]:
    """What the miniature's layer 0 emits in its prefill and in its decode step, in order."""
    prefill, decode, _ = traced(family, mini, options)
    return prefill, decode


@lru_cache(maxsize=512)
def traced(family: Family, mini: Any, options: LayerOptions) -> tuple[tuple[Emitted, ...], tuple[Emitted, ...],
                                                                     tuple[tuple[str, float], ...]]:
    """Run the miniature's last layer (after the layers before it, silent: a layer that reads an earlier
    one's latent has a miniature of two): a prefill of PREFILL positions, then one decode step.
    -> what each step emitted, in order; (name, value at a masked future position) pairs"""
    model = family.build(family.synthetic(mini, 0), options)  # every choice, the delta rule's too
    cache = family.cache(mini)
    shape = [PREFILL + 1 if size is None else size for size in family.stream(mini)]
    shape[0] = 1
    hidden = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)  # [B, T, ...]: the layer's input
    ids = np.arange(PREFILL + 1)[None] % mini.vocab_size  # [B, T]
    steps = []
    for span in (slice(0, PREFILL), slice(PREFILL, PREFILL + 1)):
        recorder = Recorder()
        context = model.context(ids[:, span], np.arange(span.start, span.stop), Emitter())
        for i in range(mini.num_hidden_layers):
            shown = Emitter([recorder]) if i == mini.num_hidden_layers - 1 else Emitter()
            model.layer(i, hidden[:, span], context, cache, shown, options.attention)
        steps.append({e.key: np.asarray(e.array) for e in recorder.events})
    prefill, decode = steps
    futures = tuple((key, future) for key, array in prefill.items()
                    if (future := future_value(array, decode.get(key))) is not None)
    return (tuple(Emitted(k, a.shape) for k, a in prefill.items()),
            tuple(Emitted(k, a.shape) for k, a in decode.items()), futures)


def future_value(prefill: np.ndarray, decode: np.ndarray | None) -> float | None:
    """The prefill's value for query 0 at attended position 1, for a tensor with an axis of new
    positions (PREFILL in the prefill, 1 in the decode step) and one of attended positions
    (PREFILL, then PREFILL + 1); None for any other tensor."""
    if decode is None or decode.ndim != prefill.ndim:
        return None
    pairs = list(zip(prefill.shape, decode.shape))
    new = next((i for i, sizes in enumerate(pairs) if sizes == (PREFILL, 1)), None)
    attended = next((i for i, sizes in enumerate(pairs) if sizes == (PREFILL, PREFILL + 1)), None)
    if new is None or attended is None:
        return None
    at = [0] * prefill.ndim
    at[attended] = 1
    return float(prefill[tuple(at)])
