"""Text that came from a file or a user, made safe to show.

A tensor name, a metadata value, a config string, a path or a lesson file may hold control
characters: ESC starts a terminal escape sequence (clear the screen, set the window title, write
the clipboard, forge a hyperlink), a carriage return overwrites what was printed, NUL and the C1
controls confuse terminals and HTML alike. `shown` turns each such character into a visible
escape (`\\x1b`, `\\r`, `\\u009b`) before the text reaches a screen, a message or an export.
"""

from __future__ import annotations

import re

CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
CONTROL_BUT_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # keeps \t and \n
NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def escape(char: str) -> str:
    """One control character as it is shown: \\t, \\n, \\r, or \\xNN / \\u00NN."""
    return NAMED.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x80 else f"\\u{ord(char):04x}")


def shown(text: object, *, lines: bool = False) -> str:
    """str(text) with every control character escaped; with `lines`, tabs and newlines stay (a
    lesson's prose, a multi-line value)."""
    pattern = CONTROL_BUT_LINES if lines else CONTROL
    return pattern.sub(lambda m: escape(m.group()), str(text))


def is_safe(text: str) -> bool:
    """Whether text holds no control character at all."""
    return CONTROL.search(text) is None
