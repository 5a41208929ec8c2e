"""Helper processes that take a band of an FP8 (or INT4) product's rows, so every core decodes.

Decoding a tile is a handful of short NumPy calls, and each call hands the GIL over, so threads
sharing the tiles gain little and processes are used instead. A large FP8 product is cut into bands
of whole scale blocks, one for this process and one for each helper, and the helpers' rows are
copied into the result. Several products of one input (a SwiGLU's gate and up) are cut as one, their
rows one after another: on two cores, one weight each, the inputs sent once. With one helper and few
tokens (a decode step), the two processes instead take each weight's tiles from the two ends until
they meet.

A helper reads the codes from the checkpoint file itself (mapped once per file), so only
weights read from a file are shared out; the inputs and the helper's rows of the result go
through scratch memory both processes map (an anonymous memory file, passed over the pipe).
(Codes that live only in this process, synthetic weights, stay here: copying them over costs more
than decoding them.) A helper that cannot start or stops answering is dropped, and the
products run here, as before.

INT4 products (kernels.int4_matmul) are shared the same way, in whole tiles decoded by
kernels.int4_tiles on both sides: from both ends with one helper and few tokens, else in bands.
The inputs (in the tiles' order) and the shared rows' group scales go through the scratch. FP4
products of a few tokens (kernels.fp4_matmul) too, their tiles decoded by kernels.fp4_tiles, the
inputs and the shared rows' float32 scales through the scratch (threads sharing those tiles ran no
faster than one: a [2048, 4096] product of one token took 7.27 ms on two cores' threads, 6.65 on
one, 5.0 with the helper).

A few tokens' routed experts go to the helper whole (kernels.experts adds that kind of message):
meanwhile every product of this process runs here (`here`), as every product of a helper does.
"""

from __future__ import annotations

import atexit
import mmap
import os
import struct
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import cache
from multiprocessing.connection import Connection, Pipe
from multiprocessing.reduction import recv_handle, send_handle

import numpy as np

from stepper import dtypes, fp4, fp8
from stepper.files import anonymous_file
from stepper.kernels import parallel
from stepper.kernels.fp4_tiles import apply_tiles as apply_fp4_tiles
from stepper.kernels.fp4_tiles import row_tiles as fp4_row_tiles
from stepper.kernels.fp8_tiles import NanCheck, apply_tiles, many_tokens, result_arrays, row_tiles
from stepper.kernels.int4_tiles import MANY_TOKENS, spans
from stepper.kernels.int4_tiles import apply_tiles as apply_int4_tiles
from stepper.kernels.int4_tiles import cached_rows as int4_cached_rows
from stepper.kernels.int4_tiles import row_tiles as int4_row_tiles
from stepper.kernels.int4_tiles import tile_height as int4_tile_height
from stepper.weights.safetensors_reader import (
    MappedBudget,
    advise_checkpoint_map,
    advise_range,
    file_identity,
    spanned,
)
from stepper.weights.stored import FileBytes, Fp4Matrix, Fp8Matrix, Int4Matrix

FP4_SHARED_MOST_TOKENS = 128  # past this, an FP4 product is shared by threads, not with the helpers (fp4_bands)
BAND_RESIDENT_BYTES = 3 << 28  # bytes of bands a helper keeps mapped before the oldest are released (768 MiB)
SHARE_WORK = 1 << 22  # a product of fewer weights x tokens stays in this process: messages would cost more
SPIN_SECONDS = 0.002  # how long a side watches the pipe before sleeping on it
# The messages are bytes, not pickles (pickling a band with its scales is slower): a kind byte,
# then for a band its numbers, the file's path and the band's scale rows.
BAND = struct.Struct("<13q3i")  # file identity (4), byte offset, start, end, out, in, block rows, block columns,
# tokens, where its rows go in the scratch (bytes after the inputs); k, path length, how
MEET, CHECK_NAN = 1, 2  # how: tiles taken from both ends (meet_in_the_middle); look for NaN codes
BF16_SCALES = 4  # how, of an INT4 band: its group scales are BF16 (as stored), not float32
INT4_BAND = struct.Struct("<13q2i")  # file identity (4), byte offset, start, end, out, in, group, tokens, the scales'
# byte offset in the file (-1: in the scratch), the tiles' height; path length, how. Then the path. In the
# scratch: the inputs, the band's group scales [rows, in/group] unless read from the file, its rows.
FP4_BAND = struct.Struct("<11q2i")  # file identity (4), byte offset, start, end, out, in, tokens, the tiles'
# height; path length, how. Then the path. In the scratch: the inputs [N, in], the band's float32 scales, its
# rows [rows, N] (a few tokens only).
SCRATCH = struct.Struct("<q")  # size
CLAIMS_BYTES = 64  # the scratch starts with two int64: the next tile from the front, the last taken from the back
OK, OK_NAN = b"ok", b"ok, NaN codes found"


