"""How attention runs fast and in bounded memory: over tiles of queries and keys with an online
softmax, and every head's rows in one product where the heads share their keys.

The math is model.attention's whole-matrix lines (`held`); these kernels compute the same, tested
equal to them to float32 round-off (tests/unit/test_attention_kernels.py), without ever holding
the [B, H, T, S] scores: memory is the inputs, the output and one tile per core. Which of the two
runs is chosen here too (`held_or_tiled`): the whole lines while the scores fit in WHOLE_SCORES.

An attention is a set of `Operands`: scores = scale * sum_i queries[i] @ keys[i]^T, then the causal
mask (the T new positions are the last T of S), an optional extra mask, softmax over the keys, and
the weights times `values`. The naive path has one per-head query and key ([B, H, S, qk_head]);
the absorbed path two (the latent part and the rotary part) whose keys every head shares
([B, one, S, d]), as are its values, the latents. A model with attention sinks (gpt-oss, Hy4) has
one more logit per head, `sinks`, in every row's softmax as a key of value zero: its weight is
dropped, so a row's weights sum to less than 1 (activations.softmax_with_sinks).

The online softmax (the flash-attention recurrence) visits the key tiles of a query tile in turn,
keeping per query row the running maximum m, the running sum l of exp(score - m) and the running
weighted sum of values; when a tile raises m, what was gathered is rescaled by exp(m_old - m_new).
The result is the weighted sum over l. A sink logit is the first key visited: m = sinks[h], l = 1,
the weighted sum 0. A shown attention, whose weights a sink (a listener of emitted tensors) looks
at, makes them a tile of whole rows at a time instead, and its output with them (`Softmaxed`).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from stepper.kernels import activations, parallel
from stepper.seams.trace import Emitter
from stepper.tensors.tiled import Tiled

TILE_SCORES = 1 << 20  # scores of one tile: [B, H, T, S] cut to its heads, queries and keys (4 MB in float32)
KEY_TILE = 512  # keys per tile, before a short query tile widens it
QUERY_TILE = 256  # queries of one head per tile
WHOLE_SCORES = 1 << 22  # up to this many scores [B, H, T, S], attention runs on whole arrays
KEPT_ROW_BYTES = 1 << 26  # rows of scores kept for the next to ask (`Operands.rows`): 64 MB
SHARED_ROWS = 256  # query rows of a block of a tile of rows shared out across the cores (`every_core_scores`)
FEWEST_SHARED_ROWS = 32  # fewer query rows than twice this: one product


def shared_matmul(x: np.ndarray, shared: np.ndarray) -> np.ndarray:
    """np.matmul(x, shared[:, None]), every head times the same matrix, as one product of all
    heads' rows (a decode step: one 64-row product instead of 64 one-row ones).
    x [B, H, T, kv_lora], shared [B, kv_lora, S] -> [B, H, T, S] (any last two sizes)"""
    B, H, T, _ = x.shape
    rows = np.matmul(x.reshape(B, H * T, x.shape[-1]), shared)  # [B, H*T, S]
    return rows.reshape(B, H, T, rows.shape[-1])


def times(x: np.ndarray, keys: np.ndarray, heads: slice) -> np.ndarray:
    """Queries x times keys (per head, or one for all heads) transposed: [B, H, T, qk_head] times
    [B, H, S, qk_head] -> [B, H, T, S], each cut to a tile's heads, queries and keys (or whole,
    heads slice(None): model.attention.held)."""
    if keys.shape[1] == 1:
        return shared_matmul(x, keys[:, 0].swapaxes(-1, -2))
    return np.matmul(x, keys[:, heads].swapaxes(-1, -2))


def weighted(p: np.ndarray, values: np.ndarray, heads: slice) -> np.ndarray:
    """Weights p times values (per head, or one for all heads): [B, H, T, S] times
    [B, H, S, v_head] -> [B, H, T, v_head], each cut to a tile's heads, queries and keys (or whole)."""
    if values.shape[1] == 1:
        return shared_matmul(p, values[:, 0])
    return np.matmul(p, values[:, heads])


def whole_fits(batch: int, heads: int, new: int, attended: int) -> bool:
    """Whether the scores [B, H, T, S] are small enough to be made whole (model.attention's lines)."""
    return batch * heads * new * attended <= WHOLE_SCORES


