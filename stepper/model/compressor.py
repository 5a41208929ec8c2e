"""DeepSeek-V4's compressor: every closed window of m tokens pooled into one cache entry.

    a = x @ kv_proj^T,  g = x @ gate_proj^T + ape[pos mod m]          (per token, per channel)
    entry_w = RMSNorm( sum_slots softmax_slots(g) * a ) turned by RoPE at the window's start w*m

The softmax runs over the window's slots separately for every channel. HCA (m = 128) has m
slots of Dc channels (the entry dims). CSA (m = 4) projects to 2*Dc channels and its windows overlap:
the slots of window w are window w-1's tokens' first Dc channels followed by window w's tokens'
last Dc channels (2m slots); window 0 has no predecessor (kv 0, gate -inf: weight 0).
Entry w is visible to a query at position p iff w < (p+1) // m.

Tokens of an unfinished window wait in the state (`Pending`) until the window closes; at m = 4 the
state also keeps the last closed window's first halves for the next window's slots.

Weights (relative to the layer, transformers' names): `<module>.kv_proj.weight` [c, d],
`<module>.gate_proj.weight` [c, d], `<module>.position_bias` [m, c] (the published `ape`),
`<module>.kv_norm.weight` [Dc], c = 2*Dc at m = 4 else Dc; <module> is
`self_attn.compressor` or `self_attn.compressor.indexer`.
Shapes: B batch, T new positions, Wc windows closed now, m the ratio, c projected channels, Dc entry
dims, r pending tokens, Ec entries made.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from stepper.kernels.growing import GrowingArray
from stepper.kernels.linear import linear
from stepper.model.layer_weights import LayerWeights
from stepper.model.ops import rms_norm, softmax
from stepper.model.tail_rope import rotate_tail
from stepper.seams.swap import exercise
from stepper.seams.trace import Emitter

OVERLAP_RATIO = 4  # CSA's windows overlap; HCA's (128) do not


@dataclass(frozen=True)
class Pending:
    """One compressor's state between calls: the unfinished window's projections kv, gate
    [B, r, c] (r < m; gate without ape), the last closed window's first halves (m = 4 only:
    kv [B, m, Dc] and gate [B, m, Dc] with ape added; None before the first window), and
    every entry made so far [B, Ec, Dc] (normalised and turned)."""

    kv: np.ndarray
    gate: np.ndarray
    entries: np.ndarray
    overlap_kv: np.ndarray | None = None
    overlap_gate: np.ndarray | None = None
    room: GrowingArray = field(default_factory=lambda: GrowingArray(1), compare=False, repr=False)
    # the spare room after the entries (kernels.growing), so a closing window rarely copies them all

    @staticmethod
    def empty(batch: int, channels: int, width: int) -> Pending:
        none = np.zeros((batch, 0, channels), np.float32)
        return Pending(none, none, np.zeros((batch, 0, width), np.float32))

    @property
    def windows_closed(self) -> int:
        return self.entries.shape[1]


@dataclass(frozen=True)
class Compressor:
    """One compressor: its weights' prefix, its emitted names' prefix, ratio m, entry dims Dc, norm eps."""

    module: str  # "self_attn.compressor" or "self_attn.compressor.indexer"
    shown: str  # the emitted names' prefix: "attn.compressor" or "attn.indexer.compressor"
    ratio: int
    width: int
    eps: float

    @property
    def overlapping(self) -> bool:
        return self.ratio == OVERLAP_RATIO

    @property
    def channels(self) -> int:
        return 2 * self.width if self.overlapping else self.width


def compress(x: np.ndarray, w: LayerWeights, comp: Compressor, state: Pending, turn_of, emit: Emitter) -> Pending:
    """Project x [B, T, d], close every window the new tokens complete, and return the new state;
    turn_of(positions) -> Turn for the windows' start positions."""
    kv = emit(f"{comp.shown}.kv", linear(x, w.matrix(f"{comp.module}.kv_proj.weight")))  # [B, T, c]
    gate = emit(f"{comp.shown}.gate", linear(x, w.matrix(f"{comp.module}.gate_proj.weight")))  # [B, T, c]
    kv = np.concatenate([state.kv, kv], axis=1)  # [B, r + T, c]
    gate = np.concatenate([state.gate, gate], axis=1)  # [B, r + T, c]
    B, n, c = kv.shape
    W = n // comp.ratio
    closed = W * comp.ratio
    chunk_kv = kv[:, :closed].reshape(B, W, comp.ratio, c)  # [B, Wc, m, c]
    chunk_gate = gate[:, :closed].reshape(B, W, comp.ratio, c) + w(f"{comp.module}.position_bias")  # [B, Wc, m, c]
    slots_kv, slots_gate, state = slots(chunk_kv, chunk_gate, comp, state)  # [B, Wc, slots, Dc] each
    slots_gate = emit(f"{comp.shown}.slot_gate", slots_gate)
    weights, pooled = gated_pool(slots_kv, slots_gate)  # [B, Wc, slots, Dc], [B, Wc, Dc]
    shown = emit(f"{comp.shown}.slot_weights", weights)
    if shown is not weights:  # the weights replaced where they are shown (a patch): the windows pooled by those
        pooled = np.sum(slots_kv * shown, axis=2)
    pooled = emit(f"{comp.shown}.pooled", pooled)
    normed = rms_norm(pooled, w(f"{comp.module}.kv_norm.weight"), comp.eps)  # [B, Wc, Dc]
    starts = (state.windows_closed + np.arange(W)) * comp.ratio  # [Wc]
    entries = emit(f"{comp.shown}.entries", rotate_tail(normed, turn_of(starts)))  # [B, Wc, Dc]
    if W:  # the entries so far and the new ones, appended in spare room: at long contexts most of the memory
        state = replace(state, entries=state.room.concatenate(state.entries, entries))
    return replace(state, kv=kv[:, closed:], gate=gate[:, closed:])


