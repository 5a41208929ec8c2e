"""Synthetic weights: any tensor made on demand, deterministically from (seed, name), stored as a
checkpoint stores it (see weights.names), so a routed expert is only ever made when a token
chooses it.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator

import numpy as np

from stepper import dtypes, fp8, int4
from stepper.config import Config
from stepper.errors import StepperError
from stepper.weights.fused_experts import fused_name
from stepper.weights.names import EMBED, layer_shapes, shape_of, storage_dtype
from stepper.weights.stored import INT4, Fp8Matrix, Int4Matrix, Stored, row_spans

KEPT_BYTES = 64 << 20  # stored tensors kept once made, at most: a tiny model's every weight, a full-size layer's few
STORED_BYTES = {"F8_E4M3": 1, "BF16": 2, INT4: 0.5}  # a value's bytes as stored (F32 and the rest: 4), scales aside


def stored_size(stored: Stored) -> int:
    return sum(a.nbytes for a in (stored.data, stored.scale_inv) if a is not None)


class SyntheticWeights:
    """Deterministic weights with realistic scales, made per tensor from (seed, name).

    Values are drawn in float32 and then stored as a checkpoint stores them (FP8 with block
    scales, INT4 with group scales, BF16, F32); `get` returns what a reader of that checkpoint would compute.
    Linear weights [out, in] ~ N(0, 1/in), so activations keep unit scale; RMSNorm weights near
    1; the router's e_score_correction_bias ~ N(0, 0.1^2), large enough to change some choices (the
    indexer's LayerNorm bias, Mistral Large 4's query scales' slopes and LeRoPE's alpha too, the
    scales' offsets about 1);
    embeddings ~ N(0, 1), made row by row.
    """

    def __init__(self, config: Config, seed: int = 0):
        self.config = config
        self.seed = seed
        self.kept: OrderedDict[str, Stored] = OrderedDict()  # made and kept, least recently used first
        self.kept_bytes = 0
        self.kept_limit = KEPT_BYTES  # a run's plan may give less (stepper.planning.memory.limit_seeded)
        self.lock = threading.Lock()  # experts are made on both cores

    def get(self, name: str) -> np.ndarray:
        return self.stored(name).as_float32(name)

    def matrix(self, name: str) -> np.ndarray | Fp8Matrix | Int4Matrix:
        return self.stored(name).matrix(name)

    def get_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        if name == EMBED:
            return self._stored_as(name, self._embedding_rows(np.asarray(rows))).as_float32(name)
        return self.get(name)[rows]

    def row_bands(self, name: str, rows: int) -> Iterator[Stored]:
        """stored(name) band by band, equal to it bit for bit: the bands are drawn one after
        another from the tensor's one stream of normals, each then scaled and stored alone."""
        shape = shape_of(self.config, name)
        height = 1 if storage_dtype(self.config, name) != "F8_E4M3" else shape[0] if self._per_tensor else \
            self.config.quantization.weight_block_size[0]  # the rows sharing a scale: all of them with one per tensor
        normals = self._rng(name)
        for start, stop in row_spans(shape[0], rows, height):
            if name == EMBED:
                values = self._embedding_rows(np.arange(start, stop))
            else:
                values = self._scaled(name, shape,
                                      normals.standard_normal((stop - start, *shape[1:]), dtype=np.float32))
            yield self._stored_as(name, values)

    def has(self, name: str) -> bool:
        try:
            shape_of(self.config, name)
        except StepperError:
            return False
        return True

    def check(self, layers: Iterable[int], with_globals: bool) -> None:
        """Synthetic weights exist for every name of the config."""

    def stored(self, name: str) -> Stored:
        """The tensor as stored, made once and kept (up to kept_limit, least recently used let go):
        a decode step reads the same weights as the step before, and making one (normals, then
        FP8 or INT4 rounding) costs more than the step's product with it. Kept read-only."""
        with self.lock:
            if name in self.kept:
                self.kept.move_to_end(name)
                return self.kept[name]
        made = self._made(name)
        size = stored_size(made)
        with self.lock:
            if name not in self.kept and size <= self.kept_limit // 4:
                for array in (made.data, made.scale_inv):
                    if array is not None:
                        array.flags.writeable = False
                self.kept[name], self.kept_bytes = made, self.kept_bytes + size
                while self.kept_bytes > self.kept_limit:
                    _, going = self.kept.popitem(last=False)
                    self.kept_bytes -= stored_size(going)
        return made

    def kept_bound(self, layers: Iterable[int]) -> int:
        """At most what `stored` keeps in a run of these layers: their weights as stored, up to kept_limit."""
        shapes = [(name, shape) for layer in layers for name, shape in layer_shapes(self.config, layer).items()]
        return min(self.kept_limit, int(sum(math.prod(shape) * STORED_BYTES.get(storage_dtype(self.config, name), 4)
                                       for name, shape in shapes)))

    def _made(self, name: str) -> Stored:
        if self._per_tensor and self.config.fused_experts and fused_name(name, "gate_up_proj"):
            return self._gate_or_up(name)
        return self._stored_as(name, self.values(name))

    @property
    def _per_tensor(self) -> bool:
        return self.config.quantization is not None and self.config.quantization.per_tensor

    def _gate_or_up(self, name: str) -> Stored:
        """An expert's gate or up matrix stored fused with one scale per tensor: the expert's gate
        and up rows quantized together ([2 * inter, d], one scale), then its half taken."""
        gate = name.replace(".up_proj.", ".gate_proj.")
        values = np.concatenate([self.values(gate), self.values(gate.replace(".gate_", ".up_"))])  # [2 * inter, d]
        codes, scale = fp8.quantize(values, values.shape)  # scale [1, 1]
        inter = codes.shape[0] // 2
        half = codes[:inter] if name == gate else codes[inter:]
        return Stored("F8_E4M3", half, fp8.per_tensor_grid(half.shape, scale[0, 0]), fp8.BLOCK)

    def _stored_as(self, name: str, values: np.ndarray) -> Stored:
        dtype = storage_dtype(self.config, name)
        if dtype == "F8_E4M3" and self._per_tensor:  # one scale, read as a block grid of it
            codes, scale = fp8.quantize(values, values.shape)
            return Stored(dtype, codes, fp8.per_tensor_grid(values.shape, scale[0, 0]), fp8.BLOCK)
        if dtype == "F8_E4M3":
            block = self.config.quantization.weight_block_size
            codes, scale_inv = fp8.quantize(values, block)
            return Stored(dtype, codes, scale_inv, block)
        if dtype == INT4:
            group = self.config.int4.group_size
            packed, scales = int4.quantize_int4(values, group, name=name)
            return Stored(dtype, packed, scales, (1, group), columns=values.shape[1])
        if dtype == "BF16":
            return Stored(dtype, values.astype(dtypes.ml("bfloat16")))
        return Stored(dtype, values)

    def values(self, name: str) -> np.ndarray:
        """The float32 values before storage rounding."""
        if name == EMBED:
            return self._embedding_rows(np.arange(self.config.vocab_size))
        shape = shape_of(self.config, name)
        return self._scaled(name, shape, self._normal(name, shape))

    @staticmethod
    def _scaled(name: str, shape: tuple[int, ...], z: np.ndarray) -> np.ndarray:
        """Standard normals z (all or some rows of the tensor) to its values; z is reused."""
        if name.endswith("norm.weight"):
            return np.float32(1) + np.float32(0.1) * z
        if name.endswith(("e_score_correction_bias", "norm.bias", "softmax_scaling.scale", "rotary_emb.alpha")):
            return np.float32(0.1) * z
        if name.endswith("softmax_scaling.bias"):  # Mistral Large 4's query scales about 1
            return np.float32(1) + np.float32(0.1) * z
        if name.endswith(("A_log", "dt_bias")):  # KDA's decay rate exp(A_log) about 4, softplus(dt_bias) about 0.02
            return np.float32(0.5) * z + np.float32(1.4 if name.endswith("A_log") else -4.0)
        z *= np.float32(1 / np.sqrt(shape[-1]))  # in place: a full-size weight's normals are 0.5 GB
        return z

    def _embedding_rows(self, rows: np.ndarray) -> np.ndarray:
        """Embedding rows ~ N(0, 1), each made on its own so a prompt never makes the whole table."""
        d = self.config.hidden_size
        out = np.empty((*rows.shape, d), dtype=np.float32)
        for index, row in np.ndenumerate(rows):
            out[index] = self._normal(EMBED, (d,), int(row))
        return out

    def _normal(self, name: str, shape: tuple[int, ...], *stream: int) -> np.ndarray:
        return self._rng(name, *stream).standard_normal(shape, dtype=np.float32)

    def _rng(self, name: str, *stream: int) -> np.random.Generator:
        """The tensor's stream of normals, from (seed, name[, stream]). Drawn in pieces, one after
        another, it gives the same numbers as in one draw."""
        digest = hashlib.sha256(name.encode()).digest()
        words = np.frombuffer(digest[:16], dtype=np.uint32).tolist()
        return np.random.default_rng(np.random.SeedSequence([self.seed, *words, *stream]))
