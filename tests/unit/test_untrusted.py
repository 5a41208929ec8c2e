"""Text from files and users is shown with its control characters escaped."""

import pytest

from stepper.untrusted import is_safe, shown


@pytest.mark.parametrize("raw, safe", [
    ("model.layers.0.q_proj", "model.layers.0.q_proj"),
    ("\x1b[2Jname", "\\x1b[2Jname"),  # ESC [ 2 J would clear the screen
    ("a\x00b", "a\\x00b"),
    ("a\nb\tc\rd", "a\\nb\\tc\\rd"),
    ("\x7f\x9b\x80", "\\x7f\\u009b\\u0080"),  # DEL and two C1 controls (0x9b is CSI)
    ("\u00e9t\u00e9 \U0001F600", "\u00e9t\u00e9 \U0001F600"),  # printable Unicode stays as it is
])
def test_control_characters_are_escaped_and_nothing_else(raw, safe):
    assert shown(raw) == safe
    assert is_safe(shown(raw))
    assert is_safe(raw) == (raw == safe)


def test_lines_keep_newlines_and_tabs_but_not_the_rest():
    assert shown("one\n\ttwo\x1b]0;title\x07", lines=True) == "one\n\ttwo\\x1b]0;title\\x07"
    assert shown(3) == "3"
