"""Lesson 1 (tour): softmax, which turns attention scores into attention weights.

Write `softmax` below, then:

    stepper lesson check tour          compares it with stepper's on the run's real scores
    stepper run --use stepper-lessons/tour.py --only '*attn_weights'
                                       runs the whole model with your softmax in place of stepper's

Keep the name and the signature: the interpreter calls softmax(scores) with the default axis.
"""

import numpy as np


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """exp(x) / sum(exp(x)) along `axis`, in float32.  [..., S] -> [..., S]

    x: attention scores, float32. Masked (future) positions hold -inf and must get weight exactly 0.
    Scores can be large: np.exp(1000.0) overflows. softmax(x) == softmax(x - c) for any constant c.
    """
    raise NotImplementedError("exponentiate, then divide by the sum along `axis`")
