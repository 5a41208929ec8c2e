"""Small pure NumPy functions the layer is built from. Everything is float32 in, float32 out.

Shapes use named dimensions: `...` any leading axes, D the last (normalised / projected) axis.
"""

from __future__ import annotations

import math

import numpy as np

from . import parallel
from .config import Yarn
from .fp8_matmul import Fp8Matrix, decoded, linear_fp8, products

F32 = np.float32
SPLIT_WEIGHTS = 1 << 20  # a float32 weight of this many values or more is shared out by rows


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x * rsqrt(mean(x^2) + eps) * weight, in float32 like the reference.  [..., D] -> [..., D]"""
    x = x.astype(F32, copy=False)
    variance = np.mean(np.square(x), axis=-1, keepdims=True)  # [..., 1]
    return weight * (x * (F32(1) / np.sqrt(variance + F32(eps))))


def linear(x: np.ndarray, weight: np.ndarray | Fp8Matrix) -> np.ndarray:
    """x @ W^T with an HF-layout weight [out, in].  [..., in] -> [..., out]

    An FP8 weight is decoded tile by tile inside the product (fp8_matmul), never as a whole.
    """
    if isinstance(weight, Fp8Matrix):
        return linear_fp8(x, weight)
    if weight.size < SPLIT_WEIGHTS:
        return np.matmul(x, weight.T)
    return linear_by_rows(x, weight)


def linears(x: np.ndarray, weights: tuple) -> list[np.ndarray]:
    """x @ W^T for several weights of the same input: FP8 ones as one product, the input made
    ready once and, on two cores, one weight on each (a SwiGLU's gate and up).  [..., in] -> [[..., out]]"""
    if all(isinstance(w, Fp8Matrix) for w in weights):
        return products(x, list(weights))
    return [linear(x, w) for w in weights]


def dense(weight: np.ndarray | Fp8Matrix, out: np.ndarray | None = None) -> np.ndarray:
    """A weight as float32 [out, in]: an FP8 one decoded a block of rows at a time (the same bits
    as fp8.dequantize, a few times faster), into `out` if given; a float32 one as it is."""
    return decoded(weight, out) if isinstance(weight, Fp8Matrix) else weight


def linear_by_rows(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """x @ W^T with W's rows shared out across the cores.  [..., in] -> [..., out]"""
    out_dim, in_dim = weight.shape
    tokens = x.reshape(-1, in_dim)  # [N, in]
    y_t = np.empty((out_dim, tokens.shape[0]), dtype=np.result_type(x, weight))  # [out, N]
    n = parallel.cores()
    shares = [(out_dim * k // n, out_dim * (k + 1) // n) for k in range(n)]

    def rows(share: list[tuple[int, int]]) -> None:
        for start, end in share:
            np.matmul(weight[start:end], tokens.T, out=y_t[start:end])

    parallel.split(shares, rows)
    return y_t.T.reshape(*x.shape[:-1], out_dim)


def sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-x) overflows to inf for x << 0: the result is then 0, as it should be
        return F32(1) / (F32(1) + np.exp(-x))


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), computed as x / (1 + exp(-x)) in one new array (as torch's kernel does):
    the two-step form made four arrays and took 3.4 ms on an expert's [252, 2048], this 0.9 ms."""
    e = np.negative(x)
    with np.errstate(over="ignore"):  # exp(-x) overflows to inf for x << 0: x / inf is then -0, as it should be
        np.exp(e, out=e)
    e += F32(1)
    return np.divide(x, e, out=e)


def swiglu(x: np.ndarray, gate: np.ndarray, up: np.ndarray, down: np.ndarray,
           row_weights: np.ndarray | None = None) -> np.ndarray:
    """down(silu(gate(x)) * up(x)): the dense MLP, each routed expert and the shared expert.

    With row_weights [N] (a routed expert's weight for each of its tokens, x [N, D]), each row
    is weighed before down: the same as weighing down's output rows, down being linear, on I
    values a token instead of D (D = 7168, I = 2048 in Kimi K2).  [..., D] -> [..., D]"""
    gate_x, up_x = linears(x, (gate, up))
    act = silu(gate_x)
    act *= up_x
    if row_weights is not None:
        act *= row_weights[:, None]
    return linear(act, down)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically safe softmax in float32; -inf entries (masked) get weight exactly 0."""
    e = x - np.max(x, axis=axis, keepdims=True)  # the one new array: exp and the division happen in it
    np.exp(e, out=e)
    e /= np.sum(e, axis=axis, keepdims=True)
    return e


def causal_mask(t: int, s: int) -> np.ndarray:
    """[T, S] bool, True where query t may attend key s: the T new positions are the last T of S."""
    past = s - t
    return np.arange(s)[None, :] <= past + np.arange(t)[:, None]


# ---------------------------------------------------------------------------------------------
# Rotary embedding with YaRN


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction 0.1 * mscale * ln(scale) + 1 (1 when not scaling)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_correction_dim(rotations: float, dim: int, theta: float, original_max: int) -> float:
    """The rotary dim index whose wavelength fits `rotations` full turns in `original_max` positions."""
    return (dim * math.log(original_max / (rotations * 2 * math.pi))) / (2 * math.log(theta))


def yarn_correction_range(dim: int, theta: float, yarn: Yarn) -> tuple[int, int]:
    """[low, high]: below low the frequency is kept (extrapolated), above high it is divided by factor."""
    low = math.floor(yarn_correction_dim(yarn.beta_fast, dim, theta, yarn.original_max_position_embeddings))
    high = math.ceil(yarn_correction_dim(yarn.beta_slow, dim, theta, yarn.original_max_position_embeddings))
    return max(low, 0), min(high, dim - 1)


def rope_inv_freq(dim: int, theta: float, yarn: Yarn | None) -> np.ndarray:
    """Inverse frequencies [dim/2], float32, with YaRN's blend between kept and interpolated ones.

    The arithmetic is the reference's float32 arithmetic, step by step, except theta ** (2i/dim),
    which stepper rounds correctly (float64, then float32) where torch's float32 pow may be one ulp
    off; see docs/numerics.md.
    """
    exponent = np.arange(0, dim, 2, dtype=F32) / F32(dim)  # [dim/2]
    pos_freqs = (np.float64(theta) ** exponent.astype(np.float64)).astype(F32)
    extrapolation = F32(1) / pos_freqs
    if yarn is None:
        return extrapolation
    interpolation = F32(1) / (F32(yarn.factor) * pos_freqs)
    low, high = yarn_correction_range(dim, theta, yarn)
    ramp = np.clip((np.arange(dim // 2, dtype=F32) - low) / (high - low if high > low else 0.001), 0, 1)
    keep = F32(1) - ramp.astype(F32)  # 1 = extrapolate (keep the original frequency)
    return interpolation * (F32(1) - keep) + extrapolation * keep


def rope_tables(positions: np.ndarray, inv_freq: np.ndarray, mscale: float) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [T, rope/2] of the angles position * inv_freq, times YaRN's cos/sin mscale.

    Angles are float32 products as in the reference; cos and sin are then correctly rounded
    (computed in float64), so they do not depend on the machine's float32 libm.
    """
    angles = positions.astype(F32)[:, None] * inv_freq[None, :]  # [T, rope/2]
    cos = np.cos(angles.astype(np.float64)).astype(F32) * F32(mscale)
    sin = np.sin(angles.astype(np.float64)).astype(F32) * F32(mscale)
    return cos, sin


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate interleaved pairs (x0, x1), (x2, x3), ... by their angles.  [..., T, rope] -> same.

    The output is in the reference's layout: [rotated evens | rotated odds], i.e. the pairs are
    first gathered into halves (as modeling_deepseek.py does with view/transpose) and then
    x * cos + rotate_half(x) * sin is applied.  cos, sin: [T, rope/2].
    """
    even, odd = x[..., 0::2], x[..., 1::2]  # [..., T, rope/2] each
    return np.concatenate([even * cos - odd * sin, odd * cos + even * sin], axis=-1)