@dataclass(frozen=True)
class Band:
    """A part of a product: rows [start, end) of the weight, in whole scale blocks."""

    start: int
    end: int


# ---------------------------------------------------------------------------------------------
# This process's side


class Helper:
    """One helper process, its pipe, and the scratch memory shared with it."""

    def __init__(self):
        # A fresh interpreter (not fork: this process has threads; not multiprocessing's spawn,
        # which would import the user's __main__ again). It exits when the pipe closes. In a session of
        # its own, so a Ctrl-C at the terminal reaches this process alone (which says "interrupted"), not
        # the helper too (which would print its traceback).
        self.conn, child = Pipe()
        self.process = subprocess.Popen([sys.executable, "-m", "stepper.kernels.fp8_helper", str(child.fileno())],
                                        pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, start_new_session=True)
        child.close()
        self.scratch: mmap.mmap | None = None
        self.inputs_bytes = 0
        self.sent: deque[tuple[Band, int]] = deque()  # bands not yet answered, and where their rows go
        self.band, self.rows_at = Band(0, 0), 0  # the band answered last
        self.bands_done = 0

    def send_inputs(self, tokens: np.ndarray, most_rows: int, more_bytes: int = 0) -> None:
        """Put the inputs [N, in] of the products to come in the scratch, with room after them for
        more_bytes (an INT4 or FP4 band's group scales) and most_rows of results (every band sent before
        the next inputs)."""
        assert not self.sent, "inputs sent while bands of the last ones are unanswered"
        self._ensure_scratch(CLAIMS_BYTES + tokens.nbytes + more_bytes + most_rows * tokens.shape[0] * 4)
        np.frombuffer(self.scratch, np.float32, tokens.size, CLAIMS_BYTES).reshape(tokens.shape)[:] = tokens
        self.inputs_bytes = tokens.nbytes

    def claims(self) -> np.ndarray:
        """The two tile indices of a product shared from both ends (meet_in_the_middle).  [2] int64"""
        return np.frombuffer(self.scratch, np.int64, 2)

    def start(self, w: Fp8Matrix, k: int, band: Band, n: int, how: int = 0) -> None:
        """Send a band of a product of the inputs sent; the helper starts at once, or after the
        bands sent before it. Its rows go after theirs in the scratch."""
        rows_at = sum((b.end - b.start) * n * 4 for b, _ in self.sent)
        path_bytes = os.fsencode(w.origin.path)
        scales = np.ascontiguousarray(band_matrix(w, band).scale_inv, np.float32)
        numbers = BAND.pack(*w.origin.identity, w.origin.offset, band.start, band.end, *w.shape, *w.block, n, rows_at,
                            k, len(path_bytes), how)
        self.conn.send_bytes(b"B" + numbers + path_bytes + scales.tobytes())
        self.sent.append((band, rows_at))

    def finish_into(self, w: Fp8Matrix, rows: np.ndarray) -> None:
        """Wait for the oldest band sent and copy its rows into its product's rows [out, N]."""
        self.answer()
        self.copy_into(rows, self.band.start, many_tokens(rows.shape[1], w))

    def answer(self) -> bool:
        """Wait for the oldest band sent to be done; whether the helper found NaN codes."""
        answer = receive(self.conn)
        self.band, self.rows_at = self.sent.popleft()
        if answer not in (OK, OK_NAN):
            raise RuntimeError(f"FP8 helper process failed: {answer.decode(errors='replace')}")
        self.bands_done += 1
        return answer == OK_NAN

    def copy_into(self, rows: np.ndarray, first_row: int, many: bool) -> None:
        """Copy the band answered last, its rows from first_row on, into its product's rows [out, N]
        (laid out as result_arrays lays them out for `many` tokens)."""
        band, n = self.band, rows.shape[1]
        height = band.end - band.start
        flat = np.frombuffer(self.scratch, np.float32, height * n, CLAIMS_BYTES + self.inputs_bytes + self.rows_at)
        rows[first_row : band.end] = result_arrays(height, n, many, flat)[1][first_row - band.start :]

    def _ensure_scratch(self, need: int) -> None:
        """Scratch memory of at least `need` bytes, shared with the helper by passing its file
        descriptor over the pipe: an anonymous memory file (memfd), so nothing is left behind
        and no size limit of /dev/shm applies (a write past that limit would kill the process)."""
        if self.scratch is not None and len(self.scratch) >= need:
            return
        size = max(need, 2 * len(self.scratch) if self.scratch is not None else 1 << 24)
        fd = anonymous_file()
        try:
            os.ftruncate(fd, size)
            scratch = mmap.mmap(fd, size)
            self.conn.send_bytes(b"S" + SCRATCH.pack(size))
            send_handle(self.conn, fd, self.process.pid)
            answer = self.conn.recv_bytes()
            if answer != OK:
                raise RuntimeError("FP8 helper process could not map its scratch memory: "
                                   f"{answer.decode(errors='replace')}")
        finally:
            os.close(fd)  # both processes have it mapped: the memory lives until both let go
        self.scratch = scratch


