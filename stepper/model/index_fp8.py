"""The Lightning Indexer's FP8 scoring, as DeepSeek-V3.2's own inference code does it.

Before scoring, DeepSeek rotates each roped index query and key by a Hadamard transform and
stores them as FP8 e4m3 with one power-of-two scale per block of 128 values (act_quant with
scale_fmt "ue8m0"); its key cache keeps the FP8 codes and their scales. The Hadamard matrix
scaled by n^-0.5 is orthonormal, so the rotation leaves every dot product q . k as it was: it
only spreads each vector's outliers over all its dims, so one scale per block fits them better.
What changes the scores is the rounding to e4m3 (3 mantissa bits).

The scoring kernel (fp8_index) multiplies the codes, q_fp8 . k_fp8, applies the ReLU, weighs
each head by head_weights * q_scale * index_head_dim^-0.5, sums the heads, and multiplies by the
key's scale last. With positive scales that equals the exact formula on the dequantized q and k.
One scale per head and per key: index_head_dim is at most 128 here (128 in DeepSeek-V3.2; a
smaller head, as in tiny configs, is one block of its own size).

stepper rotates in float32 where DeepSeek rotates bfloat16 activations, and keeps the float32
keys too, to say how many of the exactly scored top-k positions the FP8 scores keep.

Shapes: B batch, Hi index heads, T new positions, S attended positions, Di index head dims,
Ki kept positions.
"""

from __future__ import annotations

import numpy as np

from stepper.fp8.e4m3 import FP8_MAX, decode, encode
from stepper.model.cache import LayerCache
from stepper.model.ops import causal_mask
from stepper.seams.trace import Emitter

FP8_BLOCK = 128  # values sharing one scale (act_quant's block_size)
AMAX_FLOOR = np.float32(1e-4)  # act_quant's least amax, so an all-zero block still gets a scale


def fp8_index_scores(q: np.ndarray, k: np.ndarray, head_weights: np.ndarray, cache: LayerCache,
                     emit: Emitter) -> np.ndarray:
    """The index scores from FP8 q and k, the keys' codes and scales cached.
    q [B, Hi, T, Di], k [B, T, Di] (both roped), head_weights [B, T, Hi] -> [B, T, S]"""
    q = emit("self_attn.indexer.q_rotated", hadamard(q))  # [B, Hi, T, Di]
    k = emit("self_attn.indexer.k_rotated", hadamard(k))  # [B, T, Di]
    q_codes, q_scale = quantize(q)  # [B, Hi, T, Di] e4m3, [B, Hi, T]
    k_codes, k_scale = quantize(k)  # [B, T, Di] e4m3, [B, T]
    q_fp8 = emit("self_attn.indexer.q_fp8", decode(q_codes))  # the e4m3 values, exactly, in float32
    q_scale = emit("self_attn.indexer.q_scale", q_scale)
    k_fp8 = emit("self_attn.indexer.k_fp8", decode(k_codes))
    k_scale = emit("self_attn.indexer.k_scale", k_scale)
    key_codes, key_scales = cache.extend_index_fp8_keys(encode(k_fp8), k_scale)  # [B, S, Di] e4m3, [B, S]
    keys_fp8 = emit("self_attn.indexer.keys_fp8", decode(key_codes))  # [B, S, Di]
    key_scales = emit("self_attn.indexer.key_scales", key_scales)
    weights = head_weights * q_scale.transpose(0, 2, 1) * np.float32(q.shape[-1] ** -0.5)  # [B, T, Hi]
    weights = emit("self_attn.indexer.fp8_head_weights", weights)
    return fp8_scores(q_fp8, keys_fp8, weights, key_scales)


def hadamard(x: np.ndarray) -> np.ndarray:
    """x times the Walsh-Hadamard matrix of Sylvester's order, scaled by n^-0.5, on the last axis
    of n entries (a power of two): H_1 = (1), and H_2m has H_m in three quarters and -H_m in the
    bottom right one.  [..., Di] -> same, float32

    Butterflies: at width h, each pair of entries h apart, (a, b), becomes (a + b, a - b)."""
    n = x.shape[-1]
    if n & (n - 1) or n == 0:
        raise ValueError(f"a Hadamard transform needs a power-of-two length, got {n}")
    lead = x.shape[:-1]
    y = np.asarray(x, dtype=np.float32)
    h = 1
    while h < n:
        pairs = y.reshape(*lead, n // (2 * h), 2, h)  # blocks of 2h entries: their halves a and b
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        y = np.stack([a + b, a - b], axis=-2).reshape(*lead, n)
        h *= 2
    return y * np.float32(n**-0.5)


def quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FP8 e4m3 codes with one ue8m0 (power-of-two) scale per vector of the last axis (at most
    FP8_BLOCK values): scale = 2^ceil(log2(max(amax, 1e-4) / 448)), codes = e4m3(x / scale),
    rounded to nearest even.  [..., Di] -> codes [..., Di] e4m3, scales [...] float32"""
    if x.shape[-1] > FP8_BLOCK:
        raise ValueError(f"one scale covers at most {FP8_BLOCK} values, got vectors of {x.shape[-1]}")
    amax = np.maximum(np.max(np.abs(x), axis=-1), AMAX_FLOOR)  # [...]
    scale = power_of_two_above(amax / np.float32(FP8_MAX))
    return encode(x / scale[..., None]), scale


def power_of_two_above(x: np.ndarray) -> np.ndarray:
    """2^ceil(log2(x)) for positive float32 x, exactly: x = m * 2^e with m in [0.5, 1), so the
    power is 2^(e-1) when m is 0.5 (x a power of two itself) and 2^e otherwise."""
    mantissa, exponent = np.frexp(x)
    return np.ldexp(np.float32(1), np.where(mantissa == 0.5, exponent - 1, exponent)).astype(np.float32)


def fp8_scores(q_fp8: np.ndarray, keys_fp8: np.ndarray, weights: np.ndarray, key_scales: np.ndarray) -> np.ndarray:
    """key_scale[s] * sum_h weights[h] * relu(q_fp8_h . k_fp8[s]), -inf in the future: fp8_index.
    q_fp8 [B, Hi, T, Di], keys_fp8 [B, S, Di] (e4m3 values), weights [B, T, Hi], key_scales [B, S] -> [B, T, S]"""
    B, H, T, _ = q_fp8.shape
    scores = np.zeros((B, T, keys_fp8.shape[1]), dtype=np.float32)  # [B, T, S]
    for h in range(H):
        per_head = np.matmul(q_fp8[:, h], keys_fp8.swapaxes(-1, -2))  # [B, T, S]
        np.maximum(per_head, 0, out=per_head)  # relu
        scores += weights[:, :, h, None] * per_head
    scores *= key_scales[:, None, :]
    np.copyto(scores, np.float32(-np.inf), where=~causal_mask(T, keys_fp8.shape[1]))
    return scores
