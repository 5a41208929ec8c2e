"""Synthetic DeepSeek-V4 weights, and `stepper synth` of a V4 checkpoint in the published layout.

Every tensor is made on demand from (seed, its published name), then stored as the published
checkpoint stores it (deepseek_v4_weights.published_storage): FP8 e4m3 with an E8M0 `.scale` per
128 x 128 block, routed experts FP4 e2m1 (two codes a byte, I8 [out, in/2]) with an E8M0 `.scale`
per 32 inputs, BF16, F32, and `tid2eid` I64 (k distinct experts per token). A run on the synthetic
weights reads what a reader of the written checkpoint computes, bit for bit.

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

from stepper import dtypes, files, fp4, fp8
from stepper.errors import StepperError
from stepper.families.deepseek_v4_config import V4Config
from stepper.families.deepseek_v4_weights import (
    EMBED,
    global_shapes,
    layer_prefix,
    layer_shapes,
    published_name,
    published_storage,
    weight_shapes,
)
from stepper.untrusted import shown
from stepper.weights.checkpoint import INDEX
from stepper.weights.safetensors_writer import Entry, write_safetensors
from stepper.weights.stored import Stored
from stepper.weights.synth import check_replaceable, not_from_synth

SCALE = ".scale"
MTP_EXTRA = ("enorm.weight", "hnorm.weight", "e_proj.weight", "h_proj.weight", "norm.weight")


class V4Synthetic:
    """Deterministic V4 weights by the model's names, as a reader of the published checkpoint sees them."""

    def __init__(self, config: V4Config, seed: int = 0):
        self.config = config
        self.seed = seed
        self.shapes = weight_shapes(config)

    # The weight source the model reads (transformers' names)

    def get(self, name: str) -> np.ndarray:
        return decoded(self.stored(published_name(self._known(name)), self.shapes[name]))

    def get_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        return self.get(name)[rows]

    def matrix(self, name: str) -> np.ndarray:
        return self.get(name)

    def row_blocks(self, name: str, rows: int) -> Iterator[Stored]:
        return Stored("F32", self.get(name)).row_blocks(rows)

    def has(self, name: str) -> bool:
        return name in self.shapes

    def _known(self, name: str) -> str:
        if name not in self.shapes:
            raise StepperError(f"synthetic {self.config.name}: no tensor '{name}'")
        return name

    # The published form

    def stored(self, published: str, shape: tuple[int, ...]) -> dict[str, tuple[str, np.ndarray]]:
        """{stored name: (safetensors dtype, array)}: the weight, and its `.scale` when quantized."""
        storage = published_storage(self.config, published)
        if storage == "I64":
            return {published: ("I64", self._tid2eid(published, shape))}
        values = self.values(published, shape)
        scale = published.removesuffix(".weight") + SCALE
        if storage == "F8_E4M3":
            codes, scales = fp4.quantize_fp8_e8m0(values, name=published)
            return {published: ("F8_E4M3", codes), scale: ("F8_E8M0", scales)}
        if storage == "FP4":
            packed, scales = fp4.quantize_fp4(values, name=published)
            return {published: ("I8", packed), scale: ("F8_E8M0", scales)}
        if storage == "BF16":
            return {published: ("BF16", values.astype(dtypes.ml("bfloat16")))}
        return {published: ("F32", values)}

    def values(self, published: str, shape: tuple[int, ...]) -> np.ndarray:
        """The float32 values before storage: norms near 1, biases and the hyper-connections' base
        small, their scales near 1, sinks and position biases ~ N(0, 1), projections ~ N(0, 1/in)."""
        z = self._rng(published).standard_normal(shape, dtype=np.float32)
        if published.endswith("norm.weight"):
            return np.float32(1) + np.float32(0.1) * z
        if published.endswith(("_base", ".bias")):
            return np.float32(0.1) * z
        if published.endswith("_scale"):
            return np.float32(1) + np.float32(0.1) * z
        if published.endswith(("attn_sink", ".ape")) or published == "embed.weight":
            return z
        return z * np.float32(1 / np.sqrt(shape[-1]))

    def _tid2eid(self, published: str, shape: tuple[int, ...]) -> np.ndarray:
        """k distinct experts per token: consecutive entries of a shuffled list of the experts,
        from a random start."""
        rng = self._rng(published)
        experts = rng.permutation(self.config.n_routed_experts)
        start = rng.integers(0, len(experts), size=shape[0])
        return experts[(start[:, None] + np.arange(shape[1])) % len(experts)].astype(np.int64)

    def _rng(self, name: str) -> np.random.Generator:
        words = np.frombuffer(hashlib.sha256(name.encode()).digest()[:16], dtype=np.uint32).tolist()
        return np.random.default_rng(np.random.SeedSequence([self.seed, *words]))


