"""Lesson 8 (decode-cache): the causal mask when the new positions are the last ones of a longer sequence.

Fix `causal_mask` below, then:

    stepper lesson check decode-cache  prefill and decode steps, compared tensor by tensor
    stepper run --use stepper-lessons/decode-cache.py --decode 2 --only '*attn_weights'
                                       runs prefill and decode steps with your mask

Keep the name and the signature: the interpreter calls causal_mask(t, s) for every attention.
"""

import numpy as np


def causal_mask(t: int, s: int) -> np.ndarray:
    """[t, s] bool, True where new position i may attend to position j.

    t: the new positions of this step (the prompt's length in a prefill, 1 in a decode step)
    s: all attended positions, cached ones included (s >= t); the t new positions are the last t of them.
    """
    return np.tril(np.ones((t, s), dtype=bool))  # right when t == s (a prefill); is it right for a decode step?
