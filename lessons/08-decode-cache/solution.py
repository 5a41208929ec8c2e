"""Lesson 8 (decode-cache): the causal mask when the new positions are the last ones of a longer sequence."""

import numpy as np


def causal_mask(t: int, s: int) -> np.ndarray:
    """[t, s] bool, True where new position i may attend to position j."""
    past = s - t  # cached positions before the first new one
    return np.arange(s)[None, :] <= past + np.arange(t)[:, None]