def decoded(stored: dict[str, tuple[str, np.ndarray]]) -> np.ndarray:
    """What a reader computes from a stored weight (and its scale): float32, tid2eid as int64."""
    (dtype, data), *scale = stored.values()
    if dtype == "I64":
        return data
    if dtype == "F8_E4M3":
        return fp8.dequantize(data, fp4.e8m0.decode(fp4.e8m0.as_bytes(scale[0][1])), fp8.BLOCK)
    if dtype == "I8":
        return fp4.dequantize_fp4(data, scale[0][1])
    return np.asarray(data, dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# The checkpoint on disk


def shard_plan(cfg: V4Config) -> list[dict[str, tuple[int, ...]]]:
    """Published names and shapes, shard by shard: embedding, each layer, the head, the MTP block."""
    outer = {published_name(n): s for n, s in global_shapes(cfg).items()}
    embed = {published_name(EMBED): outer.pop(published_name(EMBED))}
    layers = [{published_name(layer_prefix(i) + n): s for n, s in layer_shapes(cfg, i).items()}
              for i in range(cfg.num_hidden_layers)]
    return [embed, *layers, outer, *[mtp_shapes(cfg, k) for k in range(cfg.num_nextn_predict_layers)]]


def mtp_shapes(cfg: V4Config, k: int) -> dict[str, tuple[int, ...]]:
    """The k-th multi-token-prediction block: a layer (of its compress_ratios entry) under `mtp.{k}.`
    with its own embedding and hidden-state norms and projections and its own head collapse."""
    layer = cfg.num_hidden_layers + k
    d, n = cfg.hidden_size, cfg.hc_mult
    block = {published_name(layer_prefix(layer) + name).replace(f"layers.{layer}.", f"mtp.{k}.", 1): shape
             for name, shape in layer_shapes(cfg, layer).items()}
    block |= {f"mtp.{k}.{extra}": ((d, d) if "proj" in extra else (d,)) for extra in MTP_EXTRA}
    block |= {f"mtp.{k}.hc_head_fn": (n, n * d), f"mtp.{k}.hc_head_base": (n,), f"mtp.{k}.hc_head_scale": (1,)}
    return block


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
        for i, shapes in enumerate(plan, start=1):
            shard = f"model-{i:05d}-of-{len(plan):05d}.safetensors"
            entries = [Entry(name, dtype, array.shape, lambda array=array: array)
                       for published, shape in shapes.items()
                       for name, (dtype, array) in source.stored(published, shape).items()]
            write_safetensors(partial / shard, entries, {"format": "pt"})
            weight_map |= dict.fromkeys((e.name for e in entries), shard)
            total += sum(e.nbytes for e in entries)
            progress(i, len(plan))
        index = {"metadata": {"total_size": total, "stepper_synthetic_seed": seed, "stepper_model": cfg.name},
                 "weight_map": weight_map}
        files.write_new(partial / INDEX, json.dumps(index, indent=2) + "\n")
        files.write_new(partial / "config.json", json.dumps(cfg.to_hf(), indent=2) + "\n")
        files.replace_folder(partial, out)
    except OSError as e:
        raise StepperError(f"{shown(out)}: cannot be written ({e.strerror})") from None
    finally:
        files.remove_temp_folder(partial)
    return out
