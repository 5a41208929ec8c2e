"""The routed experts' SwiGLUs, each expert on the tokens that chose it (model.moe's grouped
dispatch), and on two cores whole experts shared with the helper process.

Sharing each product's tiles (kernels.fp8_workers) leaves one side waiting at the end of every
product, three an expert, and the SwiGLU's own work (its tokens gathered, SiLU, the routing
weights) to this process alone. So when every expert has few tokens and FP8 weights read from a
file, this process takes whole experts from the first on and the helper from the last back until
they meet, as fp8_workers.meet_in_the_middle takes tiles: a stale read can make both take the
same expert, never leave one out, and an expert done twice comes out the same. The expert of the
most tokens (the shared expert) comes last, made by both at once tile by tile, so the side that
finishes its whole experts first starts on it instead of waiting (a 16-expert Kimi K2 layer at
32 tokens left the helper 35 ms idle of 0.42 s without it).

The helper maps the codes from the file itself; the tokens, each expert's rows and routing
weights, and the helper's results go through the scratch, each weight's place in its file and
its block scales through the message. Both processes run the same tiles in the same order, so
the results are the bits one process gives alone; they are handed back in the experts' order.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection

import numpy as np

from stepper import fp8
from stepper.kernels import activations, fp8_workers, parallel
from stepper.kernels.fp8_matmul import (
    REBIAS_EXPONENT,
    input_magnitude,
    input_rebias,
    padded_columns,
    products,
    ready_columns,
)
from stepper.kernels.fp8_tiles import NanCheck, apply_tiles, many_tokens, row_tiles, times_power_of_two
from stepper.kernels.fp8_workers import (
    CLAIMS_BYTES,
    Band,
    Helper,
    aligned,
    file_map,
    from_the_back,
    from_the_front,
    receive,
)
from stepper.seams.swap import swapped_in
from stepper.weights.checkpoint import RESIDENT_BYTES
from stepper.weights.stored import FileBytes, Fp8Matrix

Group = tuple[np.ndarray, np.ndarray | None]  # an expert's tokens (rows of [N, d]) [n], their routing weights [n]
# (None: unweighted, the shared expert)
# the helper's results [assignments, d] in the scratch (and as many kept here until all are done), at most:
# 64 tokens of Kimi K2 choosing 8 experts each
SHARED_RESULTS_BYTES = 64 * 8 * 7168 * 4
EXPERTS = struct.Struct("<5q")  # experts, tokens, d, assignments (the experts' rows, all told), whether the last
# is a finale (made tile by tile by both); then each expert's count of rows
WEIGHT = struct.Struct("<9qi")  # file identity (4), byte offset, out, in, block rows, block columns; path length.
# Then the path and the float32 block scales.
# the scratch's first eight int64 (fp8_workers.CLAIMS_BYTES): whole experts from both ends, the finale's gate
# and up tiles (one after the other), its down tiles
EXPERT_CLAIMS, GATE_UP_CLAIMS, DOWN_CLAIMS = slice(0, 2), slice(2, 4), slice(4, 6)
MEETING = b"g"  # a finale's gate and up tiles all taken on one side, with whether it found NaN codes in each


def swiglus(tokens: np.ndarray, groups: Sequence[Group], matrices: Callable[[int], tuple],
            progress: Callable[[int], None]) -> Iterator[np.ndarray]:
    """activations.swiglu(tokens[rows], *matrices(i), weights) for each expert i's group (rows,
    weights), in the groups' order; progress(done) as experts are taken.  [N, d] -> [n_i, d] each

    One at a time, each made as it is asked for, unless whole experts are shared (whole_experts)."""
    shared = whole_experts(tokens, groups, matrices, progress)
    if shared is not None:
        yield from shared
        return
    for i, (rows, weights) in enumerate(groups):
        progress(i)
        yield activations.swiglu(tokens[rows], *matrices(i), weights)


def whole_experts(tokens: np.ndarray, groups: Sequence[Group], matrices: Callable[[int], tuple],
                  progress: Callable[[int], None]) -> list[np.ndarray] | None:
    """Each group's SwiGLU, whole experts shared with the one helper, and last the group of the most
    tokens (the shared expert, where there is one) made by both at once, its tiles taken from both
    ends (tiled_swiglu), so that neither waits long for the other's last expert. None (nothing
    done) unless there is exactly one helper, every expert's weights are FP8 from a file with few
    tokens each (fewer than a scale block has rows), no learner's decode runs, the results fit
    SHARED_RESULTS_BYTES, the weights looked up at once the checkpoint reader's mapped bytes
    (weights.checkpoint.RESIDENT_BYTES), and the work is worth the messages (fp8_workers.SHARE_WORK)."""
    assignments = sum(len(rows) for rows, _ in groups)
    if (not fp8_workers.sharing() or parallel.cores() != 2 or len(groups) < 2
            or swapped_in(fp8.decode, fp8.dequantize) or assignments * tokens.shape[1] * 4 > SHARED_RESULTS_BYTES):
        return None
    ws, looked_up = [], 0
    for i, (rows, _) in enumerate(groups):
        triple = matrices(i)
        if not all(isinstance(w, Fp8Matrix) and w.origin is not None and not many_tokens(len(rows), w)
                   for w in triple):
            return None
        looked_up += sum(w.codes.nbytes for w in triple)
        if looked_up > RESIDENT_BYTES:  # the reader would let the first go before they are used
            return None
        ws.append(triple)
    if sum(w.codes.size * len(rows) for (rows, _), triple in zip(groups, ws) for w in triple) < fp8_workers.SHARE_WORK:
        return None
    last = max(range(len(groups)), key=lambda i: (len(groups[i][0]), i))
    x = tokens[groups[last][0]]
    tiled = all(input_rebias(x, w) is not None for w in ws[last][:2])  # else its gate and up are not tiled
    order = [i for i in range(len(groups)) if i != last] + [last]
    ys: list = [None] * len(groups)
    if not fp8_workers.with_helpers(lambda helpers: share(tokens, [groups[i] for i in order], [ws[i] for i in order],
                                                          tiled, helpers[0], progress, ys, order)):
        return None
    return ys


def share(tokens: np.ndarray, groups: list[Group], ws: list[tuple], finale: bool, helper: Helper,
          progress: Callable[[int], None], ys: list, order: list[int]) -> None:
    """ys[order[j]] for every group j: whole experts from the first on here and from the last back in
    the helper, the last group a finale if `finale`, else one more whole expert."""
    n, d = tokens.shape
    counts = np.array([len(r) for r, _ in groups], np.int64)
    layout = Layout(n, d, counts, ws[-1] if finale else None)
    helper.send_inputs(tokens, 0, layout.end - layout.rows_at)
    layout.rows(helper.scratch)[:] = np.concatenate([r for r, _ in groups])
    routing = layout.routing(helper.scratch)  # float32, as both sides weigh the rows
    routing[:] = np.concatenate([np.ones(len(r), np.float32) if w is None else w for r, w in groups])
    claims = np.frombuffer(helper.scratch, np.int64, 6)
    claims[:] = (0, len(groups) - finale, 0, layout.gate_up_tiles, 0, layout.down_tiles)
    message = [b"X", EXPERTS.pack(len(groups), n, d, int(counts.sum()), finale), counts.tobytes()]
    message += [described(w) for triple in ws for w in triple]
    helper.conn.send_bytes(b"".join(message))
    helper.sent.append((Band(0, 0), 0))
    with fp8_workers.here():  # the helper is busy with its experts
        for j in iter(from_the_front(claims[EXPERT_CLAIMS]), None):
            progress(j + len(groups) - finale - int(claims[1]))
            r, s = groups[j][0], slice(layout.starts[j], layout.starts[j + 1])
            ys[order[j]] = activations.swiglu(tokens[r], *ws[j], routing[s])
        if finale:
            r, s = groups[-1][0], slice(layout.starts[-2], layout.starts[-1])
            ys[order[-1]], _ = tiled_swiglu(tokens[r], routing[s], ws[-1], layout.finale(helper.scratch), claims, True,
                                            lambda found: meet(helper.conn, found),
                                            lambda found: helper.answer() or found)
    if not finale:
        helper.answer()
    results = layout.results(helper.scratch)
    for j in range(int(claims[1]), len(groups) - finale):  # the experts the helper took
        ys[order[j]] = results[layout.starts[j] : layout.starts[j + 1]].copy()


class Layout:
    """Where an experts message's arrays lie in the scratch, after the claims and the tokens [N, d]:
    every expert's rows [A] int64 and routing weights [A] float32, the helper's results [A, d],
    and a finale's gate, up and down rows [out, N'] (fp8_tiles.result_arrays of few tokens)."""

    def __init__(self, n: int, d: int, counts: np.ndarray, finale: tuple | None):
        self.starts = np.concatenate([[0], np.cumsum(counts)])
        a = int(self.starts[-1])
        self.a, self.d = a, d
        self.rows_at = CLAIMS_BYTES + n * d * 4
        self.results_at = self.rows_at + 8 * a + aligned(4 * a)
        self.finale_at = self.results_at + 4 * a * d
        self.shapes, self.gate_up_tiles, self.down_tiles = [], 0, 0
        if finale is not None:
            gate, up, down = finale
            last = int(counts[-1])
            self.shapes = [(gate.shape[0], padded_columns(last, gate.shape[1])),
                           (up.shape[0], padded_columns(last, up.shape[1])),
                           (down.shape[0], padded_columns(last, down.shape[1]))]
            self.gate_up_tiles = len(row_tiles(gate)) + len(row_tiles(up))
            self.down_tiles = len(row_tiles(down))
        self.end = self.finale_at + sum(4 * rows * columns for rows, columns in self.shapes)

    def rows(self, scratch: mmap.mmap) -> np.ndarray:
        return np.frombuffer(scratch, np.int64, self.a, self.rows_at)

    def routing(self, scratch: mmap.mmap) -> np.ndarray:
        return np.frombuffer(scratch, np.float32, self.a, self.rows_at + 8 * self.a)

    def results(self, scratch: mmap.mmap) -> np.ndarray:
        return np.frombuffer(scratch, np.float32, self.a * self.d, self.results_at).reshape(self.a, self.d)

    def finale(self, scratch: mmap.mmap) -> list[np.ndarray]:
        """The finale's gate, up and down rows [out, N'] each."""
        out, at = [], self.finale_at
        for rows, columns in self.shapes:
            out.append(np.frombuffer(scratch, np.float32, rows * columns, at).reshape(rows, columns))
            at += 4 * rows * columns
        return out


def tiled_swiglu(x: np.ndarray, weights: np.ndarray, triple: tuple, rows: list[np.ndarray],
                 claims: np.ndarray, front: bool, exchange: Callable[[list[bool]], list[bool]],
                 end: Callable[[bool], bool]) -> tuple[np.ndarray | None, bool]:
    """activations.swiglu(x, gate, up, down, weights), the same bits, made by this process and the
    other at once, each taking tiles from its end (`front` or back) as fp8_workers.meet_in_the_middle
    does: gate's and up's tiles as one run (claims[GATE_UP_CLAIMS]), then, once both sides are
    done with those (exchange: whether each found NaN codes in gate and up, given and got), down's
    (claims[DOWN_CLAIMS]); end(found in down) waits for the other's down tiles and says whether
    either found any. The rows go into `rows` (the scratch's gate, up and down rows [out, N']).
    Returns the result [n, d] in front (None behind), and whether NaN codes were found in down."""
    gate, up, down = triple
    n, (gate_rows, up_rows, down_rows) = x.shape[0], rows
    x_max = input_magnitude(x)
    k_gate, k_up = input_rebias(x, gate, x_max), input_rebias(x, up, x_max)
    inputs, checks = ready_columns(x), [NanCheck(gate), NanCheck(up)]
    gate_tiles = len(row_tiles(gate))
    runs = [(gate, k_gate, gate_rows, checks[0], 0, gate_tiles),
            (up, k_up, up_rows, checks[1], gate_tiles, gate_tiles + len(row_tiles(up)))]
    for w, k, out, check, first, stop in runs if front else runs[::-1]:
        apply_tiles(inputs, w, k, out, claim=taken(claims[GATE_UP_CLAIMS], front, first, stop), nan_check=check)
    for check, other in zip(checks, exchange([check.found for check in checks])):
        check.found |= other
        check.done()
    act = activations.silu(unscaled(gate_rows, k_gate, n))  # [n, inter]
    act *= unscaled(up_rows, k_up, n)
    act *= weights[:, None]  # ones for the shared expert: the same bits as none
    k_down, check = input_rebias(act, down), NanCheck(down)
    if k_down is not None:
        claim = taken(claims[DOWN_CLAIMS], front, 0, len(row_tiles(down)))
        apply_tiles(ready_columns(act), down, k_down, down_rows, claim=claim, nan_check=check)
    check.found = end(check.found)
    if not front:
        return None, check.found
    check.done()
    return (products(act, [down])[0] if k_down is None else unscaled(down_rows, k_down, n)), check.found


def unscaled(rows: np.ndarray, k: int, n: int) -> np.ndarray:
    """A product's rows [out, N'] made by apply_tiles with 2^k, as tiled_products gives them: the first n
    columns times 2^(120 - k), transposed.  -> [n, out]"""
    return times_power_of_two(rows[:, :n], REBIAS_EXPONENT - k).T


def taken(claims: np.ndarray, front: bool, first: int, stop: int) -> Callable[[], int | None]:
    """Tiles [first, stop) of a run shared from both ends, from the front or the back, counted from first."""
    return fp8_workers.from_the_front(claims, first, stop) if front else fp8_workers.from_the_back(claims, first)


def meet(conn: Connection, found: list[bool]) -> list[bool]:
    """Tell the other side this one's finale gate and up tiles are done, with whether it found NaN
    codes in each, and wait for the same from it."""
    conn.send_bytes(MEETING + bytes(found))
    answer = receive(conn)
    if answer[:1] != MEETING or len(answer) != 1 + len(found):
        raise RuntimeError(f"the finale's meeting was not kept: {answer.decode(errors='replace')}")
    return [bool(b) for b in answer[1:]]


def described(w: Fp8Matrix) -> bytes:
    """A weight as the helper maps it: its place in its file, shape, block, path and block scales."""
    path = os.fsencode(w.origin.path)
    scales = np.ascontiguousarray(w.scale_inv, np.float32)
    return WEIGHT.pack(*w.origin.identity, w.origin.offset, *w.shape, *w.block, len(path)) + path + scales.tobytes()


# ---------------------------------------------------------------------------------------------
# The helper's side


def run_experts(conn: Connection, scratch: mmap.mmap, files: dict, message: bytes) -> tuple[list[tuple], bool]:
    """An experts message: whole experts taken from the last back, each one's results into the
    scratch, then the finale's tiles from the back, if there is one. Returns the file ranges read
    (fp8_workers.serve lets the oldest go), and whether NaN codes were found in the finale's down."""
    m, n, d, a, finale = EXPERTS.unpack_from(message, 1)
    at = 1 + EXPERTS.size
    counts = np.frombuffer(message, np.int64, m, at)
    at += counts.nbytes
    weights, reads = [], []
    for _ in range(3 * m):
        w, read, at = mapped_weight(message, at, files)
        weights.append(w)
        reads.append(read)
    if at != len(message) or int(counts.sum()) != a:
        raise ValueError(f"experts message of {len(message)} bytes, expected {at}, or rows not {a}")
    layout = Layout(n, d, counts, tuple(weights[-3:]) if finale else None)
    tokens = np.frombuffer(scratch, np.float32, n * d, CLAIMS_BYTES).reshape(n, d)
    rows, routing, results = layout.rows(scratch), layout.routing(scratch), layout.results(scratch)
    claims = np.frombuffer(scratch, np.int64, 6)
    taken_reads = reads[-3:] if finale else []
    for i in iter(from_the_back(claims[EXPERT_CLAIMS]), None):
        s = slice(layout.starts[i], layout.starts[i + 1])
        results[s] = activations.swiglu(tokens[rows[s]], *weights[3 * i : 3 * i + 3], routing[s])
        taken_reads += reads[3 * i : 3 * i + 3]
    if not finale:
        return taken_reads, False
    s = slice(layout.starts[-2], layout.starts[-1])
    _, found = tiled_swiglu(tokens[rows[s]], routing[s], tuple(weights[-3:]), layout.finale(scratch), claims, False,
                            lambda flags: meet(conn, flags), lambda flag: flag)
    return taken_reads, found


def mapped_weight(message: bytes, at: int, files: dict) -> tuple[Fp8Matrix, tuple, int]:
    """The weight described at `at` in the message, its codes mapped from its file; the file range
    they lie in, and where the next description starts."""
    *identity, offset, out, in_dim, block_rows, block_columns, path_length = WEIGHT.unpack_from(message, at)
    at += WEIGHT.size
    where = FileBytes(os.fsdecode(message[at : at + path_length]), offset, tuple(identity))
    at += path_length
    scale_shape = (-(-out // block_rows), -(-in_dim // block_columns))
    scales = np.frombuffer(message, np.float32, scale_shape[0] * scale_shape[1], at).reshape(scale_shape)
    at += scales.nbytes
    view, fault_bytes = file_map(files, where)
    codes = np.frombuffer(view, np.uint8, out * in_dim, offset).reshape(out, in_dim)
    return Fp8Matrix(codes, scales, (block_rows, block_columns), origin=where), (view, offset, codes.size,
                                                                                fault_bytes), at


WORK = {b"X": run_experts}  # the helper's work this module adds (fp8_workers.serve)
