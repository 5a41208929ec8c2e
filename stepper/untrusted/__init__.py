"""Text that came from a file or a user, made safe to show.

A tensor name, a metadata value, a config string, a path or a lesson file may hold control
characters: ESC starts a terminal escape sequence (clear the screen, set the window title, write
the clipboard, forge a hyperlink), a carriage return overwrites what was printed, NUL and the C1
controls confuse terminals and HTML alike. A byte that is not UTF-8 (in a file name, an argument
or a line typed at a prompt) reaches Python as a lone surrogate (U+DC80..U+DCFF, the
`surrogateescape` error handler), which is written back out as that raw byte: 0x9b is CSI. Other
lone surrogates (JSON's "\\ud800") cannot be written out at all. `shown` turns each such
character into a visible escape (`\\x1b`, `\\r`, `\\u009b`, the raw byte as `\\x9b`) before the
text reaches a screen, a message or an export. A URL's credentials (`https://USER:PASSWORD@HOST`)
are shown as `https://***@HOST`.
"""

from __future__ import annotations

import re
import reprlib

CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
CONTROL_BUT_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")  # keeps \t and \n
NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}
USERINFO = re.compile(r"(?<=://)[^/?#@\s]+@")


def escape(char: str) -> str:
    """One control character as it is shown: \\t, \\n, \\r, \\xNN / \\u00NN / \\uDNNN, or a raw byte
    (a lone surrogate U+DC80..U+DCFF) as \\xNN."""
    code = ord(char)
    if char in NAMED:
        return NAMED[char]
    if code < 0x80 or 0xDC80 <= code <= 0xDCFF:
        return f"\\x{code & 0xFF:02x}"
    return f"\\u{code:04x}"


def shown(text: object, *, lines: bool = False) -> str:
    """str(text) with every control character escaped; with `lines`, tabs and newlines stay (a
    lesson's prose, a multi-line value)."""
    pattern = CONTROL_BUT_LINES if lines else CONTROL
    return pattern.sub(lambda m: escape(m.group()), USERINFO.sub("***@", str(text)))


def cut(text: object, limit: int = 60) -> str:
    """shown(text), its first `limit` characters and '...' when it is longer: a value from a file
    in a one-line message (a pattern, an expression of 100,000 characters)."""
    text = str(text)
    return shown(text) if len(text) <= limit else shown(text[:limit]) + "..."


BOUNDED = reprlib.Repr()  # (its limits as attributes: Python 3.11's takes no arguments)
BOUNDED.maxlist = BOUNDED.maxtuple = BOUNDED.maxset = 6
BOUNDED.maxdict, BOUNDED.maxlevel, BOUNDED.maxstring, BOUNDED.maxlong = 4, 3, 60, 40


def said(value: object, limit: int = 60) -> str:
    """A value read from a file (a config field's), as a one-line message shows it: its repr, made
    from at most a few items of a list or object and the ends of a long string (a list of 100,000
    numbers is not written out whole), then cut(..., limit). An array (an object with a shape and a
    dtype: NumPy's) is its shape and dtype: the repr of a NumPy array spans lines."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if isinstance(shape, tuple) and shape and dtype is not None:  # (not a NumPy scalar: shape ())
        return cut(f"an array of shape {shape} ({dtype})", limit)
    return cut(BOUNDED.repr(value), limit)


def is_safe(text: str) -> bool:
    """Whether text holds no control character at all."""
    return CONTROL.search(text) is None