@dataclass(frozen=True)
class Operands:
    """One attention: queries [B, H, T, qk_head] and keys [B, H, S, qk_head] in pairs (the naive
    path), or [B, H, T, kv_lora] with [B, one, S, kv_lora] and [B, H, T, rope] with
    [B, one, S, rope] (the absorbed path: one key for all heads); values [B, H, S, v_head] or
    [B, one, S, kv_lora]; the softmax scale; and an optional extra mask broadcastable to
    [B, H, T, S]: True where kept (bool), or added to the scaled scores (float, -inf drops);
    and the heads' attention sink logits, if the model has them."""

    queries: Sequence[np.ndarray]
    keys: Sequence[np.ndarray]
    values: np.ndarray
    scale: float
    mask: np.ndarray | None = None
    # a learner's softmax of whole rows of scaled, masked scores, swapped in for the lesson's
    # exercise: the tiles then make every row's weights with it (`Softmaxed`), never the online softmax
    softmax: Callable[[np.ndarray], np.ndarray] | None = None
    causal: bool = True  # False: `mask` is the whole rule of which keys a query sees (a learner's causal_mask)
    sinks: np.ndarray | None = None  # [H] float32, each head's sink logit (None: no sink)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """[B, H, T, S] of the scores."""
        B, H, T, _ = self.queries[0].shape
        return B, H, T, self.keys[0].shape[2]

    def last_key(self, queries: slice) -> int:
        """One past the last key the queries may attend (causal: the T new are the last T of S)."""
        _, _, T, S = self.shape
        return S - T + queries.stop if self.causal else S

    def scores(self, heads: slice, queries: slice, keys: slice) -> np.ndarray:
        """The scaled, masked scores of a tile: [B, H, T, S] cut to its heads, queries and keys."""
        total = None
        for q, k in zip(self.queries, self.keys):
            part = times(q[:, heads, queries], k[:, :, keys], heads)
            total = part if total is None else np.add(total, part, out=total)
        total *= np.float32(self.scale)
        _, _, T, S = self.shape
        if self.causal and keys.stop - 1 > S - T + queries.start:  # the tile crosses the causal edge
            last_seen = (S - T) + np.arange(queries.start, queries.stop)[:, None]  # [T, one] of the tile's queries
            future = np.arange(keys.start, keys.stop)[None, :] > last_seen  # [T, S] of the tile
            np.copyto(total, np.float32(-np.inf), where=future)
        if self.mask is not None:
            tile = mask_tile(self.mask, heads, queries, keys)
            if tile.dtype == np.bool_:
                np.copyto(total, np.float32(-np.inf), where=~tile)
            else:
                total += tile.astype(np.float32, copy=False)
        return total

    def sink_logits(self, heads: slice) -> np.ndarray:
        """The sink logits of some heads, as they broadcast over their scores: [one, H, one, one]"""
        return np.asarray(self.sinks, np.float32)[heads].reshape(1, -1, 1, 1)

    def weights_of(self, rows: np.ndarray, heads: slice = slice(None)) -> np.ndarray:
        """The weights of whole rows of scaled, masked scores of some heads (every head: the lines
        on whole arrays, model.attention.held): their softmax over every key (a learner's, if swapped
        in), with each head's sink logit if the model has them.  [B, H, T, S] cut to the heads -> same"""
        if self.sinks is None:
            if self.softmax is None:
                return activations.softmax(rows)
            return np.asarray(self.softmax(rows.copy()), np.float32)  # the rows may be read-only (`rows`)
        if self.softmax is None:
            return activations.softmax_with_sinks(rows, self.sink_logits(heads))
        return activations.with_sink_column(self.softmax, rows, self.sink_logits(heads))

    def rows(self, heads: slice, queries: slice) -> np.ndarray:
        """The scores of some heads and queries over every key (read-only), kept a while: the weights
        are made of the same rows (`Softmaxed`), and a shown tensor may be looked at again (its
        heat map after its figures), so each is computed once."""
        return _kept_rows.get(self, heads, queries)


class KeptRows:
    """The last rows of scores made (Operands.rows), up to KEPT_ROW_BYTES, the oldest let go
    first. An Operands is not kept alive by its rows (its keys may be a whole cache): the rows of
    one that is gone are let go at the next call."""

    def __init__(self) -> None:
        self.kept: OrderedDict[tuple, tuple[weakref.ref, np.ndarray]] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, ops: Operands, heads: slice, queries: slice) -> np.ndarray:
        key = (id(ops), heads.start, heads.stop, queries.start, queries.stop)
        with self.lock:
            found = self.kept.get(key)
            if found is not None and found[0]() is ops:
                self.kept.move_to_end(key)
                return found[1]
        rows = every_core_scores(ops, heads, queries)
        rows.flags.writeable = False
        with self.lock:
            for gone in [k for k, (owner, _) in self.kept.items() if owner() is None]:
                del self.kept[gone]
            self.kept[key] = (weakref.ref(ops), rows)
            while sum(r.nbytes for _, r in self.kept.values()) > KEPT_ROW_BYTES and len(self.kept) > 1:
                self.kept.popitem(last=False)
        return rows


