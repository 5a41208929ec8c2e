"""Lesson 11 (sparse-attention): the Lightning Indexer's scores, DeepSeek-V3.2's sparse attention.

Write `index_scores` below, then:

    stepper lesson check sparse-attention   compares it with stepper's on the run's real inputs,
                                            then every tensor of tiny-v32's runs
    stepper run --use stepper-lessons/sparse-attention.py --model tiny-v32 --show attention --only '*attn_weights'
                                            runs the model with your scores choosing where attention looks

Keep the name and the signature: the interpreter calls index_scores(q, keys, head_weights).
"""

import numpy as np


def index_scores(q: np.ndarray, keys: np.ndarray, head_weights: np.ndarray) -> np.ndarray:
    """The index score of every attended position for every query, float32.

    q [B, Hi, T, Di]: the roped index queries, Hi index heads of Di dims, for the T new positions
    keys [B, S, Di]: the roped index key of every attended position (the cache, then the T new ones)
    head_weights [B, T, Hi]: each new position's weight for each index head
    -> [B, T, S]: sum over heads h of head_weights[..., h] * relu(q_h . k) * Di^-0.5,
       -inf where the position lies after the query (the T queries are the last T of the S positions)
    """
    raise NotImplementedError("per head: q . k, relu, scale, weight; add the heads; mask the future with -inf")
