"""The gated delta rule a chunk of tokens at a time: the form long prompts use.

Replaces: stepper.model.kda.gated_delta_rule (the token-by-token loop, the reference).
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

The decays exp(G_i - G_j) are never exp(G_i) / exp(G_j), which overflow once a channel forgets
fast: within a sub-chunk of 8 tokens they are made pair by pair from differences, and across
sub-chunks as exp(G_i - G_r) exp(G_r - G_j) through the sub-chunk's first position r, two factors
<= 1 whose product is a matrix product (pair_products).
"""

from __future__ import annotations

import numpy as np

CHUNK = 64  # tokens per chunk, as the reference's chunked form
SUB = 8  # query rows whose decays to the keys before them are made through one reference position


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
    k_beta = k * beta[..., None]  # [B, H, L, K]
    A, scores = pair_products([k_beta, q], k, G)  # [B, H, L, L] each: x_i . exp(G_i - G_j) k_j for j <= i
    unit = np.tril(A, -1) + np.eye(L, dtype=np.float32)  # [B, H, L, L]: I + A, A strictly below the diagonal
    U = np.linalg.solve(unit, v * beta[..., None])  # [B, H, L, V]
    W = np.linalg.solve(unit, k_beta * np.exp(G))  # [B, H, L, K]
    delta = U - W @ state  # [B, H, L, V]
    out = (q * np.exp(G)) @ state + scores @ delta  # [B, H, L, V]
    last = G[:, :, -1]  # [B, H, K]
    to_end = k * np.exp(last[:, :, None, :] - G)  # [B, H, L, K]: exp(G_L - G_j) k_j
    state = np.exp(last)[..., None] * state + to_end.swapaxes(-1, -2) @ delta  # [B, H, K, V]
    return out, delta, state


def pair_products(xs: list[np.ndarray], k: np.ndarray, G: np.ndarray, sub: int = SUB) -> list[np.ndarray]:
    """For each x in xs, P[i, j] = x_i . (exp(G_i - G_j) k_j) for j <= i, 0 for j > i.
    xs, k, G [B, H, L, K] -> [B, H, L, L] each.

    G never increases (g <= 0), so exp(G_i - G_j) = exp(G_i - G_r) exp(G_r - G_j) for any
    j <= r <= i with both factors <= 1: a query sub-chunk of `sub` rows starting at r meets every
    earlier key through r in one product; within the sub-chunk the decays are made pair by pair."""
    B, H, L, _ = k.shape
    out = [np.zeros((B, H, L, L), np.float32) for _ in xs]
    for r in range(0, L, sub):
        rows = slice(r, min(L, r + sub))
        decayed = pair_decays(G[:, :, rows])  # [B, H, s, s, K]
        decayed *= k[:, :, None, rows, :]  # [i, j] = exp(G_i - G_j) k_j within the sub-chunk
        to_r = np.exp(G[:, :, rows] - G[:, :, r : r + 1])  # [B, H, s, K]: exp(G_i - G_r) <= 1
        from_r = k[:, :, :r] * np.exp(G[:, :, r : r + 1] - G[:, :, :r])  # [B, H, r, K]: exp(G_r - G_j) k_j, j < r
        for x, P in zip(xs, out):
            P[:, :, rows, rows] = (decayed @ x[:, :, rows, :, None])[..., 0]  # [B, H, s, s]
            P[:, :, rows, :r] = (x[:, :, rows] * to_r) @ from_r.swapaxes(-1, -2)  # [B, H, s, r]
    return out


def pair_decays(G: np.ndarray) -> np.ndarray:
    """exp(G_i - G_j) for j <= i, 0 for j > i.  [B, H, s, K] -> [B, H, s, s, K]"""
    s = G.shape[2]
    later = np.tril(np.ones((s, s), bool))[:, :, None]  # [s, s, 1]: j <= i
    decays = G[:, :, :, None, :] - G[:, :, None, :, :]  # [B, H, s, s, K]: G_i - G_j
    np.copyto(decays, np.float32(-np.inf), where=~later)
    return np.exp(decays, out=decays)
