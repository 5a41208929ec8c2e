"""Where the layer's weights come from, behind one small interface: `source.get(name)`.

Names are those of an HF checkpoint (`model.layers.3.self_attn.kv_a_proj_with_mqa.weight`).
`weight_shapes` lists every tensor a config needs, `storage_dtype` how a Kimi K2 / DeepSeek-V3
checkpoint stores it: linear weights as FP8 e4m3 codes with float32 block scales
(`weight_scale_inv`), norms, embeddings, lm_head and the router's gate in BF16, the router's
bias in float32. `SyntheticWeights` makes any tensor on demand, deterministically from (seed,
name), stored exactly that way, so a routed expert is only ever made when a token chooses it.
`ArrayWeights` serves float32 tensors already in memory (tests, the PyTorch cross-check).
Every source also gives a tensor in blocks of rows (`row_blocks`), so a product with a matrix
too large to hold in float32 (Kimi K2's lm_head, 4.7 GB) can run one block at a time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

import ml_dtypes
import numpy as np

from . import fp8
from .config import Config
from .errors import StepperError
from .fp8_matmul import FileBytes, Fp8Matrix


class WeightSource(Protocol):
    config: Config

    def get(self, name: str) -> np.ndarray:
        """The float32 tensor stored under an HF checkpoint name (FP8 dequantized)."""
        ...

    def get_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        """get(name)[rows], reading only those rows where the source can (embeddings)."""
        ...

    def matrix(self, name: str) -> np.ndarray | Fp8Matrix:
        """A weight to multiply with: float32, or FP8 codes with scales (see ops.linear)."""
        ...

    def row_blocks(self, name: str, rows: int) -> Iterator[Stored]:
        """The stored tensor in consecutive blocks of `rows` rows (the last may be shorter), each
        made or read only when the previous one is done with (see row_spans)."""
        ...

    def has(self, name: str) -> bool: ...

    def check(self, layers: Iterable[int], with_globals: bool) -> None:
        """Raise a StepperError listing every tensor these layers need that is missing or wrong."""
        ...


@dataclass(frozen=True)
class Stored:
    """A tensor as a checkpoint stores it: FP8 codes with their block scales, BF16 or F32."""

    dtype: str  # safetensors dtype name: F8_E4M3, BF16, F16 or F32
    data: np.ndarray
    scale_inv: np.ndarray | None = None  # [ceil(out/128), ceil(in/128)], FP8 only
    block: tuple[int, int] = fp8.BLOCK
    origin: FileBytes | None = None  # where the data lies in a file, read as it is stored

    def to_float32(self, name: str = "") -> np.ndarray:
        if self.dtype == "F8_E4M3":
            return fp8.dequantize(self.data, self.scale_inv, self.block, name=name)
        return np.asarray(self.data, dtype=np.float32)

    def matrix(self, name: str = "") -> np.ndarray | Fp8Matrix:
        """What the model multiplies with: FP8 weights stay FP8 (decoded tile by tile)."""
        if self.dtype == "F8_E4M3":
            return Fp8Matrix.of(self.data, self.scale_inv, self.block, name, self.origin)
        return self.to_float32(name)

    @property
    def height(self) -> int:
        """Rows sharing one scale: a row block must not split them (see row_spans)."""
        return self.block[0] if self.dtype == "F8_E4M3" else 1

    def rows(self, start: int, stop: int) -> Stored:
        """Rows start:stop, with their scales, as a Stored of their own (start on a scale-block edge)."""
        if self.scale_inv is None:
            return Stored(self.dtype, self.data[start:stop])
        scales = self.scale_inv[fp8.scale_rows(start, stop, self.height)]  # [ceil(rows/128), ceil(in/128)]
        origin = None if self.origin is None else self.origin.at(start * self.data.strides[0])
        return Stored(self.dtype, self.data[start:stop], scales, self.block, origin)

    def row_blocks(self, rows: int) -> Iterator[Stored]:
        for start, stop in row_spans(self.data.shape[0], rows, self.height):
            yield self.rows(start, stop)


def row_spans(n: int, rows: int, height: int = 1) -> list[tuple[int, int]]:
    """[start, stop) of consecutive blocks of `rows` rows over n rows, the last possibly shorter.

    height: the rows sharing one FP8 scale; `rows` must be a multiple of it, so that each block
    is quantized (or dequantized) exactly as the whole tensor is.
    """
    if rows < height or rows % height:
        raise ValueError(f"row blocks must be a positive multiple of {height} rows, got {rows}")
    return [(start, min(start + rows, n)) for start in range(0, n, rows)]


def is_linear(name: str) -> bool:
    """The projection weights a DeepSeek-V3 / Kimi K2 checkpoint quantizes to FP8."""
    return name.startswith("model.layers.") and name.endswith(("_proj.weight", "_proj_with_mqa.weight"))


def storage_dtype(cfg: Config, name: str) -> str:
    if name.endswith("e_score_correction_bias"):
        return "F32"
    if cfg.quantization is not None and is_linear(name):
        return "F8_E4M3"
    return "BF16"


EMBED = "model.embed_tokens.weight"


def layer_prefix(layer: int) -> str:
    return f"model.layers.{layer}."


def attention_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    d, h = cfg.hidden_size, cfg.num_attention_heads
    shapes: dict[str, tuple[int, ...]] = {}
    if cfg.q_lora_rank is None:
        shapes["self_attn.q_proj.weight"] = (h * cfg.qk_head_dim, d)
    else:
        shapes["self_attn.q_a_proj.weight"] = (cfg.q_lora_rank, d)
        shapes["self_attn.q_a_layernorm.weight"] = (cfg.q_lora_rank,)
        shapes["self_attn.q_b_proj.weight"] = (h * cfg.qk_head_dim, cfg.q_lora_rank)
    shapes["self_attn.kv_a_proj_with_mqa.weight"] = (cfg.kv_lora_rank + cfg.qk_rope_head_dim, d)
    shapes["self_attn.kv_a_layernorm.weight"] = (cfg.kv_lora_rank,)
    shapes["self_attn.kv_b_proj.weight"] = (h * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank)
    shapes["self_attn.o_proj.weight"] = (d, h * cfg.v_head_dim)
    return shapes


def swiglu_shapes(prefix: str, hidden: int, inter: int) -> dict[str, tuple[int, ...]]:
    return {
        f"{prefix}gate_proj.weight": (inter, hidden),
        f"{prefix}up_proj.weight": (inter, hidden),
        f"{prefix}down_proj.weight": (hidden, inter),
    }


def layer_shapes(cfg: Config, layer: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of one decoder layer, by full HF name, with its shape."""
    d = cfg.hidden_size
    shapes = {"input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,), **attention_shapes(cfg)}
    if cfg.is_moe_layer(layer):
        shapes["mlp.gate.weight"] = (cfg.n_routed_experts, d)
        shapes["mlp.gate.e_score_correction_bias"] = (cfg.n_routed_experts,)
        for e in range(cfg.n_routed_experts):
            shapes.update(swiglu_shapes(f"mlp.experts.{e}.", d, cfg.moe_intermediate_size))
        shared = cfg.moe_intermediate_size * cfg.n_shared_experts
        if shared:
            shapes.update(swiglu_shapes("mlp.shared_experts.", d, shared))
    else:
        shapes.update(swiglu_shapes("mlp.", d, cfg.intermediate_size))
    return {layer_prefix(layer) + k: v for k, v in shapes.items()}


def weight_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """Every tensor of the whole model, by full HF name, with its shape."""
    outer = global_shapes(cfg)
    shapes = {EMBED: outer.pop(EMBED)}  # the embedding first, then the layers, then norm and lm_head
    for layer in range(cfg.num_hidden_layers):
        shapes.update(layer_shapes(cfg, layer))
    return {**shapes, **outer}


def shape_of(cfg: Config, name: str) -> tuple[int, ...]:
    """The shape of one named tensor, without listing all of a full-size model's experts."""
    if name.startswith("model.layers."):
        layer = int(name.split(".")[2])
        if 0 <= layer < cfg.num_hidden_layers:
            shapes = layer_shapes(cfg, layer)
            if name in shapes:
                return shapes[name]
    elif name in (globals_ := global_shapes(cfg)):
        return globals_[name]
    raise StepperError(f"no tensor named '{name}' in model {cfg.name}")


def global_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """The tensors outside the layers: embedding, final norm, lm_head."""
    return {
        EMBED: (cfg.vocab_size, cfg.hidden_size),
        "model.norm.weight": (cfg.hidden_size,),
        "lm_head.weight": (cfg.vocab_size, cfg.hidden_size),
    }


class SyntheticWeights:
    """Deterministic weights with realistic scales, made per tensor from (seed, name).

    Values are drawn in float32 and then stored as a checkpoint stores them (FP8 with block
    scales, BF16, F32); `get` returns what a reader of that checkpoint would compute.
    Linear weights [out, in] ~ N(0, 1/in), so activations keep unit scale; RMSNorm weights near
    1; the router's e_score_correction_bias ~ N(0, 0.1^2), large enough to change some choices;
    embeddings ~ N(0, 1), made row by row.
    """

    def __init__(self, config: Config, seed: int = 0):
        self.config = config
        self.seed = seed

    def get(self, name: str) -> np.ndarray:
        return self.stored(name).to_float32(name)

    def matrix(self, name: str) -> np.ndarray | Fp8Matrix:
        return self.stored(name).matrix(name)

    def get_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        if name == EMBED:
            return self._stored_as(name, self._embedding_rows(np.asarray(rows))).to_float32(name)
        return self.get(name)[rows]

    def row_blocks(self, name: str, rows: int) -> Iterator[Stored]:
        """stored(name) block by block, equal to it bit for bit: the blocks are drawn one after
        another from the tensor's one stream of normals, each then scaled and stored alone."""
        shape = shape_of(self.config, name)
        height = self.config.quantization.weight_block_size[0] if storage_dtype(self.config, name) == "F8_E4M3" else 1
        normals = self._rng(name)
        for start, stop in row_spans(shape[0], rows, height):
            if name == EMBED:
                values = self._embedding_rows(np.arange(start, stop))
            else:
                values = self._scaled(name, shape, normals.standard_normal((stop - start, *shape[1:]), dtype=np.float32))
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
        return self._stored_as(name, self.values(name))

    def _stored_as(self, name: str, values: np.ndarray) -> Stored:
        dtype = storage_dtype(self.config, name)
        if dtype == "F8_E4M3":
            block = self.config.quantization.weight_block_size
            codes, scale_inv = fp8.quantize(values, block)
            return Stored(dtype, codes, scale_inv, block)
        if dtype == "BF16":
            return Stored(dtype, values.astype(ml_dtypes.bfloat16))
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
        if name.endswith("e_score_correction_bias"):
            return np.float32(0.1) * z
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


class ArrayWeights:
    """Weights already in memory, checked against the config's shapes when read."""

    def __init__(self, config: Config, arrays: Mapping[str, np.ndarray], source: str = "weights"):
        self.config = config
        self.arrays = arrays
        self.source = source

    def get_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        return self.get(name)[rows]

    def row_blocks(self, name: str, rows: int) -> Iterator[Stored]:
        return Stored("F32", self.get(name)).row_blocks(rows)

    def matrix(self, name: str) -> np.ndarray:
        return self.get(name)

    def has(self, name: str) -> bool:
        return name in self.arrays

    def check(self, layers: Iterable[int], with_globals: bool) -> None:
        needed = [n for layer in layers for n in layer_shapes(self.config, layer)]
        needed += list(global_shapes(self.config)) if with_globals else []
        missing = [n for n in needed if n not in self.arrays]
        if missing:
            raise StepperError(f"{self.source}: {len(missing)} tensor(s) missing, first '{missing[0]}'")

    def get(self, name: str) -> np.ndarray:
        if name not in self.arrays:
            raise StepperError(f"{self.source}: tensor '{name}' is missing")
        array = np.asarray(self.arrays[name], dtype=np.float32)
        expected = shape_of(self.config, name)
        if array.shape != expected:
            raise StepperError(f"{self.source}: tensor '{name}' has shape {list(array.shape)}, expected {list(expected)}")
        return array
