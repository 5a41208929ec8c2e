"""Malformed safetensors files for the reader's tests: a small valid file, broken one way at a time.

The valid file holds `a` (F32 [2, 2], data bytes [0, 16)) and `b` (BF16 [3], [16, 22)) and a
`__metadata__` map. Each `Case` is the bytes of a broken copy and the tensor its error must name
(None when no single tensor is at fault). `CASES` is the corpus.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

HEADER: dict[str, Any] = {
    "__metadata__": {"format": "np"},
    "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
    "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]},
}
DATA = bytes(range(22))


@dataclass(frozen=True)
class Case:
    name: str
    content: bytes
    tensor: str | None = None


def header_text(header: dict[str, Any] | None = None) -> str:
    return json.dumps(HEADER if header is None else header, separators=(",", ":"))


def assemble(header: str | bytes, data: bytes = DATA, length: int | None = None) -> bytes:
    """8-byte length (the header's own unless given), header, data."""
    raw = header.encode() if isinstance(header, str) else header
    return (len(raw) if length is None else length).to_bytes(8, "little") + raw + data


VALID = assemble(header_text())


def edited(edit: Callable[[dict[str, Any]], None], data: bytes = DATA) -> bytes:
    """The valid header with `edit` applied to a copy of its dict."""
    header = copy.deepcopy(HEADER)
    edit(header)
    return assemble(header_text(header), data)


def field(tensor: str, key: str, value: Any) -> bytes:
    def edit(h: dict[str, Any]) -> None:
        h[tensor][key] = value

    return edited(edit)


def dropped(tensor: str, key: str) -> bytes:
    return edited(lambda h: h[tensor].pop(key))


def replaced(old: str, new: str | bytes, data: bytes = DATA) -> bytes:
    """The valid header's text with one piece replaced (for what `json.dumps` cannot write)."""
    text = header_text().encode()
    old_b = old.encode()
    assert text.count(old_b) == 1, old
    return assemble(text.replace(old_b, new.encode() if isinstance(new, str) else new), data)


def added(name: str, entry: Any, data: bytes = DATA) -> bytes:
    return edited(lambda h: h.__setitem__(name, entry), data)


B_ENTRY = '"b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]}'
ZERO = {"dtype": "F32", "shape": [0], "data_offsets": [22, 22]}


def _cases() -> list[Case]:
    return [
        # -- the 8-byte length and the file size
        Case("empty-file", b""),
        Case("seven-bytes", VALID[:7]),
        Case("header-length-zero", assemble(b"", b"")),
        Case("header-length-past-end", assemble(header_text(), DATA, length=len(header_text()) + len(DATA) + 1)),
        Case("truncated-in-header", VALID[:40]),
        Case("header-length-2^63", assemble(header_text(), DATA, length=2**63)),
        Case("header-length-2^64-1", assemble(header_text(), DATA, length=2**64 - 1)),
        Case("header-length-over-100MB", assemble(header_text(), DATA, length=100_000_001)),
        Case("data-missing-at-end", VALID[:-1], "b"),
        Case("data-section-missing", VALID[: -len(DATA)], "a"),
        Case("bytes-appended", VALID + b"\0"),
        # -- encoding and JSON syntax
        Case("non-utf8-byte", replaced('"format"', b'"\xffformat"')),
        Case("utf8-encoded-surrogate", replaced('"np"', b'"\xed\xa0\x80"')),
        Case("overlong-utf8", replaced('"np"', b'"\xc0\xaf"')),
        Case("utf8-bom", assemble(b"\xef\xbb\xbf" + header_text().encode())),
        Case("not-json", assemble("hello world")),
        Case("trailing-nul", assemble(header_text().encode() + b"\0")),
        Case("trailing-garbage", assemble(header_text() + " x")),
        Case("trailing-comma", replaced(B_ENTRY, B_ENTRY + ",")),
        Case("single-quotes", assemble(header_text().replace('"', "'"))),
        Case("json-array", assemble("[]", b"")),
        Case("json-number", assemble("42", b"")),
        Case("json-string", assemble('"a"', b"")),
        Case("json-null", assemble("null", b"")),
        Case("nan-literal", replaced('"shape":[3]', '"shape":[NaN]')),
        Case("infinity-literal", replaced("[16,22]", "[16,Infinity]")),
        Case("minus-infinity-literal", replaced("[0,16]", "[-Infinity,16]")),
        Case("lone-surrogate-in-name", replaced('"b":', '"\\ud800":')),
        Case("lone-surrogate-in-metadata", replaced('"np"', '"\\udc00"')),
        Case("control-character-in-name", replaced('"b":', '"b\x01":')),
        # -- names a terminal or a message could not show as they are
        Case("name-empty", replaced('"b":', '"":')),
        Case("name-escape-sequence", replaced('"b":', '"\\u001b[2Jb":')),
        Case("name-nul", replaced('"b":', '"b\\u0000":')),
        Case("name-newline", replaced('"b":', '"b\\nc":')),
        Case("name-delete", replaced('"b":', '"b\\u007f":')),
        Case("name-c1-control", replaced('"b":', '"b\\u009b":')),
        Case("nested-200-deep", replaced(B_ENTRY, B_ENTRY + ',"x":' + "[" * 200 + "]" * 200), "x"),
        Case("5000-digit-integer", replaced('"shape":[3]', '"shape":[' + "9" * 5000 + "]")),
        # -- duplicate keys
        Case("duplicate-tensor-name", replaced(B_ENTRY, B_ENTRY + "," + B_ENTRY), "b"),
        Case("duplicate-key-in-entry", replaced('"dtype":"BF16"', '"dtype":"BF16","dtype":"BF16"'), "b"),
        Case("duplicate-metadata", replaced(B_ENTRY, B_ENTRY + ',"__metadata__":{}')),
        Case("duplicate-metadata-key", replaced('"format":"np"', '"format":"np","format":"pt"')),
        # -- __metadata__
        Case("metadata-array", edited(lambda h: h.__setitem__("__metadata__", ["np"]))),
        Case("metadata-int-value", edited(lambda h: h.__setitem__("__metadata__", {"format": 1}))),
        Case("metadata-object-value", edited(lambda h: h.__setitem__("__metadata__", {"format": {}}))),
        # -- a tensor entry's form
        Case("entry-array", edited(lambda h: h.__setitem__("b", ["BF16", [3], [16, 22]])), "b"),
        Case("entry-null", added("z", None), "z"),
        Case("entry-string", added("z", "F32"), "z"),
        Case("entry-extra-key", field("b", "offsets", [16, 22]), "b"),
        Case("entry-missing-dtype", dropped("b", "dtype"), "b"),
        Case("entry-missing-shape", dropped("b", "shape"), "b"),
        Case("entry-missing-data-offsets", dropped("b", "data_offsets"), "b"),
        # -- dtype
        Case("unknown-dtype", field("b", "dtype", "BF17"), "b"),
        Case("lowercase-dtype", field("b", "dtype", "bf16"), "b"),
        Case("dtype-not-a-string", field("b", "dtype", 2), "b"),
        Case("dtype-unsupported-here", field("b", "dtype", "F8_E4M3FNUZ"), "b"),
        # -- shape
        Case("negative-dims", field("b", "shape", [-1, -3]), "b"),
        Case("float-dim", field("b", "shape", [3.0]), "b"),
        Case("exponent-dim", replaced('"shape":[3]', '"shape":[3e0]'), "b"),
        Case("boolean-dim", field("b", "shape", [3, True]), "b"),
        Case("string-dim", field("b", "shape", ["3"]), "b"),
        Case("null-dim", field("b", "shape", [3, None]), "b"),
        Case("shape-not-a-list", field("b", "shape", 3), "b"),
        Case("shape-object", field("b", "shape", {"0": 3}), "b"),
        Case("shape-wrong-size", field("b", "shape", [4]), "b"),
        Case("shape-product-over-2^64", field("a", "shape", [2**32, 2**32, 2**32]), "a"),
        Case("zero-size-with-overflowing-dims", added("z", {**ZERO, "shape": [2**40, 2**40, 0]}), "z"),
        Case("too-many-dims", field("b", "shape", [3] + [1] * 40), "b"),
        # -- data_offsets
        Case("offsets-one-item", field("b", "data_offsets", [16]), "b"),
        Case("offsets-three-items", field("b", "data_offsets", [16, 22, 22]), "b"),
        Case("offsets-negative", field("a", "data_offsets", [-16, 0]), "a"),
        Case("offsets-float", field("b", "data_offsets", [16.0, 22]), "b"),
        Case("offsets-minus-zero", replaced("[0,16]", "[-0,16]"), "a"),
        Case("offsets-end-before-start", added("z", {**ZERO, "data_offsets": [22, 21]}), "z"),
        Case("offsets-not-a-list", field("b", "data_offsets", "16:22"), "b"),
        Case("offsets-object", field("b", "data_offsets", {"start": 16, "end": 22}), "b"),
        Case("offsets-past-2^64", added("z", {**ZERO, "data_offsets": [2**66, 2**66]}), "z"),
        # -- layout of the data section
        Case("gap-between-tensors", edited(_shrink_a), "b"),
        Case("first-tensor-not-at-zero", edited(_drop_a), "b"),
        Case("overlapping-tensors", field("b", "data_offsets", [14, 20]), "b"),
        Case("aliasing-tensors", added("c", HEADER["b"]), "c"),
        Case("zero-size-inside-a-tensor", added("z", {**ZERO, "data_offsets": [8, 8]}), "z"),
        Case("zero-size-past-the-end", added("z", {**ZERO, "data_offsets": [30, 30]}), "z"),
    ]


def _shrink_a(h: dict[str, Any]) -> None:
    """`a` becomes F32 [3] at [0, 12), so bytes [12, 16) belong to no tensor."""
    h["a"] = {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}


def _drop_a(h: dict[str, Any]) -> None:
    """Only `b`, at [16, 22): the data section starts with 16 bytes no tensor uses."""
    del h["a"]


CASES = _cases()
