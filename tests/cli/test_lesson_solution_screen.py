"""`stepper lesson solution` on a terminal narrower than the solution's lines."""

import re

from tests.helpers.terminal import on_terminal


def test_a_solution_wider_than_the_terminal_wraps_under_its_line_numbers(tmp_path):
    """At 80 columns a long line of the solution went on at column 0 (`becomes 0: exp cannot
    overflow` read as a line of Python); numbered, its rest is indented under the code."""
    screen = on_terminal("lesson", "solution", "tour", "--give-up", columns=80,
                         env={"STEPPER_DATA_DIR": str(tmp_path / "data")}, cwd=tmp_path)
    assert screen.code == 0, screen.text
    code = screen.lines[1:]
    assert any(re.match(r" +8 +shifted = x - np\.max", line) for line in code), screen.text
    assert all(not line or re.match(r" +\d+( |$)", line) or line.startswith(" " * 5) for line in code), screen.text
    wide = on_terminal("lesson", "solution", "tour", "--give-up", columns=200,
                       env={"STEPPER_DATA_DIR": str(tmp_path / "data")}, cwd=tmp_path)
    assert "    shifted = x - np.max(x, axis=axis, keepdims=True)  # the largest entry becomes 0: exp cannot overflow" \
        in wide.lines, wide.text  # where every line fits: the code as it is, to copy
