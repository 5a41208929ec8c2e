"""Lesson 15 (hyper-connections): DeepSeek-V4's stream-mixing matrix, made doubly stochastic.

Write `sinkhorn` below, then:

    stepper lesson check hyper-connections   compares it with stepper's on the run's real inputs,
                                             then every tensor of tiny-v4's runs
    stepper run --use stepper-lessons/hyper-connections.py --model tiny-v4 --show hc --only '*hc_attn.comb'
                                             runs the model with your normalisation mixing the streams

Keep the name and the signature: the interpreter calls sinkhorn(comb, iters, hc_eps).
"""

import numpy as np


def sinkhorn(comb: np.ndarray, iters: int, hc_eps: float) -> np.ndarray:
    """Sinkhorn's alternating normalisation of every n x n mixing matrix, float32.

    comb [..., n, n]: positive entries (a softmax over each row, plus hc_eps), one matrix per token
    iters: hc_sinkhorn_iters (20 in V4)
    hc_eps: added to every sum before dividing by it

    First divide every column by its sum (+ hc_eps); then, iters - 1 times, divide every row by its
    sum (+ hc_eps) and then every column by its sum (+ hc_eps). -> [..., n, n]
    """
    raise NotImplementedError("columns once, then iters - 1 rounds of rows then columns, each sum + hc_eps")