def receive(conn: Connection) -> bytes:
    """The next message, watched for a moment before sleeping on it: a process asleep on a pipe
    takes long to wake here (a virtual CPU halts), and the two sides message each other for
    every product."""
    deadline = time.perf_counter() + SPIN_SECONDS
    while not conn.poll() and time.perf_counter() < deadline:
        pass
    return conn.recv_bytes()


@cache
def helpers() -> list[Helper]:
    """One helper per core beyond this one; none on one core. They are ended at exit."""
    atexit.register(stop_helpers)
    return [Helper() for _ in range(parallel.cores() - 1)]


def helper_pids() -> list[int]:
    """Process ids of the helpers started so far (none before the first shared product)."""
    return [helper.process.pid for helper in helpers()] if helpers.cache_info().currsize else []


_broken = False  # a helper died or could not start: every product runs here from now on
_here = False  # this process's products run here: it is a helper, or its helper is busy (here())


def sharing() -> bool:
    """Whether products may be shared with helpers now."""
    return not (_broken or _here) and parallel.cores() >= 2


@contextmanager
def here() -> Iterator[None]:
    """Inside the block, every product runs in this process (its helper is busy with work of its own)."""
    global _here
    before, _here = _here, True
    try:
        yield
    finally:
        _here = before


def stop_helpers() -> None:
    """End the helper processes (they also end by themselves when this process does)."""
    global _broken
    if helpers.cache_info().currsize:
        for helper in helpers():
            helper.conn.close()
            try:
                helper.process.wait(timeout=10)
            except subprocess.TimeoutExpired:  # stuck in a band: it would end at its next message
                helper.process.kill()
    helpers.cache_clear()
    _broken = False


def linear_bands(tokens: np.ndarray, ws: list[Fp8Matrix], ks: list[int], rows: list[np.ndarray]) -> bool:
    """rows[i] [out_i, N] = the rows of the products of the inputs with each weight, shared with
    the helpers: tiles from both ends with one helper and few tokens, else bands of the weights'
    rows one after another, one share for this process and one for each helper (one band each:
    smaller bands handed out as each side finished were slower). False (nothing done) when the
    products are small, their codes are not a file's, or there are no helpers."""
    if (not sharing() or any(w.origin is None for w in ws)
            or sum(w.codes.size for w in ws) * tokens.shape[0] < SHARE_WORK):
        return False
    return with_helpers(lambda workers: shared_fp8(tokens, ws, ks, rows, workers))


def with_helpers(share: Callable[[list[Helper]], None]) -> bool:
    """Run a product shared with the helpers; False (nothing done) if a helper died or could not
    start, and the helpers are not used again (an interrupted run stops using them too)."""
    global _broken
    try:
        share(helpers())
    except (OSError, EOFError, RuntimeError):  # a helper died or could not start: run here from now on
        _broken = True
        return False
    except BaseException:  # interrupted: a helper's answer may be left unread, so stop using them
        _broken = True
        raise
    return True


def shared_fp8(tokens: np.ndarray, ws: list[Fp8Matrix], ks: list[int], rows: list[np.ndarray],
               workers: list[Helper]) -> None:
    """Tiles from both ends with one helper and few tokens, else bands of rows."""
    if len(workers) == 1 and not many_tokens(tokens.shape[0], ws[0]):
        workers[0].send_inputs(tokens, max(w.shape[0] for w in ws))
        for w, k, r in zip(ws, ks, rows):
            meet_in_the_middle(tokens, w, k, r, workers[0])
    else:
        in_bands(tokens, ws, ks, rows, workers)


def in_bands(tokens: np.ndarray, ws: list[Fp8Matrix], ks: list[int], rows: list[np.ndarray],
             workers: list[Helper]) -> None:
    """rows[i] [out_i, N]: one share of bands of whole scale blocks for this process and one for
    each helper, each helper sent the inputs once and all its bands at once."""
    mine, *theirs = shares(ws, len(workers) + 1)
    for helper, share in zip(workers, theirs):
        helper.send_inputs(tokens, sum(band.end - band.start for _, band in share))
        for i, band in share:
            helper.start(ws[i], ks[i], band, tokens.shape[0])
    for i, band in mine:
        apply_tiles(tokens, band_matrix(ws[i], band), ks[i], rows[i][band.start : band.end])
    for helper, share in zip(workers, theirs):
        for i, _ in share:
            helper.finish_into(ws[i], rows[i])


