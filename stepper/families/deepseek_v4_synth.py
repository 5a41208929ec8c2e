"""Synthetic DeepSeek-V4 weights, and `stepper synth` of a V4 checkpoint in the published layout.

Every tensor is made on demand from (seed, its published name) and stored as the published
checkpoint stores it (stepper.weights.published_store: FP8 e4m3 with an E8M0 `.scale` per 128 x 128
block, routed experts FP4 e2m1 as I8 [out, in/2] with an E8M0 `.scale` per 32 inputs, BF16, F32;
`tid2eid` I64 with k distinct experts per token). The tensors and their kinds are those
stepper.weights.deepseek_v4_names lists for the config. A run on the synthetic weights reads what a
reader of the written checkpoint computes, bit for bit.

The written folder: `config.json` (the published fields, `compress_ratios` with the MTP block's
entry), `model.safetensors.index.json`, and shards `model-000NN-of-000MM.safetensors`: the
embedding, one per layer, the head (final norm, head, hc_head), then the multi-token-prediction
block `mtp.0.*` that no run reads.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from stepper import dtypes, files
from stepper.errors import StepperError
from stepper.families.deepseek_v4_config import V4Config
from stepper.families.deepseek_v4_weights import published_name
from stepper.untrusted import shown
from stepper.weights import deepseek_v4_names as names
from stepper.weights.published_store import safetensors_dtype, stored_arrays, stored_size
from stepper.weights.safetensors_writer import Entry, write_safetensors
from stepper.weights.stored import FP4, Stored
from stepper.weights.synth_checkpoint import check_replaceable, not_from_synth, publish_folder, write_index

MTP_NORMS = ("enorm.weight", "hnorm.weight", "norm.weight")
ROW_BY_ROW = ("embed.weight", "head.weight")  # BF16 tables made a row at a time: never whole in memory
MTP_PROJECTIONS = ("e_proj.weight", "h_proj.weight")
STORAGE = ("published (DeepSeek-V4's layout): linear weights F8_E4M3 with an F8_E8M0 .scale per 128x128 block; routed "
           "experts FP4 e2m1 as I8 [out, in/2] (low nibble first) with an F8_E8M0 .scale per 32 inputs; norms, "
           "embedding, head, router gate and the compressors' and indexer's projections BF16; attn_sink, ape, hc_* "
           "and gate.bias F32; tid2eid I64; the MTP block mtp.0.* too (no run reads it)")


def published_tensors(cfg: V4Config) -> dict[str, names.Tensor]:
    """Every tensor a run reads, by published name, with its shape and kind."""
    tensors = dict(names.global_tensors(cfg))
    for layer in range(cfg.num_hidden_layers):
        tensors |= {names.layer_prefix(layer) + k: t for k, t in names.layer_tensors(cfg, layer).items()}
    return tensors


class V4Synthetic:
    """Deterministic V4 weights by the model's names, as a reader of the published checkpoint sees them."""

    storage = STORAGE  # how a written checkpoint stores them (a fixture's manifest says it)
    written_as = "FP8 with E8M0 block scales, FP4 routed experts"  # the same, in a few words (synth's refusals)

    def __init__(self, config: V4Config, seed: int = 0):
        self.config = config
        self.seed = seed
        self.tensors = published_tensors(config)

    def stored_bytes(self) -> int:
        """About what the written checkpoint holds (the MTP block too; F32 counted for every float tensor)."""
        return sum(stored_size(t) for tensors in shard_plan(self.config) for t in tensors.values())

    # The weight source the model reads (transformers' names)

    def get(self, name: str) -> np.ndarray:
        """A float32 tensor as a reader decodes it; tid2eid as its integers."""
        published, tensor = self._tensor(name)
        if tensor.kind == names.INDEX:
            return self._tid2eid(published, tensor.shape)
        return self.as_stored(name).as_float32(published)

    def get_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        """get(name)[rows]; the embedding's rows made alone (V4-Flash's whole table is 2 GB in float32)."""
        published = published_name(name)
        if published in ROW_BY_ROW:
            return self._bf16(self._rows(published, np.asarray(rows)))
        return self.get(name)[rows]

    def matrix(self, name: str):
        """What the model multiplies with: FP8 and FP4 weights kept as stored (decoded tile by tile in
        the products, stepper.kernels), BF16 and F32 ones too."""
        return self.as_stored(name).matrix(published_name(name))

    def as_stored(self, name: str) -> Stored:
        """The tensor as a reader of the published checkpoint holds it (FP4 bytes and E8M0 scales, ...)."""
        return self.published_stored(self._tensor(name)[0])

    def has_published(self, published: str) -> bool:
        return published in self.tensors

    def published_stored(self, published: str) -> Stored:
        """as_stored by the tensor's published name (`stepper fp8 --weight` on a preset)."""
        data, *scale = self.stored(published, self.tensors[published]).values()
        kind = safetensors_dtype(data)
        return Stored(FP4 if kind == "I8" else kind, data, scale[0] if scale else None)

    def _tensor(self, name: str) -> tuple[str, names.Tensor]:
        published = published_name(name)
        if published not in self.tensors:
            raise StepperError(f"synthetic {shown(self.config.name)}: no tensor '{shown(name)}'")
        return published, self.tensors[published]

    def row_bands(self, name: str, rows: int) -> Iterator[Stored]:
        """The tensor `rows` rows at a time; the embedding's and the head's blocks made one by one."""
        published = published_name(name)
        if published not in ROW_BY_ROW:
            yield from Stored("F32", self.get(name)).row_bands(rows)
            return
        total = self.tensors[published].shape[0]
        for start in range(0, total, rows):
            yield Stored("F32", self._bf16(self._rows(published, np.arange(start, min(start + rows, total)))))

    def has(self, name: str) -> bool:
        return published_name(name) in self.tensors

    def check(self, layers, with_globals: bool) -> None:
        """Synthetic weights exist for every tensor of the config."""

    def write_checkpoint(self, out: Path, force: bool, progress: Callable[[int, int], None]) -> Path:
        """`stepper synth`: these weights written in the published layout (synth_v4_checkpoint)."""
        return synth_v4_checkpoint(self.config, out, self.seed, force, progress)

    # The published form

    def stored(self, published: str, tensor: names.Tensor) -> dict[str, np.ndarray]:
        """{stored name: array}: the weight, and its `.scale` when quantized."""
        if tensor.kind == names.INDEX:
            return stored_arrays(published, tensor, self._tid2eid(published, tensor.shape))
        return stored_arrays(published, tensor, self.values(published, tensor.shape))

    def values(self, published: str, shape: tuple[int, ...]) -> np.ndarray:
        """The float32 values before storage: norms near 1, biases and the hyper-connections' base
        small, their scales near 1, sinks, position biases and the embedding ~ N(0, 1), projections
        ~ N(0, 1/in)."""
        if published in ROW_BY_ROW:
            return self._rows(published, np.arange(shape[0]))
        z = self._rng(published).standard_normal(shape, dtype=np.float32)
        if published.endswith("norm.weight"):
            return np.float32(1) + np.float32(0.1) * z
        if published.endswith(("_base", ".bias")):
            return np.float32(0.1) * z
        if published.endswith("_scale"):
            return np.float32(1) + np.float32(0.1) * z
        if published.endswith(("attn_sink", ".ape")):
            return z
        return z * np.float32(1 / np.sqrt(shape[-1]))

    def _tid2eid(self, published: str, shape: tuple[int, ...]) -> np.ndarray:
        """k distinct experts per token: consecutive entries of a shuffled list of the experts,
        from a random start."""
        rng = self._rng(published)
        experts = rng.permutation(self.config.n_routed_experts)
        start = rng.integers(0, len(experts), size=shape[0])
        return experts[(start[:, None] + np.arange(shape[1])) % len(experts)].astype(np.int64)

    def _rows(self, published: str, rows: np.ndarray) -> np.ndarray:
        """Rows of the embedding (~ N(0, 1)) or the head (~ N(0, 1/d)), each from its own stream.
        [R] -> [R, d]"""
        d = self.config.hidden_size
        scale = np.float32(1) if published == "embed.weight" else np.float32(1 / np.sqrt(d))
        out = np.empty((*rows.shape, d), dtype=np.float32)
        for index, row in np.ndenumerate(rows):
            out[index] = self._rng(published, int(row)).standard_normal(d, dtype=np.float32) * scale
        return out

    @staticmethod
    def _bf16(values: np.ndarray) -> np.ndarray:
        """As a reader of the BF16 table computes it."""
        return values.astype(dtypes.ml("bfloat16")).astype(np.float32)

    def _rng(self, name: str, *stream: int) -> np.random.Generator:
        words = np.frombuffer(hashlib.sha256(name.encode()).digest()[:16], dtype=np.uint32).tolist()
        return np.random.default_rng(np.random.SeedSequence([self.seed, *words, *stream]))


