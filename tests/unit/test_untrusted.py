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
    (b"a\x9b\xff.npz".decode("utf-8", "surrogateescape"), "a\\x9b\\xff.npz"),  # bytes that are not UTF-8, as read
    ("\ud800x", "\\ud800x"),  # a lone surrogate (JSON allows "\ud800"), which no stream could write
])
def test_control_characters_are_escaped_and_nothing_else(raw, safe):
    assert shown(raw) == safe
    assert is_safe(shown(raw))
    assert is_safe(raw) == (raw == safe)


def test_lines_keep_newlines_and_tabs_but_not_the_rest():
    assert shown("one\n\ttwo\x1b]0;title\x07", lines=True) == "one\n\ttwo\\x1b]0;title\\x07"
    assert shown(3) == "3"


def test_what_is_shown_can_be_written_to_any_utf8_stream():
    raw = b"\x9b\xc3".decode("utf-8", "surrogateescape") + "\ud800\udfff"
    assert shown(raw).encode("utf-8") == b"\\x9b\\xc3\\ud800\\udfff"


def test_cut_escapes_and_shortens_a_value_for_one_line():
    from stepper.untrusted import cut

    assert cut("x*2") == "x*2"
    assert cut("\x1b[2J" + "-" * 100, 10) == "\\x1b[2J------..."
    assert cut("a\nb" * 3, 4) == "a\\nba..."


def test_said_shows_an_array_by_its_shape_and_a_number_by_its_repr():
    """The repr of a NumPy array spans lines ("array([[1, 2],\\n       [3, 4]])"), cut mid-way."""
    import numpy as np

    from stepper.untrusted import said

    assert said(np.arange(2_000_000)) == "an array of shape (2000000,) (int64)"
    assert said(np.zeros((2, 3), np.float32)) == "an array of shape (2, 3) (float32)"
    assert said(np.int64(-1)) == "np.int64(-1)" and said([1.5] * 100_000) == "[1.5, 1.5, 1.5, 1.5, 1.5, 1.5, ...]"