def meet_in_the_middle(tokens: np.ndarray, w: Fp8Matrix, k: int, rows: np.ndarray, helper: Helper) -> None:
    """rows [out, N], for few tokens with one helper, which has the inputs: this process takes
    tiles from the first on, the helper from the last back, until they meet, so the one that
    runs faster does more, where fixed halves left one side waiting for the other.

    Each side writes only its own index in the scratch and reads the other's; a stale read can
    make both take the same tile, never leave one out, and a tile done twice comes out the same.
    Whether NaN codes were found is put together from both sides before it is remembered."""
    tiles = len(row_tiles(w))
    nan_check = NanCheck(w)
    claims = helper.claims()
    claims[:] = (0, tiles)
    how = MEET | (CHECK_NAN if nan_check.checking else 0)
    helper.start(w, k, Band(0, w.shape[0]), tokens.shape[0], how)
    apply_tiles(tokens, w, k, rows, claim=from_the_front(claims), nan_check=nan_check)
    if helper.answer():
        nan_check.found = True
    nan_check.done()
    first = min(int(claims[1]) * w.block[0], w.shape[0])  # the tiles the helper took
    helper.copy_into(rows, first, many_tokens(tokens.shape[0], w))


def from_the_front(claims: np.ndarray, first: int = 0, stop: int | None = None):
    """Tile indices from the first on, until the helper's last taken one (claims[1]) or `stop`;
    counted from `first` (the first tile of a run of several products' tiles)."""
    def take() -> int | None:
        tile = int(claims[0])
        if tile >= claims[1] or (stop is not None and tile >= stop):
            return None
        claims[0] = tile + 1
        return tile - first
    return take


def from_the_back(claims: np.ndarray, first: int = 0):
    """Tile indices from the last back, until this process's next one (claims[0]) or `first`,
    counted from `first`."""
    def take() -> int | None:
        tile = int(claims[1]) - 1
        if tile < claims[0] or tile < first:
            return None
        claims[1] = tile
        return tile - first
    return take


