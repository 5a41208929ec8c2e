"""kernels.activations against the readable lines they replace (model.ops' docstrings): the
same arithmetic in fewer arrays, so the same bits; the SwiGLU's row weights, applied before down
instead of after, to float32 round-off."""

import numpy as np
import pytest

from stepper.kernels import activations
from stepper.kernels.linear import linear
from stepper.model.ops import sigmoid

EXTREMES = np.array([0.0, -0.0, 1e-30, -1e-30, 88.0, -88.0, 89.0, -104.0, 1000.0, -1000.0, np.inf],
                    np.float32)


def values(shape, seed=0, scale=8.0):
    return (np.random.default_rng(seed).standard_normal(shape, dtype=np.float32) * np.float32(scale))


def test_silu_is_x_over_one_plus_exp_minus_x_bit_for_bit():
    x = np.concatenate([values(4096), EXTREMES])
    with np.errstate(over="ignore"):
        readable = x / (np.float32(1) + np.exp(-x))
    fast = activations.silu(x)
    assert fast.dtype == np.float32
    np.testing.assert_array_equal(fast.view(np.uint32), readable.view(np.uint32))
    assert not np.shares_memory(fast, x) and x[-2] == -1000.0  # the input untouched


def test_silu_is_x_times_sigmoid_x_to_one_rounding():
    """x * sigmoid(x) rounds twice (the sigmoid, then the product), x / (1 + exp(-x)) once: they
    differ in the last bit on some values, never by more."""
    x = values(4096, seed=1)
    two_step = x * sigmoid(x)
    np.testing.assert_array_max_ulp(activations.silu(x), two_step, maxulp=2)


@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax_is_exp_of_x_minus_max_over_its_sum_bit_for_bit(axis):
    x = values((6, 9), seed=2)
    x[1, :4] = -np.inf  # masked entries
    x[3] = -np.inf  # a row with every entry masked: NaN, as the readable line gives
    x[:, 5] = [1000.0, -1000.0, 3.0, -np.inf, 0.0, 88.0]
    with np.errstate(invalid="ignore"):
        readable = np.exp(x - np.max(x, axis=axis, keepdims=True)) / np.sum(
            np.exp(x - np.max(x, axis=axis, keepdims=True)), axis=axis, keepdims=True)
    fast = activations.softmax(x, axis)
    np.testing.assert_array_equal(fast.view(np.uint32), readable.view(np.uint32))
    if axis == -1:
        assert np.isnan(fast[3]).all() and (fast[1, :4] == 0).all()


def concatenated_softmax_dropped(x, sinks):
    """transformers' gpt-oss lines in float64: the sink column appended, the softmax, the column dropped."""
    combined = np.concatenate([x, np.broadcast_to(sinks, (*x.shape[:-1], 1))], axis=-1).astype(np.float64)
    combined -= combined.max(axis=-1, keepdims=True)
    return (np.exp(combined) / np.exp(combined).sum(axis=-1, keepdims=True))[..., :-1]


def rows_with_sinks():
    """[2, 3, 4, 9] rows (heads of a batch of queries) with masked entries, a row of them all, and
    the extremes; one sink logit a head [one, H, one, one]."""
    x = values((2, 3, 4, 9), seed=8)
    x[0, 1, 2, :4] = -np.inf  # masked entries
    x[1, 0, 3] = -np.inf  # a row with every entry masked
    x[1, 2, :, 5] = [1000.0, -1000.0, 88.0, -88.0]
    return x, values((1, 3, 1, 1), seed=9)


def test_softmax_with_sinks_is_the_softmax_of_the_rows_and_the_sink_column_dropped():
    x, sinks = rows_with_sinks()
    weighed = activations.softmax_with_sinks(x, sinks)
    assert weighed.dtype == np.float32 and weighed.shape == x.shape
    np.testing.assert_allclose(weighed, concatenated_softmax_dropped(x, sinks), rtol=1e-5, atol=1e-7)
    assert (weighed[0, 1, 2, :4] == 0).all() and (weighed[1, 0, 3] == 0).all()  # masked: 0; all masked: 0, not NaN
    assert (weighed.sum(axis=-1) <= 1).all()  # the sink's share dropped (to float32's 1 where it is tiny)
    per_row = np.broadcast_to(sinks, (*x.shape[:-1], 1))  # [B, H, T, one]: the same
    np.testing.assert_array_equal(activations.softmax_with_sinks(x, per_row), weighed)


def test_softmax_with_a_sink_of_minus_inf_is_the_softmax_bit_for_bit():
    x, _ = rows_with_sinks()
    sinks = np.full((1, 3, 1, 1), -np.inf, np.float32)
    np.testing.assert_array_equal(activations.softmax_with_sinks(x, sinks).view(np.uint32),
                                  activations.softmax(x).view(np.uint32))  # NaN where softmax has it


def test_any_softmax_with_the_sink_column_appended_and_dropped():
    x, sinks = rows_with_sinks()
    calls = []

    def learners(rows):
        calls.append(rows.shape)
        return activations.softmax(rows)
    weighed = activations.with_sink_column(learners, x, sinks)
    assert calls == [(2, 3, 4, 10)] and weighed.dtype == np.float32
    np.testing.assert_allclose(weighed, concatenated_softmax_dropped(x, sinks), rtol=1e-5, atol=1e-7)
    assert (weighed[1, 0, 3] == 0).all()


def expert(seed, d=24, inter=40):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((inter, d), dtype=np.float32), rng.standard_normal((inter, d), dtype=np.float32),
            rng.standard_normal((d, inter), dtype=np.float32))


def test_swiglu_is_down_of_silu_gate_times_up_bit_for_bit():
    gate, up, down = expert(3)
    x = values((2, 5, 24), seed=4, scale=1.0)
    readable = linear(activations.silu(linear(x, gate)) * linear(x, up), down)
    np.testing.assert_array_equal(activations.swiglu(x, gate, up, down), readable)


def test_swiglu_row_weights_weigh_each_row_of_the_output():
    gate, up, down = expert(5)
    x = values((7, 24), seed=6, scale=1.0)
    weights = np.random.default_rng(7).uniform(0.01, 2.0, 7).astype(np.float32)
    readable = activations.swiglu(x, gate, up, down) * weights[:, None]
    weighed = activations.swiglu(x, gate, up, down, weights)
    assert weighed.shape == readable.shape and not np.array_equal(weighed, activations.swiglu(x, gate, up, down))
    np.testing.assert_allclose(weighed, readable, rtol=0, atol=1e-5 * np.abs(readable).max())
