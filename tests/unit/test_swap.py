"""The seam of seams/swap.py: a fast path names the exercise functions it bypasses by object, and runs
its readable version while any of them is swapped in; the exercises are listed by object
(lessons.exercises), never registered as a side effect of importing the model."""

import ast
from pathlib import Path

import numpy as np
import pytest

import stepper
from stepper import fp8
from stepper.errors import StepperError
from stepper.lessons import exercises, overrides
from stepper.model.ops import rms_norm
from stepper.seams import swap
from stepper.seams.swap import bypasses, exercise, exercise_name, swapped


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


def marked_in_source() -> set[tuple[str, str]]:
    """(module, function) of every function the package's source marks @exercise, read with ast."""
    package = Path(stepper.__file__).resolve().parent
    found = set()
    for path in package.rglob("*.py"):
        module = ".".join(path.relative_to(package.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any(
                    isinstance(d, ast.Name) and d.id == "exercise" for d in node.decorator_list):
                found.add((module, node.name))
    return found


def test_every_function_marked_exercise_is_listed_by_object_and_nothing_else():
    listed = {(f.__module__, f.__name__) for f in exercises.FUNCTIONS}
    assert listed == marked_in_source() and len(listed) == 15
    assert list(exercises.REFERENCES) == [exercise_name(f) for f in exercises.FUNCTIONS]
    assert exercises.REFERENCES["rms_norm"] is rms_norm.__wrapped__  # stepper's own, not the swapping wrapper


def test_marking_a_function_registers_nothing():
    @exercise
    def made_up_exercise(x):
        return x + 1

    assert not hasattr(swap, "REFERENCES") and "made_up_exercise" not in exercises.REFERENCES
    assert made_up_exercise(1) == 2
    with swapped({"made_up_exercise": lambda x: x * 10}):  # the seam still swaps it by name
        assert made_up_exercise(2) == 20
    with pytest.raises(StepperError, match="'made_up_exercise' is not an exercise function"), \
            overrides.patched({"made_up_exercise": lambda x: x}):
        pass