# ---------------------------------------------------------------------------------------------
# The checkpoint on disk


def shard_plan(cfg: V4Config) -> list[dict[str, names.Tensor]]:
    """Published tensors, shard by shard: embedding, each layer, the head, the MTP blocks."""
    outer = dict(names.global_tensors(cfg))
    embed = {"embed.weight": outer.pop("embed.weight")}
    layers = [{names.layer_prefix(i) + k: t for k, t in names.layer_tensors(cfg, i).items()}
              for i in range(cfg.num_hidden_layers)]
    return [embed, *layers, outer, *[mtp_tensors(cfg, k) for k in range(cfg.num_nextn_predict_layers)]]


def mtp_tensors(cfg: V4Config, k: int) -> dict[str, names.Tensor]:
    """The k-th multi-token-prediction block: a layer (of its compress_ratios entry) under `mtp.{k}.`,
    its own norms and projections of the embedding and the hidden state, its own head collapse."""
    d = cfg.hidden_size
    block = {f"mtp.{k}.{name}": t for name, t in names.layer_tensors(cfg, cfg.num_hidden_layers + k).items()}
    block |= {f"mtp.{k}.{name}": names.Tensor((d,), names.FLOAT) for name in MTP_NORMS}
    block |= {f"mtp.{k}.{name}": names.Tensor((d, d), names.LINEAR) for name in MTP_PROJECTIONS}
    head = names.global_tensors(cfg)
    return block | {f"mtp.{k}.{name}": head[name] for name in ("hc_head_fn", "hc_head_base", "hc_head_scale")}


