"""The gated delta rule a chunk of tokens at a time: the form long prompts use.

Replaces: stepper.model.kda.recurrent (the token-by-token loop, the reference).
Tested equal by: tests/unit/test_kda.py (1,000 tokens, a nonzero initial state, within 1e-6).

Within a chunk of L tokens, with G_i = g_1 + ... + g_i (the decay's log, summed per key channel
from the chunk's start) and S_0 the state before the chunk, the recurrence's delta terms solve

    delta_i + sum_{j<i} beta_i (k_i . exp(G_i - G_j) k_j) delta_j = beta_i v_i - beta_i (exp(G_i) k_i)^T S_0

a unit lower-triangular system (I + A) Delta = V_beta - K_decayed S_0. Its inverse T = (I + A)^-1
(the "UT transform") gives Delta = U - W S_0 with U = T V_beta and W = T K_decayed (the WY form:
the chunk's whole effect on the state as products). Then, reading and writing the state once per
chunk instead of once per token:

    o_i   = (exp(G_i) q_i)^T S_0 + sum_{j<=i} (q_i . exp(G_i - G_j) k_j) delta_j
    S_L   = diag(exp(G_L)) S_0 + sum_j (exp(G_L - G_j) k_j) delta_j^T

The decays exp(G_i - G_j) are made from differences (never exp(G_i) / exp(G_j), which overflow
once a channel forgets fast), as an [L, L, K] array per head.
"""

from __future__ import annotations

import numpy as np

CHUNK = 64  # tokens per chunk, as the reference's chunked form


def chunked(q, k, v, g, beta, state, chunk: int = CHUNK, keep_states: bool = False):
    """q (scaled), k [B, H, T, K], v [B, H, T, V], g [B, H, T, K], beta [B, H, T], state [B, H, K, V]
    -> o [B, H, T, V], delta [B, H, T, V], the last state [B, H, K, V], the state after each chunk
    [B, H, ceil(T/chunk), K, V] (or None without keep_states)"""
    T = q.shape[2]
    out, delta = np.empty_like(v), np.empty_like(v)
    states = []
    for start in range(0, T, chunk):
        span = slice(start, min(T, start + chunk))
        out[:, :, span], delta[:, :, span], state = one_chunk(
            q[:, :, span], k[:, :, span], v[:, :, span], g[:, :, span], beta[:, :, span], state)
        if keep_states:
            states.append(state)
    return out, delta, state, np.stack(states, axis=2) if keep_states else None


def one_chunk(q, k, v, g, beta, state):
    """One chunk of L tokens: q, k [B, H, L, K], v [B, H, L, V], g [B, H, L, K], beta [B, H, L],
    state [B, H, K, V] -> o [B, H, L, V], delta [B, H, L, V], the state after the chunk [B, H, K, V]"""
    L = q.shape[2]
    G = np.cumsum(g, axis=2)  # [B, H, L, K]
    decayed_keys = pair_decays(G) * k[:, :, None, :, :]  # [B, H, L, L, K]: [i, j] = exp(G_i - G_j) k_j, j <= i
    k_beta = k * beta[..., None]  # [B, H, L, K]
    A = np.tril((decayed_keys @ k_beta[..., None])[..., 0], -1)  # [B, H, L, L]: beta_i k_i . exp(G_i - G_j) k_j, j < i
    unit = A + np.eye(L, dtype=np.float32)  # [B, H, L, L]: I + A
    U = np.linalg.solve(unit, v * beta[..., None])  # [B, H, L, V]
    W = np.linalg.solve(unit, k_beta * np.exp(G))  # [B, H, L, K]
    delta = U - W @ state  # [B, H, L, V]
    scores = (decayed_keys @ q[..., None])[..., 0]  # [B, H, L, L]: q_i . exp(G_i - G_j) k_j, zero for j > i
    out = (q * np.exp(G)) @ state + scores @ delta  # [B, H, L, V]
    last = G[:, :, -1]  # [B, H, K]
    to_end = k * np.exp(last[:, :, None, :] - G)  # [B, H, L, K]: exp(G_L - G_j) k_j
    state = np.exp(last)[..., None] * state + to_end.swapaxes(-1, -2) @ delta  # [B, H, K, V]
    return out, delta, state


def pair_decays(G: np.ndarray) -> np.ndarray:
    """exp(G_i - G_j) for j <= i, 0 for j > i.  [B, H, L, K] -> [B, H, L, L, K]"""
    L = G.shape[2]
    later = np.tril(np.ones((L, L), bool))[:, :, None]  # [L, L, 1]: j <= i
    differences = G[:, :, :, None, :] - G[:, :, None, :, :]  # [B, H, L, L, K]
    return np.exp(np.where(later, differences, np.float32(-np.inf)))
