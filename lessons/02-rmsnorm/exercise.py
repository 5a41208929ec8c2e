"""Lesson 2 (rmsnorm): RMSNorm, four times in every layer and once at the end.

Write `rms_norm` below, then:

    stepper lesson check rmsnorm       compares it with stepper's on the run's real inputs
    stepper run --use stepper-lessons/rmsnorm.py
                                       runs the whole model with your rms_norm in every norm

Keep the name and the signature: the interpreter calls rms_norm(x, weight, eps).
"""

import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x * rsqrt(mean(x^2) + eps) * weight over the last axis, in float32.  [..., D] -> [..., D]

    x: float32 [..., D] (a token's vector is the last axis); weight: float32 [D]; eps: a Python float (1e-6).
    """
    raise NotImplementedError("divide each vector by its root mean square, then multiply by weight")
