"""Lesson 5 (rope-yarn): YaRN's rotary frequencies, and rotating the interleaved pairs.

Write `rope_inv_freq` and `apply_rope` below, then:

    stepper lesson check rope-yarn     the run's real inputs, every preset's YaRN settings, positions past 4096
    stepper run --use stepper-lessons/rope-yarn.py --start-pos 5000 --only '*q_pe_rope'
                                       runs the whole model with your rotary embedding

Keep the names and the signatures: the interpreter calls rope_inv_freq(dim, theta, yarn) once per model and
apply_rope(x, cos, sin) for the query's and the shared key's rotary dims.
"""

import numpy as np

from stepper.config import Yarn

F32 = np.float32


def rope_inv_freq(dim: int, theta: float, yarn: Yarn | None) -> np.ndarray:
    """Inverse frequencies [dim/2], float32: theta^(-2i/dim), blended by YaRN.

    Without yarn: extrapolation = 1 / theta^(2i/dim).
    With yarn (yarn.factor, yarn.beta_fast, yarn.beta_slow, yarn.original_max_position_embeddings):
      interpolation = 1 / (factor * theta^(2i/dim))
      ramp[i] = clip((i - low) / (high - low), 0, 1)      with (low, high) = yarn_correction_range(dim, theta, yarn)
      keep = 1 - ramp                                      1 = keep the original frequency
      inv_freq = interpolation * (1 - keep) + extrapolation * keep
    Compute theta ** (2i/dim) in float64 and round it once to float32; do the rest in float32.
    """
    raise NotImplementedError("theta^(-2i/dim), then YaRN's blend between kept and divided frequencies")


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Turn the interleaved pairs (x0, x1), (x2, x3), ... by their angles.  [..., T, R] -> [..., T, R]

    cos, sin: [T, R/2], one angle per position and pair (already times YaRN's mscale ratio).
    The output is in the reference's layout: [all rotated first-of-pair numbers | all rotated second-of-pair numbers].
    """
    raise NotImplementedError("split the pairs into evens and odds, rotate, concatenate the halves")
