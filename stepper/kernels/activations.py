"""model.ops' silu, softmax and SwiGLU, each made in one new array instead of one per step, and
the softmax with an attention sink logit per row (gpt-oss's, Hy4's), as few.

Each computes the readable line beside it with the same arithmetic in the same order, so the
results are the same bits (tests/unit/test_activations.py): the difference is memory and time, a
step writing into the array the step before made (the two-step silu made four arrays: see
docs/design-notes.md).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from stepper.kernels.linear import linear, linears


def silu(x: np.ndarray) -> np.ndarray:
    """x / (1 + exp(-x)), torch's kernel's form of x * sigmoid(x), in one new array."""
    e = np.negative(x)
    with np.errstate(over="ignore"):  # exp(-x) overflows to inf for x << 0: x / inf is then -0, as it should be
        np.exp(e, out=e)
    e += np.float32(1)
    return np.divide(x, e, out=e)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """exp(x - max(x)) / sum(exp(x - max(x))) along axis, in one new array."""
    with np.errstate(invalid="ignore"):  # -inf - -inf in a row with every entry masked
        e = x - np.max(x, axis=axis, keepdims=True)  # the one new array: exp and the division happen in it
    np.exp(e, out=e)
    e /= np.sum(e, axis=axis, keepdims=True)
    return e


def softmax_with_sinks(x: np.ndarray, sinks: np.ndarray) -> np.ndarray:
    """The softmax of each row of x with one more logit, its sink, whose column is then dropped:
    exp(x - M) / (sum(exp(x - M)) + exp(sink - M)), M = max(max(x), sink), in one new array of
    x's size (and two of one value a row). A row's weights sum to less than 1, the rest being the
    sink's; -inf entries (masked) get exactly 0, and a row with every entry masked all 0 (the
    sink takes the whole mass; NaN only with a sink of -inf, as `softmax` gives). A sink of -inf,
    or one far below the row's maximum, gives `softmax`'s bits.  x [..., S], sinks broadcastable
    to x[..., :1] ([B, H, T, one], or [one, H, one, one]: one logit a head) -> [..., S]"""
    sinks = np.asarray(sinks, np.float32)
    top = np.maximum(np.max(x, axis=-1, keepdims=True), sinks)  # M, [..., one]
    with np.errstate(invalid="ignore"):  # -inf - -inf in a row with every entry masked and a sink of -inf
        e = x - top  # the one new array: exp and the division happen in it
        sink = np.exp(sinks - top)  # [..., one]
    np.exp(e, out=e)
    e /= np.sum(e, axis=-1, keepdims=True) + sink
    return e


def with_sink_column(softmax_of: Callable[[np.ndarray], np.ndarray], x: np.ndarray, sinks: np.ndarray) -> np.ndarray:
    """Any softmax of whole rows (a learner's) made with a sink logit per row: softmax over x with
    the sinks appended as one more column, that column dropped (transformers' gpt-oss lines).
    x [..., S], sinks broadcastable to x[..., :1] -> [..., S] float32"""
    sink_column = np.broadcast_to(np.asarray(sinks, x.dtype), (*x.shape[:-1], 1))  # [..., one]
    return np.asarray(softmax_of(np.concatenate([x, sink_column], axis=-1)), np.float32)[..., :-1]


def swiglu(x: np.ndarray, gate, up, down, row_weights: np.ndarray | None = None) -> np.ndarray:
    """down(silu(gate(x)) * up(x)), the product before down made in gate(x)'s array. [..., d] -> [..., d]

    With row_weights [N] (x [N, d]), down(...) * row_weights[:, None]: each row is weighed
    before down instead, the same down being linear (to float32 round-off, not bit for bit), on
    moe_inter values a row instead of d (2048 against 7168 in Kimi K2)."""
    gate_x, up_x = linears(x, (gate, up))
    act = silu(gate_x)
    act *= up_x
    if row_weights is not None:
        act *= row_weights[:, None]
    return linear(act, down)