_kept_rows = KeptRows()


def every_core_scores(ops: Operands, heads: slice, queries: slice) -> np.ndarray:
    """ops.scores of some heads and queries over every key, in blocks of at most SHARED_ROWS
    queries shared out across the cores, each block's product stopping at the last key its queries may
    attend (past it: -inf, as the causal mask makes it). The same values: each score is one
    row's product either way. -> [B, H, T, S] cut to those heads and queries"""
    B, _, _, S = ops.shape
    t = queries.stop - queries.start
    if t < 2 * FEWEST_SHARED_ROWS or parallel.cores() == 1:
        return ops.scores(heads, queries, slice(0, S))
    size = min(SHARED_ROWS, -(-t // parallel.cores()))  # queries of a block: at least one block per core
    rows = np.empty((B, len(range(*heads.indices(ops.shape[1]))), t, S), np.float32)
    starts = list(range(queries.start, queries.stop, size))
    starts = [start for pair in zip(starts, starts[::-1]) for start in pair][:len(starts)]  # short and long in turn

    def run(share: Sequence[int]) -> None:
        for start in share:
            block = slice(start, min(start + size, queries.stop))
            last = ops.last_key(block)
            into = rows[:, :, block.start - queries.start:block.stop - queries.start]  # [B, H, T, S]: its queries
            into[..., :last] = ops.scores(heads, block, slice(0, last))  # these heads, keys to the block's last
            into[..., last:] = -np.inf  # past it: the causal mask's

    parallel.split(starts, run)
    return rows


def mask_tile(mask: np.ndarray, heads: slice, queries: slice, keys: slice) -> np.ndarray:
    """The part of a mask broadcastable to [B, H, T, S] that a tile of heads, queries and keys sees."""
    m = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    return m[:, heads if m.shape[1] > 1 else slice(None), queries, keys]


def tiles(batch: int, heads: int, new: int, attended: int) -> tuple[int, int, int]:
    """Heads, query rows and keys per tile, so a tile holds about TILE_SCORES scores and the
    tiles of heads and queries are enough to keep every core busy."""
    key_tile = min(attended, KEY_TILE)
    rows = max(1, TILE_SCORES // (batch * key_tile))  # (head, query) rows of one tile
    per_head = max(1, min(new, QUERY_TILE, rows))  # long products: a few heads of many queries
    group = max(1, min(heads, rows // per_head))
    if -(-heads // group) * -(-new // per_head) < parallel.cores():
        group = max(1, -(-heads // parallel.cores()))
    key_tile = min(attended, max(key_tile, TILE_SCORES // (batch * group * per_head)))
    return group, per_head, key_tile


def held_or_tiled(ops: Operands, held: Callable[[], np.ndarray], emit: Emitter, show: Callable) -> np.ndarray:
    """The attention of `ops`: `held()`, the model's lines on whole arrays, while its scores
    [B, H, T, S] are few enough to hold (whole_fits); else over tiles (`attend`), never holding
    them: a listening `emit` gets them and the weights through `show(scores, weights_of, emit)`
    as `Tiled` tensors, made a tile at a time when a sink looks. The scores are shown before the
    tiles run (they need none of their results), so a sink that wants only them can stop the step
    there (a chunked prefill's replay: stepper.prefill). The weights are the softmax of whole rows
    of scores (`Softmaxed`), each tile's output made with it, so a sink that looks at the scores
    and the weights together, tile by tile, has each row of scores made once for both and for the
    output; the rows no sink looked at by the time `show` returns are made by `attend`.
    -> [B, H, T, v_head] ([B, H, T, kv_lora] absorbed)"""
    if whole_fits(*ops.shape):
        return held()
    if not emit.listening and ops.softmax is None:
        return attend(ops)
    softmaxed = Softmaxed(ops)
    show(Tiled(ops.shape, ops.rows), lambda _: Tiled(ops.shape, softmaxed.weights), emit)
    return softmaxed.output()


class Softmaxed:
    """The weights of an attention made a tile of whole rows at a time, softmax(scores) over every
    key (the readable lines' softmax, with the sinks if any: Operands.weights_of), and the output
    of each tile's rows (the weights times the values) made with them, once."""

    def __init__(self, ops: Operands):
        B, H, T, _ = ops.shape
        self.ops = ops
        self.out: np.ndarray | None = np.empty((B, H, T, ops.values.shape[-1]), np.float32)  # [B, H, T, v_head]
        self.made = np.zeros((H, T), bool)  # the heads' rows whose output is in `out`

    def weights(self, heads: slice, queries: slice) -> np.ndarray:
        """The weights of some heads and queries over every key -> [B, H, T, S] cut to them"""
        # [B, H, T, S] of the heads and queries asked; a row with every key masked is NaN (0 with sinks)
        w = self.ops.weights_of(self.ops.rows(heads, queries), heads)
        if self.out is not None and not self.made[heads, queries].all():
            t = queries.stop - queries.start
            size = max(FEWEST_SHARED_ROWS, -(-t // parallel.cores()))  # rows of a block: one per core

            def run(starts: Sequence[int]) -> None:
                for start in starts:
                    rows = slice(start, min(start + size, t))
                    self.out[:, heads, queries.start + rows.start:queries.start + rows.stop] = weighted(
                        w[:, :, rows], self.ops.values, heads)  # [B, H, T, v_head] of the heads and block asked

            parallel.split(range(0, t, size), run)
            self.made[heads, queries] = True
        return w

    def output(self) -> np.ndarray:
        """The output of every row: made with the weights where a sink looked at them all, else by
        `attend` (and the weights read later make no output); with a learner's softmax, the rows
        no sink looked at are made with it, a block of queries at a time."""
        if self.ops.softmax is not None:
            B, H, T, S = self.ops.shape
            block = max(1, WHOLE_SCORES // (B * H * S))
            for start in range(0, T, block):
                if not self.made[:, start : start + block].all():
                    self.weights(slice(0, H), slice(start, min(start + block, T)))
        if self.made.all():
            return self.out
        self.out = None
        return attend(self.ops)


def attend(ops: Operands) -> np.ndarray:
    """softmax(scores) @ values over tiles (with the sinks, if any), shared out across the cores.
    -> the output [B, H, T, v_head] ([B, H, T, kv_lora] absorbed)"""
    B, H, T, S = ops.shape
    group, rows, key_tile = tiles(B, H, T, S)
    out = np.empty((B, H, T, ops.values.shape[-1]), np.float32)
    work = [(slice(h, min(h + group, H)), slice(t, min(t + rows, T))) for h in range(0, H, group)
            for t in range(0, T, rows)]

    def run(share: Sequence[tuple[slice, slice]]) -> None:
        for heads, queries in share:
            out[:, heads, queries] = attend_tile(ops, heads, queries, key_tile)

    parallel.split(work, run)
    return out


def attend_tile(ops: Operands, heads: slice, queries: slice, key_tile: int) -> np.ndarray:
    """The online softmax over the key tiles of one tile of heads and queries.
    -> the output of its rows, [B, H, T, v_head] cut to the tile"""
    B = ops.shape[0]
    shape = (B, heads.stop - heads.start, queries.stop - queries.start)
    if ops.sinks is None:
        m = np.full((*shape, 1), -np.inf, np.float32)  # running maximum of each row
        l = np.zeros((*shape, 1), np.float32)  # running sum of exp(score - m)
    else:  # the sink visited first: a key of score sinks[h] and value zero
        m = np.full((*shape, 1), ops.sink_logits(heads), np.float32)
        l = np.ones((*shape, 1), np.float32)  # exp(sink - m)
    acc = np.zeros((*shape, ops.values.shape[-1]), np.float32)  # running sum of exp(score - m) * value
    with np.errstate(invalid="ignore"):
        for start in range(0, ops.last_key(queries), key_tile):
            keys = slice(start, min(start + key_tile, ops.last_key(queries)))
            p = ops.scores(heads, queries, keys)  # a tile of [B, H, T, S]
            new_m = np.maximum(m, p.max(axis=-1, keepdims=True))
            safe = np.where(np.isfinite(new_m), new_m, np.float32(0))  # a row with no key kept yet
            p -= safe
            np.exp(p, out=p)
            rescale = np.exp(m - safe)
            l = l * rescale + p.sum(axis=-1, keepdims=True)
            acc *= rescale
            acc += weighted(p, ops.values[:, :, keys], heads)
            m = new_m
        acc /= l  # a row with every key masked: 0 / 0, NaN as in softmax (with a sink: 0 / 1, 0)
        return acc
