"""Small NumPy functions the layer is built from. Everything is float32 in, float32 out.

Shapes use the catalogue's named dimensions: `...` any leading axes, the last axis named where
it matters. The products themselves run in kernels.linear.
"""

from __future__ import annotations

import numpy as np

from stepper.kernels.linear import linear, linears
from stepper.swap import exercise


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
    """x * sigmoid(x), computed as x / (1 + exp(-x)) in one new array, as torch's kernel does
    (the two-step form made four arrays: see docs/design-notes.md)."""
    e = np.negative(x)
    with np.errstate(over="ignore"):  # exp(-x) overflows to inf for x << 0: x / inf is then -0, as it should be
        np.exp(e, out=e)
    e += np.float32(1)
    return np.divide(x, e, out=e)


def swiglu(x: np.ndarray, gate: np.ndarray, up: np.ndarray, down: np.ndarray,
           row_weights: np.ndarray | None = None) -> np.ndarray:
    """down(silu(gate(x)) * up(x)): each routed expert and the shared expert.  [..., d] -> [..., d]

    With row_weights [N] (a routed expert's weight for each of its tokens, x [N, d]), each row
    is weighed before down: the same as weighing down's output rows, down being linear, on
    moe_inter values a token instead of d (2048 against 7168 in Kimi K2)."""
    gate_x, up_x = linears(x, (gate, up))
    act = silu(gate_x)
    act *= up_x
    if row_weights is not None:
        act *= row_weights[:, None]
    return linear(act, down)


@exercise
def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically safe softmax in float32; -inf entries (masked) get weight exactly 0 (a row
    with every entry masked: NaN, as in torch's softmax)."""
    with np.errstate(invalid="ignore"):  # -inf - -inf in such a row
        e = x - np.max(x, axis=axis, keepdims=True)  # the one new array: exp and the division happen in it
    np.exp(e, out=e)
    e /= np.sum(e, axis=axis, keepdims=True)
    return e


@exercise
def causal_mask(t: int, s: int) -> np.ndarray:
    """[T, S] bool, True where query t may attend key s: the T new positions are the last T of S."""
    past = s - t
    return np.arange(s)[None, :] <= past + np.arange(t)[:, None]
