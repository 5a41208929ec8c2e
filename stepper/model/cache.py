"""What a layer remembers of earlier positions, and what that costs per position."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from stepper.config import Config
from stepper.errors import StepperError
from stepper.kernels.growing import GrowingArray
from stepper.model.options import Attention, IndexScoring

POSITION_AXIS = {  # each kept field's axis of positions
    "latent": 1, "k_pe": 2, "key_states": 2, "value_states": 2, "index_keys": 1, "index_key_codes": 1,
    "index_key_scales": 1,
}


SNAPSHOTS = 64  # the states a KdaCache keeps of its last calls' starts (a chunked prefill's replay asks for them)


@dataclass
class KdaCache:
    """What a KDA layer carries from one call to the next: a fixed size, whatever the length.

    Each call replaces the arrays (never writes into them), so the cache as it was when a call
    began is kept by reference (`first`): a chunked prefill replays its chunks from there."""

    conv: dict[str, np.ndarray] = field(default_factory=dict)  # "q", "k", "v" -> the last W - 1 inputs, B x (W-1) x HK
    state: np.ndarray | None = None  # [B, Hk, K, Kv]
    length: int = 0  # positions seen
    earlier: dict[int, KdaCache] = field(default_factory=dict, repr=False, compare=False)  # length -> as it was

    def nbytes(self) -> int:
        """Bytes held: the same after 10 positions as after a million."""
        held = [*self.conv.values()] + ([] if self.state is None else [self.state])
        return sum(a.nbytes for a in held)

    def remember(self) -> None:
        """Keep the cache as it is now, before a call changes it (the last SNAPSHOTS calls' starts)."""
        self.earlier[self.length] = KdaCache(dict(self.conv), self.state, self.length)
        while len(self.earlier) > SNAPSHOTS:
            del self.earlier[min(self.earlier)]

    def first(self, n: int) -> KdaCache:
        """The cache as it was after its first n positions: now, or when a call began there (with
        the snapshots, so that it too can go back)."""
        if n == self.length:
            return KdaCache(dict(self.conv), self.state, n, dict(self.earlier))
        if n not in self.earlier:
            raise StepperError(f"the KDA state after {n} positions was not kept (the last {SNAPSHOTS} calls' are): "
                               f"a chunked prefill of more chunks than that needs a larger --chunk")
        return KdaCache(dict(self.earlier[n].conv), self.earlier[n].state, n, dict(self.earlier))


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
    second: LayerCache | None = None  # LongCat-Flash's second attention sublayer's own cache
    # the layer before's cache, set by model.transformer: GLM-5's shared layer attends where it chose
    previous: LayerCache | None = field(default=None, repr=False, compare=False)
    index_choice: np.ndarray | None = None  # [B, T, Ki]: the positions this step's queries attend (GLM-5 reuses it)
    growing: dict[str, GrowingArray] = field(default_factory=dict, repr=False, compare=False)
    # name -> the spare room after the field's positions (kernels.growing), so appends rarely copy
    recurrent: KdaCache | None = None  # a Kimi Linear KDA layer's fixed-size memory instead (model.kda)
    # the cache of the layer whose latent this one reads, set by model.transformer (Mistral Large 4's kv_source_layers)
    kv_source: LayerCache | None = field(default=None, repr=False, compare=False)

    @property
    def length(self) -> int:
        if self.recurrent is not None:
            return self.recurrent.length
        return 0 if self.latent is None else self.latent.shape[1]

    def first(self, n: int) -> LayerCache:
        """The cache as it was when it held its first n positions (views of these arrays)."""
        if n == 0:
            return LayerCache()
        cut = {}
        for name, axis in POSITION_AXIS.items():
            array = getattr(self, name)
            cut[name] = None if array is None else array[(slice(None),) * axis + (slice(0, n),)]
        return LayerCache(**cut, second=None if self.second is None else self.second.first(n),
                          recurrent=None if self.recurrent is None else self.recurrent.first(n))

    def extend_latent(self, latent: np.ndarray, k_pe: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Append the T new positions' latents [B, T, kv_lora] and rotary keys [B, one, T, rope];
        return all S positions' [B, S, kv_lora], [B, one, S, rope]. A layer reading another's latent
        (kv_source) keeps that layer's arrays, which it has extended this step, and adds nothing."""
        if self.kv_source is not None:
            self.latent, self.k_pe = self.kv_source.latent, self.kv_source.k_pe
            return self.latent, self.k_pe
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
    FP8, also its e4m3 codes and float32 scale). LongCat-Flash's layer caches for its two attention
    sublayers."""
    index_key = 0
    if cfg.has_indexer:
        index_key = cfg.index_head_dim * itemsize + (cfg.index_head_dim + 4 if index_scoring == "fp8" else 0)
    attentions = 2 if getattr(cfg, "shortcut_moe", False) else 1
    if attn == "naive":
        return attentions * cfg.num_attention_heads * (cfg.qk_head_dim + cfg.v_head_dim) * itemsize + index_key
    return attentions * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * itemsize + index_key