def shares(ws: list[Fp8Matrix], parts: int) -> list[list[tuple[int, Band]]]:
    """The weights' rows one after another, cut into `parts` shares of whole scale blocks as even
    as the blocks allow (fewer when there are fewer blocks): each share is its bands, (weight
    index, rows of that weight). Two weights of the same size on two cores: one weight each."""
    blocks = [-(-w.shape[0] // w.block[0]) for w in ws]
    cuts = [sum(blocks) * p // parts for p in range(parts + 1)]
    cut = []
    for p in range(parts):
        share, first = [], 0  # first: the weight's first block, counted over all the weights
        for i, (w, count) in enumerate(zip(ws, blocks)):
            start, end = max(cuts[p], first) - first, min(cuts[p + 1], first + count) - first
            if end > start:
                share.append((i, Band(start * w.block[0], min(end * w.block[0], w.shape[0]))))
            first += count
        cut.append(share)
    return [share for share in cut if share]


def band_matrix(w: Fp8Matrix, band: Band) -> Fp8Matrix:
    """The weight's rows [start, end) with their scale rows, as a matrix of its own."""
    scales = w.scale_inv[fp8.scale_rows(band.start, band.end, w.block[0])]
    origin = None if w.origin is None else w.origin.at(band.start * w.shape[1])
    return replace(w, codes=w.codes[band.start : band.end], scale_inv=scales, origin=origin)


def int4_bands(split: np.ndarray, w: Int4Matrix, rows: np.ndarray) -> bool:
    """rows [out, N] = the INT4 product of the inputs in the tiles' order [N, in] (int4_tiles),
    shared with the helpers: tiles from both ends with one helper and few tokens, else one band of
    whole tiles for this process and one for each helper. False (nothing done) when the words are
    not a file's or there are no helpers."""
    if not sharing() or w.origin is None:
        return False
    return with_helpers(lambda workers: shared_int4(split, w, rows, workers))


def shared_int4(split: np.ndarray, w: Int4Matrix, rows: np.ndarray, workers: list[Helper]) -> None:
    """Tiles from both ends with one helper and few tokens, else one band of whole tiles for this
    process and one for each helper."""
    many = split.shape[0] > MANY_TOKENS
    if len(workers) == 1 and not many:
        int4_meet_in_the_middle(split, w, rows, workers[0])
        return
    height = int4_tile_height(w, split.shape[0])  # the whole weight's tiles, whichever process makes them
    # bands of whole tiles with few tokens; with many, of whole parts (two tall tiles of 1152 and 896 rows
    # would leave one process waiting), every tile of many tokens a packed product whatever its height
    mine, *theirs = int4_shares(w, len(workers) + 1, int4_cached_rows(w) if many else height)
    sent = [(helper, band) for helper, band in zip(workers, theirs) if band.end > band.start]
    for helper, band in sent:
        send_int4_band(helper, split, w, band)
    apply_int4_tiles(split, int4_band_matrix(w, mine), spans(mine.end - mine.start, height),
                     rows[mine.start : mine.end])
    for helper, band in sent:
        helper.answer()
        helper.copy_into(rows, band.start, many)


def int4_meet_in_the_middle(split: np.ndarray, w: Int4Matrix, rows: np.ndarray, helper: Helper) -> None:
    """rows [out, N], for few tokens with one helper: this process takes tiles from the first on,
    the helper from the last back, until they meet (see meet_in_the_middle)."""
    tiles = int4_row_tiles(w, split.shape[0])
    send_int4_band(helper, split, w, Band(0, w.shape[0]), claims=(0, len(tiles)))
    claims = helper.claims()
    apply_int4_tiles(split, w, tiles, rows, claim=from_the_front(claims))
    helper.answer()
    taken = int(claims[1])  # the first tile the helper took, if any
    helper.copy_into(rows, tiles[taken][0] if taken < len(tiles) else w.shape[0], False)


def int4_shares(w: Int4Matrix, parts: int, height: int) -> list[Band]:
    """The weight's rows cut into `parts` bands of whole runs of `height` rows, as even as they
    allow (some empty when there are fewer runs than parts)."""
    tiles = -(-w.shape[0] // height)
    cuts = [min(tiles * p // parts * height, w.shape[0]) for p in range(parts + 1)]
    return [Band(cuts[p], cuts[p + 1]) for p in range(parts)]


def int4_band_matrix(w: Int4Matrix, band: Band) -> Int4Matrix:
    """The weight's rows [start, end) with their group scales, as a matrix of its own."""
    origin = None if w.origin is None else w.origin.at(band.start * w.packed.strides[0])
    return replace(w, packed=w.packed[band.start : band.end], scales=w.scales[band.start : band.end], origin=origin)


def send_int4_band(helper: Helper, split: np.ndarray, w: Int4Matrix, band: Band,
                   claims: tuple[int, int] | None = None) -> None:
    """Send a band of an INT4 product: the inputs [N, in] into the scratch, then the message. The
    band's group scales are read by the helper where they lie in the words' file when they are
    that file's BF16 bytes (scales_in_file), else put in the scratch after the inputs (in the
    dtype the weight keeps them). With `claims`, the helper takes the band's tiles from the last
    back (the two tile indices set to them first: the band is the whole weight)."""
    scales = w.scales[band.start : band.end]  # float32 or BF16 [rows, in / group]
    scales_at = scales_in_file(w)
    sent = 0 if scales_at is not None else scales.nbytes  # bytes of scales in the scratch
    helper.send_inputs(split, band.end - band.start, sent)
    if sent:
        at = CLAIMS_BYTES + helper.inputs_bytes
        np.frombuffer(helper.scratch, scales.dtype, scales.size, at).reshape(scales.shape)[:] = scales
    if claims is not None:
        helper.claims()[:] = claims
    path_bytes = os.fsencode(w.origin.path)
    how = (0 if claims is None else MEET) | (0 if scales.dtype == np.float32 else BF16_SCALES)
    numbers = INT4_BAND.pack(*w.origin.identity, w.origin.offset, band.start, band.end, *w.shape, w.group,
                             split.shape[0], -1 if scales_at is None else scales_at + band.start * scales.strides[0],
                             int4_tile_height(w, split.shape[0]), len(path_bytes), how)
    helper.conn.send_bytes(b"I" + numbers + path_bytes)
    helper.sent.append((band, sent))  # its rows go after its scales in the scratch, if any


def scales_in_file(w: Int4Matrix) -> int | None:
    """The byte offset of the weight's group scales in the file its words are read from, when they
    are BF16 bytes of that file as stored (rows one after another, in the same memory map as the
    words, which lie at w.origin's offset there): the helper reads them from its own map of the
    file, and nothing is copied. None for scales held anywhere else."""
    if w.scales.dtype.name != "bfloat16" or not w.scales.flags.c_contiguous:
        return None
    mapped = file_map_of(w.packed)
    if mapped is None or file_map_of(w.scales) is not mapped:
        return None
    start = np.frombuffer(mapped, np.uint8, 1).ctypes.data  # the address of the map's first byte
    if w.packed.ctypes.data - start != w.origin.offset:
        return None
    return w.scales.ctypes.data - start


def file_map_of(array: np.ndarray) -> mmap.mmap | None:
    """The memory map an array is a view of (through views and memoryviews), or None."""
    while isinstance(array, np.ndarray):
        array = array.base
    if isinstance(array, memoryview):
        array = array.obj
    return array if isinstance(array, mmap.mmap) else None


def fp4_bands(tokens: np.ndarray, tokens_t: np.ndarray, w: Fp4Matrix, rows: np.ndarray) -> bool:
    """rows [out, N] = the FP4 product of a few tokens' inputs [N, in] (tokens_t: the same, [in, N]),
    shared with the helpers: tiles from both ends with one helper, else one band of whole tiles
    for this process and one for each helper. False (nothing done) past FP4_SHARED_MOST_TOKENS
    tokens (threads share those as well: their GEMMs let go of the GIL; a [2048, 4096] product of
    512 tokens took 64.7 ms with threads, 67.6 with the helper), when the bytes are not a file's,
    or with no helpers."""
    if not sharing() or w.origin is None or tokens.shape[0] > FP4_SHARED_MOST_TOKENS:
        return False
    return with_helpers(lambda workers: shared_fp4(tokens, tokens_t, w, rows, workers))


def shared_fp4(tokens: np.ndarray, tokens_t: np.ndarray, w: Fp4Matrix, rows: np.ndarray,
               workers: list[Helper]) -> None:
    """Tiles from both ends with one helper, else a band of whole tiles each."""
    tiles = fp4_row_tiles(w, tokens.shape[0])
    if len(workers) == 1:
        send_fp4_band(workers[0], tokens, w, Band(0, w.shape[0]), tiles, claims=(0, len(tiles)))
        claims = workers[0].claims()
        apply_fp4_tiles(tokens_t, w, tiles, rows, claim=from_the_front(claims))
        workers[0].answer()
        taken = int(claims[1])  # the first tile the helper took, if any
        workers[0].copy_into(rows, tiles[taken][0] if taken < len(tiles) else w.shape[0], False)
        return
    cuts = [len(tiles) * p // (len(workers) + 1) for p in range(len(workers) + 2)]
    shares = [tiles[cuts[p] : cuts[p + 1]] for p in range(len(workers) + 1)]
    sent = [(helper, share) for helper, share in zip(workers, shares[1:]) if share]
    for helper, share in sent:
        send_fp4_band(helper, tokens, w, Band(share[0][0], share[-1][1]), share)
    apply_fp4_tiles(tokens_t, w, shares[0], rows)
    for helper, share in sent:
        helper.answer()
        helper.copy_into(rows, share[0][0], False)


def send_fp4_band(helper: Helper, tokens: np.ndarray, w: Fp4Matrix, band: Band, tiles: list[tuple[int, int]],
                  claims: tuple[int, int] | None = None) -> None:
    """Send a band of an FP4 product, whose tiles are `tiles` (all of one height but the last): the
    inputs [N, in] and the band's E8M0 scale bytes into the scratch, then the message. With
    `claims`, the helper takes the band's tiles from the last back (the two tile indices set to
    them first: the band is the whole weight)."""
    scales = w.scales[band.start : band.end]  # E8M0 bytes [rows, in / 32]
    room = aligned(scales.size)
    helper.send_inputs(tokens, band.end - band.start, room)
    at = CLAIMS_BYTES + helper.inputs_bytes
    np.frombuffer(helper.scratch, np.uint8, scales.size, at).reshape(scales.shape)[:] = scales
    if claims is not None:
        helper.claims()[:] = claims
    path_bytes = os.fsencode(w.origin.path)
    height = tiles[0][1] - tiles[0][0]
    numbers = FP4_BAND.pack(*w.origin.identity, w.origin.offset, band.start, band.end, *w.shape, tokens.shape[0],
                            height, len(path_bytes), 0 if claims is None else MEET)
    helper.conn.send_bytes(b"F" + numbers + path_bytes)
    helper.sent.append((band, room))  # its rows go after its scales in the scratch


def aligned(nbytes: int) -> int:
    """Bytes rounded up to whole 8s, so what follows them in the scratch lies aligned (an FP4
    band's scale bytes, then its float32 rows)."""
    return -(-nbytes // 8) * 8


# ---------------------------------------------------------------------------------------------
# The helper's side


# Work of a kind more messages may ask for (kernels.experts): (the pipe, scratch, the mapped files, the
# message) -> the file ranges read (as multiply_band returns one), and whether NaN codes were found
Work = Callable[[Connection, mmap.mmap, dict, bytes], tuple[list[tuple], bool]]


def serve(conn: Connection, more: dict[bytes, Work] | None = None) -> None:
    """The helper process's loop: map scratch, multiply bands (or do the work of the kinds in
    `more`, by the message's first byte), until the pipe closes."""
    global _here
    _here = True  # a helper has no helpers
    parallel.single_threaded_blas()
    scratch, files, resident = None, {}, MappedBudget(BAND_RESIDENT_BYTES)
    while True:
        try:
            message = receive(conn)
        except (EOFError, OSError):
            return
        reads, found = [], False
        try:
            if message[:1] == b"S":
                fd = recv_handle(conn)
                scratch = mmap.mmap(fd, SCRATCH.unpack_from(message, 1)[0])
                os.close(fd)
            elif message[:1] == b"I":
                reads = [multiply_int4_band(scratch, files, message)]
            elif message[:1] == b"F":
                reads = [multiply_fp4_band(scratch, files, message)]
            elif more and message[:1] in more:
                reads, found = more[message[:1]](conn, scratch, files, message)
            else:
                read, found = multiply_band(scratch, files, message)
                reads = [read]
            conn.send_bytes(OK_NAN if found else OK)
        except Exception as e:  # noqa: BLE001 (any failure is reported back; the other side stops using helpers)
            try:
                conn.send_bytes(f"{type(e).__name__}: {e}".encode(errors="backslashreplace"))
            except OSError:  # the other side is gone
                return
        try:  # after the answer: the other side does not wait for old pages to be let go
            for read in reads:
                keep_resident(resident, *read)
        except OSError:  # the pages stay mapped: more memory, the same results
            pass


def multiply_band(scratch, files, message: bytes) -> tuple:
    """A band message's rows of the product into the scratch, after the inputs there.
    [N, in] -> [rows, N]. Returns the file map and byte range the codes were read from, and
    whether NaN codes were found in tiles shared from both ends."""
    where, band, in_dim, block, n, rows_at, k, how, scales = unpacked_band(message)
    rows = band.end - band.start
    tokens = np.frombuffer(scratch, np.float32, n * in_dim, CLAIMS_BYTES).reshape(n, in_dim)
    flat = np.frombuffer(scratch, np.float32, rows * n, CLAIMS_BYTES + n * in_dim * 4 + rows_at)
    view, fault_bytes = file_map(files, where)
    codes_at = where.at(band.start * in_dim)
    codes = np.frombuffer(view, np.uint8, rows * in_dim, codes_at.offset).reshape(rows, in_dim)
    read = (view, codes_at.offset, rows * in_dim, fault_bytes)
    w = Fp8Matrix(codes, scales, block, origin=codes_at)
    result = result_arrays(rows, n, many_tokens(n, w), flat)[1]
    if not how & MEET:
        apply_tiles(tokens, w, k, result)
        return read, False
    nan_check = NanCheck(w, checking=bool(how & CHECK_NAN))  # the other side remembers what both found
    apply_tiles(tokens, w, k, result, claim=from_the_back(np.frombuffer(scratch, np.int64, 2)), nan_check=nan_check)
    return read, nan_check.found


def multiply_int4_band(scratch, files, message: bytes) -> tuple:
    """An INT4 band message's rows of the product into the scratch, after the inputs (in the tiles'
    order) and the band's group scales there (or, where the message gives their offset, after the
    inputs, the scales read from the words' file).  [N, in] -> [rows, N]; tiles from the last back
    when shared from both ends. Returns the file map and byte range the words were read from."""
    *identity, offset, start, end, _, in_dim, group, n, scales_at, height, path_length, how = \
        INT4_BAND.unpack_from(message, 1)
    rows, groups, row_bytes = end - start, in_dim // group, in_dim // 2
    where = FileBytes(message_path(message, INT4_BAND, path_length, "INT4"), offset, tuple(identity))
    view, fault_bytes = file_map(files, where)
    words_at = where.at(start * row_bytes)
    packed = np.frombuffer(view, np.int32, rows * in_dim // 8, words_at.offset).reshape(rows, in_dim // 8)
    inputs_end = CLAIMS_BYTES + n * in_dim * 4
    scale_dtype = dtypes.ml("bfloat16") if how & BF16_SCALES else np.float32
    in_scratch = scales_at < 0
    scales = np.frombuffer(scratch if in_scratch else view, scale_dtype, rows * groups,
                           inputs_end if in_scratch else scales_at).reshape(rows, groups)
    w = Int4Matrix(packed, scales, in_dim, group, origin=words_at)
    tokens = np.frombuffer(scratch, np.float32, n * in_dim, CLAIMS_BYTES).reshape(n, in_dim)
    flat = np.frombuffer(scratch, np.float32, rows * n, inputs_end + (scales.nbytes if in_scratch else 0))
    many = n > MANY_TOKENS
    claim = from_the_back(np.frombuffer(scratch, np.int64, 2)) if how & MEET else None
    apply_int4_tiles(tokens, w, spans(rows, height), result_arrays(rows, n, many, flat)[1], claim=claim)
    return view, words_at.offset, rows * row_bytes, fault_bytes


def multiply_fp4_band(scratch, files, message: bytes) -> tuple:
    """An FP4 band message's rows of the product of a few tokens into the scratch, after the inputs
    and the band's E8M0 scale bytes there.  [N, in] -> [rows, N]; tiles from the last back when
    shared from both ends. Returns the file map and byte range the bytes were read from."""
    *identity, offset, start, end, _, in_dim, n, height, path_length, how = FP4_BAND.unpack_from(message, 1)
    rows, row_bytes = end - start, in_dim // 2
    where = FileBytes(message_path(message, FP4_BAND, path_length, "FP4"), offset, tuple(identity))
    view, fault_bytes = file_map(files, where)
    bytes_at = where.at(start * row_bytes)
    packed = np.frombuffer(view, np.uint8, rows * row_bytes, bytes_at.offset).reshape(rows, row_bytes)
    inputs_end = CLAIMS_BYTES + n * in_dim * 4
    scales = np.frombuffer(scratch, np.uint8, rows * in_dim // fp4.GROUP, inputs_end).reshape(rows, -1)
    tokens = np.frombuffer(scratch, np.float32, n * in_dim, CLAIMS_BYTES).reshape(n, in_dim)
    flat = np.frombuffer(scratch, np.float32, rows * n, inputs_end + aligned(scales.size))
    w = Fp4Matrix(packed, scales, origin=bytes_at)
    claim = from_the_back(np.frombuffer(scratch, np.int64, 2)) if how & MEET else None
    apply_fp4_tiles(np.ascontiguousarray(tokens.T), w, spans(rows, height), flat.reshape(rows, n), claim=claim)
    return view, bytes_at.offset, rows * row_bytes, fault_bytes


def message_path(message: bytes, numbers: struct.Struct, path_length: int, kind: str) -> str:
    """The file path that follows a band message's numbers, the message checked to end there."""
    path_end = 1 + numbers.size + path_length
    if len(message) != path_end:
        raise ValueError(f"{kind} band message of {len(message)} bytes, expected {path_end} (the numbers and the path)")
    return os.fsdecode(message[1 + numbers.size : path_end])


def file_map(files: dict, where: FileBytes) -> tuple[mmap.mmap, int]:
    """The helper's map of the file the bytes lie in (mapped), made once: a map stays on the file it
    was made from, whatever the path holds now."""
    key = (where.path, where.identity)
    if key not in files:
        files[key] = mapped(where)
    return files[key]


def unpacked_band(message: bytes) -> tuple:
    """(the codes' FileBytes, band, in, block, tokens, where its rows go, k, how, the band's scale
    rows) of a band message."""
    *identity, offset, start, end, _, in_dim, block_rows, block_columns, n, rows_at, k, path_length, how = \
        BAND.unpack_from(message, 1)
    path_end = 1 + BAND.size + path_length
    used = fp8.scale_rows(start, end, block_rows)
    scale_shape = (used.stop - used.start, -(-in_dim // block_columns))
    if len(message) != path_end + 4 * scale_shape[0] * scale_shape[1]:
        raise ValueError(f"band message of {len(message)} bytes, expected scales {list(scale_shape)} after the path")
    scales = np.frombuffer(message, np.float32, scale_shape[0] * scale_shape[1], path_end).reshape(scale_shape)
    where = FileBytes(os.fsdecode(message[1 + BAND.size : path_end]), offset, tuple(identity))
    return where, Band(start, end), in_dim, (block_rows, block_columns), n, rows_at, k, how, scales


def mapped(where: FileBytes) -> tuple[mmap.mmap, int]:
    """The file mapped read-only and advised as the checkpoint reader's, and the bytes a fault
    maps; the file the other process read, or an error (it was rewritten or replaced since)."""
    with open(where.path, "rb") as f:
        if file_identity(os.fstat(f.fileno())) != where.identity:
            raise ValueError(f"{where.path} changed after it was read: not the bytes the product is of")
        view = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return view, advise_checkpoint_map(view)


def keep_resident(resident: MappedBudget, view: mmap.mmap, start: int, length: int, fault_bytes: int) -> None:
    """As the checkpoint reader does: past BAND_RESIDENT_BYTES of mapped bands (counted in the
    blocks a fault maps), the least recently used are let go."""
    resident.use((id(view), start), spanned(start, start + length, fault_bytes),
                 lambda: advise_range(view, mmap.MADV_DONTNEED, start, start + length))
