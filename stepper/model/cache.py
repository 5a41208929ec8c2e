"""What a layer remembers of earlier positions, and what that costs per position."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from stepper.config import Config
from stepper.kernels.growing import GrowingArray
from stepper.model.options import Attention, IndexScoring

POSITION_AXIS = {  # each kept field's axis of positions
    "latent": 1, "k_pe": 2, "key_states": 2, "value_states": 2, "index_keys": 1, "index_key_codes": 1,
    "index_key_scales": 1,
}


@dataclass
class LayerCache:
    """What one layer remembers of earlier positions.

    The latent (compressed_kv_norm) and the roped shared key are kept by both attention paths;
    the naive path also keeps the per-head keys and values it attended over. DeepSeek-V3.2's
    indexer keeps its own roped keys; scoring in FP8, also their FP8 codes and scales.
    """

    latent: np.ndarray | None = None  # [B, S, kv_lora]
    k_pe: np.ndarray | None = None  # [B, one, S, rope], after RoPE
    key_states: np.ndarray | None = None  # [B, H, S, qk_head], naive path
    value_states: np.ndarray | None = None  # [B, H, S, v_head], naive path
    index_keys: np.ndarray | None = None  # [B, S, Di], the Lightning Indexer's (V3.2)
    index_key_codes: np.ndarray | None = None  # [B, S, Di] e4m3, Hadamard-rotated (FP8 index scoring)
    index_key_scales: np.ndarray | None = None  # [B, S], one power-of-two scale per key
    growing: dict[str, GrowingArray] = field(default_factory=dict, repr=False, compare=False)
    # name -> the spare room after the field's positions (kernels.growing), so appends rarely copy

    @property
    def length(self) -> int:
        return 0 if self.latent is None else self.latent.shape[1]

    def first(self, n: int) -> LayerCache:
        """The cache as it was when it held its first n positions (views of these arrays)."""
        if n == 0:
            return LayerCache()
        cut = {}
        for name, axis in POSITION_AXIS.items():
            array = getattr(self, name)
            cut[name] = None if array is None else array[(slice(None),) * axis + (slice(0, n),)]
        return LayerCache(**cut)

    def extend_latent(self, latent: np.ndarray, k_pe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Append the T new positions' latents [B, T, kv_lora] and rotary keys [B, one, T, rope];
        return all S positions' [B, S, kv_lora], [B, one, S, rope]."""
        return self.appended("latent", latent), self.appended("k_pe", k_pe)

    def extend_heads(self, keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Append per-head keys [B, H, T, qk_head] and values [B, H, T, v_head]; return all S positions'."""
        return self.appended("key_states", keys), self.appended("value_states", values)

    def extend_index_keys(self, keys: np.ndarray) -> np.ndarray:
        """Append the indexer's keys of the T new positions [B, T, Di]; return all S positions' [B, S, Di]."""
        return self.appended("index_keys", keys)

    def extend_index_fp8_keys(self, codes: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Append the T new positions' FP8 index keys [B, T, Di] and scales [B, T]; return all S positions'."""
        return self.appended("index_key_codes", codes), self.appended("index_key_scales", scales)

    def appended(self, name: str, new: np.ndarray) -> np.ndarray:
        """The field `name` with the new positions appended along its axis of positions:
        np.concatenate, into spare room (kernels.growing) that leaves the positions before, and
        views of them, as they are.  -> all S positions"""
        grown = self.growing.setdefault(name, GrowingArray(POSITION_AXIS[name])).concatenate(getattr(self, name), new)
        setattr(self, name, grown)
        return grown


class KVCache:
    """One LayerCache per layer."""

    def __init__(self, num_layers: int):
        self.layers = [LayerCache() for _ in range(num_layers)]

    def length(self, layer: int = 0) -> int:
        return self.layers[layer].length


def cache_bytes_per_token(cfg: Config, attn: Attention, itemsize: int = 4,
                          index_scoring: IndexScoring = "exact") -> int:
    """Bytes one layer caches per position: per-head keys and values (attn "naive"), or one
    latent and rotary key ("absorb"); plus the indexer's key, if the model has one (scoring in
    FP8, also its e4m3 codes and float32 scale)."""
    index_key = 0
    if cfg.has_indexer:
        index_key = cfg.index_head_dim * itemsize + (cfg.index_head_dim + 4 if index_scoring == "fp8" else 0)
    if attn == "naive":
        return cfg.num_attention_heads * (cfg.qk_head_dim + cfg.v_head_dim) * itemsize + index_key
    return (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * itemsize + index_key
