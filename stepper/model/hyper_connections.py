"""Manifold-constrained hyper-connections (mHC), DeepSeek-V4's residual.

The residual is `hc_mult` (n, 4 in V4) streams X [B, T, n, d] instead of one. Before each block
(attention, then the MoE) `hc_pre` reads all streams and makes, per position, three sets of
mixing weights from one projection of the flattened, RMS-scaled streams:

    mixes = flatten(X) @ fn^T / sqrt(mean(flatten(X)^2) + eps)          [B, T, (2 + n) n]
    pre   = sigmoid(mixes[:n] * scale0 + base[:n]) + hc_eps                 [B, T, n]
    post  = 2 sigmoid(mixes[n:2n] * scale1 + base[n:2n])                   [B, T, n]
    comb  = softmax_k(mixes[2n:] * scale2 + base[2n:] as [n, n]) + hc_eps   [B, T, n, n]

comb is then pushed towards a doubly-stochastic matrix by Sinkhorn's alternating normalisation
(columns once, then `hc_sinkhorn_iters` - 1 rounds of rows then columns, each sum + hc_eps). The
block runs on x = sum_j pre_j X_j, and `hc_post` writes its output y back into every stream:

    X'_k = post_k y + sum_j comb[j, k] X_j          (comb read transposed: row j says where X_j goes)

The model's head collapses the streams once more with its own pre weights (`hc_head`).

Hy4 (`hy_v4`) keeps the streams apart ("independent" hyper-connections): its projection makes only
pre and post ([B, T, 2n]), post is `hc_magnitude` sigmoid(...) + hc_eps, and there is no comb:
X'_k = post_k y + X_k (HcDims.comb False).
Tensors are emitted under DeepSeek's names of the two sites, `hc_attn.*` and `hc_ffn.*` (Hy4's under
its modules' names, `attn_hc.*` and `ffn_hc.*`: their formulas are not V4's). Weights (transformers'
names, relative to the layer; V4's published `hc_attn_fn`, ...): `attn_hc.fn` and `ffn_hc.fn`
[(2 + n) n, n d], `.base` [(2 + n) n], `.scale` [3] (Hy4: [2n, n d], [2n], [2]); the head's
`hc_head.hc_fn` [n, n d], `hc_head.hc_base` [n], `hc_head.hc_scale` [1].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepper.model.layer_weights import LayerWeights
from stepper.model.ops import sigmoid, softmax
from stepper.seams.swap import exercise
from stepper.seams.trace import Emitter


@dataclass(frozen=True)
class HcDims:
    """What the hyper-connections need of the config."""

    hc_mult: int  # n streams
    sinkhorn_iters: int  # hc_sinkhorn_iters
    hc_eps: float  # added to pre, to comb and to each Sinkhorn sum (Hy4: to post too)
    norm_eps: float  # rms_norm_eps, inside the RMS of the flattened streams
    comb: bool = True  # the streams mixed by a Sinkhorn'd comb (V4); False: each kept as it is (Hy4)
    magnitude: float = 2.0  # post's sigmoid times this (Hy4: hc_magnitude)
    post_eps: float = 0.0  # added to post (Hy4: hc_eps)


@dataclass(frozen=True)
class Mixing:
    """What hc_pre hands the block and hc_post: the block's input and the weights to write back."""

    x: np.ndarray  # [B, T, d] the block's input, sum_j pre_j X_j
    post: np.ndarray  # [B, T, n]
    comb: np.ndarray | None  # [B, T, n, n] after Sinkhorn; None: no mixing of the streams (Hy4)


# a site's emitted names -> its weights' module (transformers'): DeepSeek's names of the sites (V4), or
# the modules' own (Hy4, whose hyper-connections are not V4's: catalog/parts/hy_v4.json)
WEIGHTS = {"hc_attn": "attn_hc", "hc_ffn": "ffn_hc", "attn_hc": "attn_hc", "ffn_hc": "ffn_hc"}


