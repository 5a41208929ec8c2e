"""Statistics gathered in the helper process (kernels.fp8_workers) beside this one's: a shown
attention's weights, a block at a time, while this process gathers its scores.

Threads gain nothing here: each pass over a block is a short NumPy call, and each call hands the
GIL over, so two threads gathering two tensors' blocks ran no faster than one (five passes over
16,384 values, in a loop: 0.80x one thread's rate on two threads, 1.93x in two processes). The
helper gathers a `Gather` of its own from the blocks copied into the scratch, SLOTS of them in
turn, and hands it back pickled at the end; merged, it gives the figures one Gather would give
(every figure is order-free and exact, and so is `Gather.merge`).
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from multiprocessing.connection import Connection

import numpy as np

from stepper.kernels import fp8_workers
from stepper.kernels.fp8_workers import CLAIMS_BYTES, OK, Helper, receive
from stepper.tensors.statistics import CHUNK, Gather

BESIDE_VALUES = 1 << 24  # fewer values than this (a short prompt's) are gathered here: the helper would cost more
SLOTS = 4  # blocks in the scratch at once: this process copies the next while the helper gathers the last
BLOCK = struct.Struct("<4q")  # the gather's index, the block's byte offset in the scratch, its values, whether
# its bins are whole integers; then the dtype's character
HANDED = struct.Struct("<q")  # how many gathers to hand back, from index 0

Blocks = Callable[[], Iterator[np.ndarray]]  # a tensor's blocks (float32 or float64 [n <= CHUNK]), from its first


def gathered_beside(here: Iterable[np.ndarray], take: Callable[[np.ndarray], None], beside: list[Blocks],
                    integers: list[bool], size: int) -> list[Gather]:
    """take(block) for each of `here`'s blocks, in this process, and a Gather of each `beside`
    tensor's blocks (integers[i]: tensor i's bins are whole integers; `size`: their values, all
    told), a block of each in turn, as many as here's: in the helper, or here without one or for
    fewer than BESIDE_VALUES. A helper that fails on the way is dropped (as fp8_workers drops it)
    and the blocks it had are gathered here again. -> the beside tensors' Gathers"""
    steps = zip(here, *(blocks() for blocks in beside))
    pulled = [0]  # steps the helper was given
    if size >= BESIDE_VALUES and fp8_workers.sharing():
        handed: list[Gather] = []
        if fp8_workers.with_helpers(lambda ws: handed.extend(in_helper(ws[0], steps, take, integers, pulled))):
            return handed
    gathers = [Gather(integer) for integer in integers]
    for gather, blocks in zip(gathers, beside):  # what a failed helper had
        for block in islice(blocks(), pulled[0]):
            gather.add(block)
    for blocks in steps:
        take(blocks[0])
        for gather, block in zip(gathers, blocks[1:]):
            gather.add(block)
    return gathers


def in_helper(helper: Helper, steps: Iterator[tuple[np.ndarray, ...]], take: Callable[[np.ndarray], None],
              integers: list[bool], pulled: list[int]) -> list[Gather]:
    """The helper gathers the second and later blocks of each step, this process takes the first."""
    helper.ensure_scratch(CLAIMS_BYTES + SLOTS * CHUNK * 8)
    sent = waiting = 0  # blocks sent; of them, not yet answered
    with fp8_workers.here():  # the helper is busy gathering: products meanwhile run here
        for blocks in steps:
            pulled[0] += 1
            try:
                for i, block in enumerate(blocks[1:]):
                    if waiting == SLOTS:  # the oldest slot's block gathered before it is written again
                        answered(helper.conn)
                        waiting -= 1
                    offset = CLAIMS_BYTES + sent % SLOTS * CHUNK * 8
                    np.frombuffer(helper.scratch, block.dtype, block.size, offset)[:] = block
                    numbers = BLOCK.pack(i, offset, block.size, integers[i])
                    helper.conn.send_bytes(b"A" + numbers + block.dtype.char.encode())
                    sent, waiting = sent + 1, waiting + 1
            finally:  # here's block taken even when the helper failed
                take(blocks[0])
        for _ in range(waiting):
            answered(helper.conn)
        helper.conn.send_bytes(b"H" + HANDED.pack(len(integers)))
        gathers = pickle.loads(receive(helper.conn))
        answered(helper.conn)
    return gathers


def answered(conn: Connection) -> None:
    answer = receive(conn)
    if answer != OK:
        raise RuntimeError(f"helper process failed gathering statistics: {answer.decode(errors='replace')}")


# ---------------------------------------------------------------------------------------------
# The helper's side

_gathers: dict[int, Gather] = {}  # the helper's gathers, by index, until handed back


def gather_block(conn: Connection, scratch, files: dict, message: bytes) -> tuple[list, bool]:
    """A block message's values added to its Gather."""
    index, offset, n, integers = BLOCK.unpack_from(message, 1)
    dtype = np.dtype(message[1 + BLOCK.size:].decode())
    gather = _gathers.setdefault(index, Gather(bool(integers)))
    gather.add(np.frombuffer(scratch, dtype, n, offset))
    return [], False


def hand_back(conn: Connection, scratch, files: dict, message: bytes) -> tuple[list, bool]:
    """Gathers 0 to n - 1 sent back pickled (an empty one where no block came), then forgotten."""
    (n,) = HANDED.unpack_from(message, 1)
    gathers = [_gathers.pop(i, None) or Gather() for i in range(n)]  # an empty one's bins merge as either kind
    _gathers.clear()
    conn.send_bytes(pickle.dumps(gathers))
    return [], False


WORK = {b"A": gather_block, b"H": hand_back}  # the helper's work this module adds (fp8_workers.serve)