def synth_v4_checkpoint(cfg: V4Config, out: Path, seed: int = 0, force: bool = False,
                        progress: Callable[[int, int], None] = lambda done, total: None) -> Path:
    """Write the whole checkpoint to `out` (new, or with `force` one stepper wrote); returns out."""
    check_replaceable(out, force, not_from_synth, "a checkpoint stepper synth wrote")
    source = V4Synthetic(cfg, seed)
    plan = shard_plan(cfg)
    partial = files.temp_folder(out)
    try:
        weight_map: dict[str, str] = {}
        total = 0
        for i, tensors in enumerate(plan, start=1):
            shard = f"model-{i:05d}-of-{len(plan):05d}.safetensors"
            entries = [Entry(name, safetensors_dtype(array), array.shape, lambda array=array: array)
                       for published, tensor in tensors.items()
                       for name, array in source.stored(published, tensor).items()]
            write_safetensors(partial / shard, entries, {"format": "pt"})
            weight_map |= dict.fromkeys((e.name for e in entries), shard)
            total += sum(e.nbytes for e in entries)
            progress(i, len(plan))
        files.write_new(partial / "config.json", json.dumps(cfg.to_hf(), indent=2) + "\n")
        write_index(partial, {"total_size": total, "stepper_synthetic_seed": seed, "stepper_model": cfg.name},
                    weight_map)
        publish_folder(partial, out, force)
    except OSError as e:
        raise StepperError(f"{shown(out)}: cannot be written ({e.strerror})") from None
    finally:
        files.remove_temp_folder(partial)
    return out