@exercise
def gated_pool(slots_kv: np.ndarray, slots_gate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each window's slots pooled by a softmax of their gates over the slots, channel by channel.
    slots_kv, slots_gate [B, Wc, slots, Dc] -> weights [B, Wc, slots, Dc], pooled [B, Wc, Dc]"""
    weights = softmax(slots_gate, axis=2)  # [B, Wc, slots, Dc]: each channel's weights sum to 1 over the slots
    return weights, np.sum(slots_kv * weights, axis=2)


def slots(chunk_kv: np.ndarray, chunk_gate: np.ndarray, comp: Compressor, state: Pending):
    """The slots each closed window pools over, and the state's overlap after them.
    [B, Wc, m, c] each -> [B, Wc, slots, Dc] each (slots m, or 2m at m = 4), state"""
    if not comp.overlapping:
        return chunk_kv, chunk_gate, state
    B, W, m, _ = chunk_kv.shape
    if W == 0:
        empty = np.zeros((B, 0, 2 * m, comp.width), np.float32)
        return empty, empty, state
    first_kv, second_kv = chunk_kv[..., : comp.width], chunk_kv[..., comp.width :]  # [B, Wc, m, Dc]
    first_gate, second_gate = chunk_gate[..., : comp.width], chunk_gate[..., comp.width :]
    if state.overlap_kv is None:  # no window before the first: kv 0, gate -inf
        before_kv = np.zeros((B, 1, m, comp.width), np.float32)
        before_gate = np.full((B, 1, m, comp.width), -np.inf, np.float32)
    else:
        before_kv, before_gate = state.overlap_kv[:, None], state.overlap_gate[:, None]  # [B, 1, m, Dc]
    prev_kv = np.concatenate([before_kv, first_kv[:, :-1]], axis=1)  # [B, Wc, m, Dc]
    prev_gate = np.concatenate([before_gate, first_gate[:, :-1]], axis=1)  # [B, Wc, m, Dc]
    slots_kv = np.concatenate([prev_kv, second_kv], axis=2)  # [B, Wc, 2*m, Dc]
    slots_gate = np.concatenate([prev_gate, second_gate], axis=2)  # [B, Wc, 2*m, Dc]
    return slots_kv, slots_gate, replace(state, overlap_kv=first_kv[:, -1], overlap_gate=first_gate[:, -1])


def visible_entries(positions: np.ndarray, ratio: int) -> np.ndarray:
    """How many entries each query position sees: (p + 1) // m.  [T] -> [T]"""
    return (np.asarray(positions) + 1) // ratio
