"""Lesson 12 (delta-state): the gated delta rule."""

import numpy as np


def gated_delta_rule(q, k, v, g, beta, state, keep_states=False):
    """The gated delta rule token by token.  -> o, delta [B, H, T, V], last state [B, H, K, V], every state or None"""
    out, delta = np.empty_like(v), np.empty_like(v)
    states = []
    for t in range(q.shape[2]):
        state = np.exp(g[:, :, t])[..., None] * state  # [B, H, K, V]: key channel i's row times exp(g_t[i])
        recalled = (k[:, :, t, None, :] @ state)[:, :, 0]  # [B, H, V]: what the state holds at k_t
        delta[:, :, t] = beta[:, :, t, None] * (v[:, :, t] - recalled)  # [B, H, V]
        state = state + k[:, :, t, :, None] * delta[:, :, t, None, :]  # [B, H, K, V]: write delta_t along k_t
        out[:, :, t] = (q[:, :, t, None, :] @ state)[:, :, 0]  # [B, H, V]: read with the query
        if keep_states:
            states.append(state)
    return out, delta, state, np.stack(states, axis=2) if keep_states else None
