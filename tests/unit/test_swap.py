"""The seam of swap.py: a fast path names the exercise functions it bypasses by object, and runs
its readable version while any of them is swapped in."""

import numpy as np
import pytest

from stepper import fp8
from stepper.swap import bypasses, exercise_name, swapped


def decode_via_exercise(codes):
    return fp8.decode(codes)


@bypasses(fp8.decode, readable=decode_via_exercise)
def decode_fast(codes):
    return fp8.E4M3_TABLE[codes]


def test_a_fast_path_runs_its_readable_version_while_its_exercise_is_swapped_in():
    codes = np.array([0x38, 0x40], np.uint8)  # 1.0, 2.0
    np.testing.assert_array_equal(decode_fast(codes), [1.0, 2.0])
    with swapped({"decode": lambda c: np.full(c.shape, 7.0, np.float32)}):
        np.testing.assert_array_equal(decode_fast(codes), [7.0, 7.0])  # the learner's function ran
    np.testing.assert_array_equal(decode_fast(codes), [1.0, 2.0])


def test_bypasses_takes_functions_marked_exercise_and_refuses_others():
    assert exercise_name(fp8.decode) == "decode" and exercise_name(fp8.dequantize) == "dequantize"
    with pytest.raises(TypeError, match="decode_via_exercise"):
        bypasses(decode_via_exercise, readable=decode_fast)
