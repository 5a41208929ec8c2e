"""Small NumPy functions the layer is built from. Everything is float32 in, float32 out.

Shapes use the catalogue's named dimensions: `...` any leading axes, the last axis named where
it matters. The products run in kernels.linear, the activations in kernels.activations.
"""

from __future__ import annotations

import numpy as np

from stepper.kernels import activations
from stepper.seams.swap import exercise


@exercise
def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x * rsqrt(mean(x^2) + eps) * weight over the last axis, in float32 like the reference.
    [..., d] -> [..., d] (and the latents: [..., q_lora], [..., kv_lora])"""
    x = x.astype(np.float32, copy=False)
    variance = np.mean(np.square(x), axis=-1, keepdims=True)  # [..., 1]
    return weight * (x * (np.float32(1) / np.sqrt(variance + np.float32(eps))))


def sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-x) overflows to inf for x << 0: the result is then 0, as it should be
        return np.float32(1) / (np.float32(1) + np.exp(-x))


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), as x / (1 + exp(-x)) like torch's kernel (kernels.activations: in one new array)."""
    return activations.silu(x)


def swiglu(x: np.ndarray, gate, up, down) -> np.ndarray:
    """down(silu(gate(x)) * up(x)): the shared expert and each routed expert.  [..., d] -> [..., d]"""
    return activations.swiglu(x, gate, up, down)


@exercise
def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """exp(x - max(x)) / sum(exp(x - max(x))) along axis, in float32 (kernels.activations: in one
    new array); -inf entries (masked) get weight exactly 0 (a row with every entry masked: NaN,
    as in torch's softmax)."""
    return activations.softmax(x, axis)


@exercise
def causal_mask(t: int, s: int) -> np.ndarray:
    """[T, S] bool, True where query t may attend key s: the T new positions are the last T of S."""
    past = s - t
    return np.arange(s)[None, :] <= past + np.arange(t)[:, None]
