"""Lesson 12 (delta-state): Kimi Delta Attention's state, token by token.

Write `gated_delta_rule` below, then:

    stepper lesson check delta-state   compares it with stepper's on the run's real inputs
    stepper run --model tiny-kimi-linear --use stepper-lessons/delta-state.py
                                       runs every KDA layer through your rule (token by token)

Keep the name and the signature: the interpreter calls gated_delta_rule(q, k, v, g, beta, state, keep_states).
"""

import numpy as np


def gated_delta_rule(q, k, v, g, beta, state, keep_states=False):
    """The gated delta rule, one token after the other, for every batch row and head at once.

    q, k: float32 [B, H, T, K] (k unit length per head; q unit length times K^-0.5)
    v: float32 [B, H, T, V]; g: float32 [B, H, T, K] (the decay's log, <= 0); beta: float32 [B, H, T]
    state: float32 [B, H, K, V], the state before the first of the T tokens

    For each token t:  S = diag(exp(g_t)) S;  delta_t = beta_t (v_t - S^T k_t);  S = S + k_t delta_t^T;  o_t = S^T q_t

    Returns (o [B, H, T, V], delta [B, H, T, V], the last state [B, H, K, V],
             the state after every token [B, H, T, K, V] if keep_states else None).
    """
    raise NotImplementedError("decay the state's rows, write beta (v - S^T k) along k, read S^T q: token by token")
