"""A long cache without a long prefill: N synthetic positions in one layer's cache, so a decode
step over 131072 positions can be looked at in seconds.

The synthetic latents have the statistics of real ones: the layer's own latent (compressed_kv
normalised) and rotary key of a few real inputs give a mean and a standard deviation per
dimension, and N positions are drawn from the normal distribution with those, deterministic from
the seed; the rotary keys are then turned by RoPE at their positions, as real ones are (none in
a model without rotary tables, Kimi Linear). A layer
that attends naively also gets the per-head keys and values kv_b makes of them. DeepSeek-V3.2's
indexer gets keys drawn the same way from its own (normalised) keys, turned by its RoPE, and,
scoring in FP8, their rotated FP8 codes and scales.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from stepper.config import Config
from stepper.model.attention import latent, turned, up_project
from stepper.model.cache import LayerCache
from stepper.model.index_fp8 import hadamard, quantize
from stepper.model.indexer import index_key, rotate_index
from stepper.model.layer_weights import LayerWeights
from stepper.model.ops import rms_norm
from stepper.model.options import IndexScoring
from stepper.model.rope import Rope
from stepper.seams.trace import Emitter

ROWS = 8192  # positions drawn (and up-projected) at a time


TASK = "synthetic cache positions"


def fill(cache: LayerCache, w: LayerWeights, cfg: Config, sample: np.ndarray, rope: Rope, seed: int,
         per_head: bool, index_scoring: IndexScoring = "exact", emit: Emitter | None = None) -> None:
    """Put N synthetic positions (N = the rows of rope) in an empty layer cache.
    sample [B, T, d]: the layer's input for a few real tokens (B one); rope: the tables of the N
    positions; emit: told the progress (positions drawn, then up-projected for the naive path)."""
    emit = emit or Emitter()
    x = rms_norm(sample, w("input_layernorm.weight"), cfg.rms_norm_eps)
    real_kv, real_pe = latent(x, w, cfg, Emitter())  # [B, T, kv_lora], [B, one, T, rope] (not yet turned)
    rng = np.random.default_rng([seed, 5, w.layer])
    n = rope.cos.shape[0]
    latents = np.empty((1, n, cfg.kv_lora_rank), np.float32)  # [1, S, kv_lora]
    k_pe = np.empty((1, 1, n, cfg.rope_dims(w.layer)), np.float32)  # [1, one, S, rope] (none in a NoPE layer)
    passes = 2 if per_head else 1
    for start in range(0, n, ROWS):
        emit.progress(TASK, start, passes * n)
        rows = slice(start, min(start + ROWS, n))
        latents[:, rows] = like(real_kv, rows.stop - rows.start, rng)
        k_pe[:, :, rows] = turned(like(real_pe[:, 0], rows.stop - rows.start, rng)[:, None], rope.at(rows))
    cache.extend_latent(latents, k_pe)
    if per_head:
        cache.extend_heads(*per_head_keys(latents, k_pe, w, cfg, lambda done: emit.progress(TASK, n + done, 2 * n)))
    emit.progress(TASK, passes * n, passes * n)
    if cfg.has_indexer:
        keys = cache.extend_index_keys(index_keys(x, w, cfg, rope, rng))
        if index_scoring == "fp8":
            cache.extend_index_fp8_keys(*quantize(hadamard(keys)))


def index_keys(x: np.ndarray, w: LayerWeights, cfg: Config, rope: Rope, rng: np.random.Generator) -> np.ndarray:
    """The indexer's roped keys [1, S, Di] of N positions, drawn like its keys of the sample x [B, T, d],
    turned as the layer's indexer turns them (none in a NoPE layer)."""
    real = index_key(x, w, Emitter())  # [B, T, Di], normalised, not yet turned
    n = rope.cos.shape[0]
    keys = np.empty((1, n, cfg.index_head_dim), np.float32)  # [1, S, Di]
    for start in range(0, n, ROWS):
        rows = slice(start, min(start + ROWS, n))
        drawn = like(real, rows.stop - rows.start, rng)  # [1, S, Di], S the rows' positions
        keys[:, rows] = rotate_index(drawn, rope.at(rows), cfg) if cfg.rope_dims(w.layer) else drawn
    return keys


def per_head_keys(latents: np.ndarray, k_pe: np.ndarray, w: LayerWeights, cfg: Config,
                  done: Callable[[int], None] = lambda _rows: None) -> tuple[np.ndarray, np.ndarray]:
    """The naive path's keys [1, H, S, qk_head] and values [1, H, S, v_head] of the latents, ROWS
    at a time (`done` told the rows made before each)."""
    n = latents.shape[1]
    keys = np.empty((1, cfg.num_attention_heads, n, cfg.qk_head_dim), np.float32)
    values = np.empty((1, cfg.num_attention_heads, n, cfg.v_head_dim), np.float32)
    for start in range(0, n, ROWS):
        done(start)
        rows = slice(start, min(start + ROWS, n))
        k_nope, values[:, :, rows] = up_project(latents[:, rows], w, cfg, Emitter())  # the rows' keys, values
        nope = k_nope.shape[-1]  # a NoPE layer's: the whole head
        keys[:, :, rows, :nope] = k_nope
        keys[:, :, rows, nope:] = k_pe[:, :, rows]  # the rotary key, shared by every head
    return keys, values


def like(real: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """n rows drawn with the mean and standard deviation of each dimension (the last axis) of
    real rows, axis 1 of [B, T, kv_lora] or [B, T, rope] (B one) -> the same with n rows."""
    mean, std = real.mean(axis=1, keepdims=True), real.std(axis=1, keepdims=True)
    return mean + std * rng.standard_normal((1, n, real.shape[-1]), dtype=np.float32)