def hc_pre(streams: np.ndarray, w: LayerWeights, site: str, cfg: HcDims, emit: Emitter) -> Mixing:
    """streams [B, T, n, d] -> the block's input and the weights to write its output back with;
    site "hc_attn" (before the attention) or "hc_ffn" (before the MoE), as DeepSeek names them
    (Hy4: "attn_hc", "ffn_hc")."""
    n, hc_eps, module = cfg.hc_mult, cfg.hc_eps, WEIGHTS[site]
    base, scale = w(f"{module}.base"), w(f"{module}.scale")  # [(2 + n) n] or [2n], [3] or [2]
    mixes = emit(f"{site}.mixes", rms_scaled_mixes(streams, w(f"{module}.fn"), cfg.norm_eps))  # [B, T, M]
    pre = emit(f"{site}.pre", sigmoid(mixes[..., :n] * scale[0] + base[:n]) + np.float32(hc_eps))  # [B, T, n]
    post = np.float32(cfg.magnitude) * sigmoid(mixes[..., n:2 * n] * scale[1] + base[n:2 * n])
    post = emit(f"{site}.post", post + np.float32(cfg.post_eps))  # [B, T, n]
    comb = None
    if cfg.comb:
        comb_logits = mixes[..., 2 * n:].reshape(*mixes.shape[:-1], n, n) * scale[2] + base[2 * n:].reshape(n, n)
        comb = emit(f"{site}.comb_softmax", softmax(comb_logits, axis=-1) + np.float32(hc_eps))  # [B, T, n, n]
        comb = emit(f"{site}.comb", sinkhorn(comb, cfg.sinkhorn_iters, hc_eps))  # [B, T, n, n]
    x = emit(f"{site}.collapsed", collapse(streams, pre))  # [B, T, d]
    return Mixing(x, post, comb)


def rms_scaled_mixes(streams: np.ndarray, fn: np.ndarray, eps: float) -> np.ndarray:
    """flatten(X) @ fn^T / rms(flatten(X)).  [B, T, n, d] -> [B, T, M] (the head: [B, T, n])"""
    flat = streams.reshape(*streams.shape[:2], -1).astype(np.float32, copy=False)  # [B, T, n d]
    inv_rms = np.float32(1) / np.sqrt(np.mean(np.square(flat), axis=-1, keepdims=True) + np.float32(eps))  # [B, T, 1]
    return (flat * inv_rms) @ fn.T  # [B, T, M]


@exercise
def sinkhorn(comb: np.ndarray, iters: int, hc_eps: float) -> np.ndarray:
    """Columns normalised, then iters - 1 rounds of rows then columns (each sum + hc_eps).
    [..., n, n] -> [..., n, n], rows and columns summing to about 1."""
    eps = np.float32(hc_eps)
    comb = comb / (comb.sum(axis=-2, keepdims=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(axis=-1, keepdims=True) + eps)
        comb = comb / (comb.sum(axis=-2, keepdims=True) + eps)
    return comb


def collapse(streams: np.ndarray, pre: np.ndarray) -> np.ndarray:
    """sum_j pre_j X_j.  [B, T, n, d], [B, T, n] -> [B, T, d]"""
    return np.einsum("btj,btjd->btd", pre, streams)


def hc_post(y: np.ndarray, streams: np.ndarray, mixing: Mixing) -> np.ndarray:
    """X'_k = post_k y + sum_j comb[j, k] X_j (Hy4, no comb: + X_k).
    y [B, T, d], streams [B, T, n, d] -> [B, T, n, d]"""
    written = mixing.post[..., None] * y[:, :, None, :]  # [B, T, n, d]
    if mixing.comb is None:
        written += streams  # [B, T, n, d]: each stream as it was
    else:
        written += np.einsum("btjk,btjd->btkd", mixing.comb, streams)  # [B, T, n, d]: the streams mixed
    return written


def hc_head(streams: np.ndarray, fn: np.ndarray, base: np.ndarray, scale: np.ndarray, cfg: HcDims,
            emit: Emitter) -> np.ndarray:
    """The head's collapse: pre = sigmoid(mixes * scale + base) + hc_eps, sum_j pre_j X_j.
    streams [B, T, n, d], fn [n, n d], base [n], scale [1] -> [B, T, d]"""
    mixes = emit("hc_head.mixes", rms_scaled_mixes(streams, fn, cfg.norm_eps))  # [B, T, n]
    pre = emit("hc_head.pre", sigmoid(mixes * scale[0] + base) + np.float32(cfg.hc_eps))  # [B, T, n]
    return emit("hc_head.collapsed", collapse(streams, pre))  # [B, T, d]


def expand(embedding: np.ndarray, n: int) -> np.ndarray:
    """The embedding copied into each of the n streams.  [B, T, d] -> [B, T, n, d]"""
    return np.repeat(embedding[:, :, None, :], n, axis=2)
