"""Reading a learner's answer: a shape, a number, a set of integers or one of a choice's options.

Each reader gives the value, or raises `Unreadable` saying what in the text could not be read;
`read` turns that into the reason shown to the learner, with the forms it accepts (`FORMS`).
Nothing is guessed: an answer that could be read two ways (`1,28`, `1 280`, `0-4` as a number)
is refused, and the learner is asked again.

- number: `1280`, `1,280` (thousands), `1280 B`, `1.25 KiB`, `0.25`, `1e-6`, `2^-6`, `3/8`,
  `4*320`, `35.6x`, `≈ 1.81`, `0x4C`. Byte units turn into bytes (kB = 1000, KiB = 1024). A decimal
  written to a few digits carries its precision: `1.3 KiB` is any value from 1.25 to 1.35 KiB.
- set: `3, 17, 28`, `3 17 28`, `{3, 17, 28}`, ranges `0-4` or `0..4` (both ends included),
  `none` for the empty set.
- shape: `[1, 7, 512]`, `1x7x512`, `(1,7,512)`, `1 7 512`, `[B=1, T=7, 512]`, stepper's own
  `[B=1 batch, T=7 positions, 512 hidden]`, and products such as `[1, 7, 4*48]`.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Sequence

FORMS = {
    "shape": "write the sizes in order, like [1, 7, 512], 1x7x512 or 1 7 512",
    "number": "write one number, like 1280, 1,280, 1280 B, 1.25 KiB, 0.25, 1e-6, 2^-6, 3/8 or 4*320",
    "set": "write the numbers in any order, like 3, 17, 28 or 3 17 28, and a range as 0-4",
    "choice": "answer with the option's letter, number or text",
}
LONGEST = 200  # characters: longer answers are not read
LARGEST_SET = 4096  # members a range may expand to


class Unreadable(ValueError):
    """The answer could not be read; the message says what was in the way."""


class Reading(float):
    """A number as the learner wrote it: its value and, for a decimal like 1.3, the step of its
    last digit (0.1), in the same units; 0 when it is exact."""

    step: float = 0.0


def reading(value: float, step: float = 0.0) -> Reading:
    number = Reading(value)
    number.step = step
    return number


# ---------------------------------------------------------------------------------------------
# Numbers

BYTE_UNITS = {"b": 1, "byte": 1, "bytes": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
              "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
APPROXIMATELY = re.compile(r"^(?:≈|~|=|about|approx\.?|approximately|roughly|around)\s*", re.IGNORECASE)
TIMES = re.compile(r"\s*(?:x|×|times)$", re.IGNORECASE)
UNIT = re.compile(r"\s*([a-z]+)$", re.IGNORECASE)
THOUSANDS = re.compile(r"(?<![\d.,])\d{1,3}(?:[,_\u202f]\d{3})+(?![\d,_\u202f])")  # 1,280 (not 7,128 of 1,7,128)
LITERAL = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?", re.IGNORECASE)
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
             ast.Pow: operator.pow}


def parse_number(text: str) -> Reading:
    """One number, possibly an arithmetic expression, with an optional byte unit or 'x'."""
    if len(text) > LONGEST:
        raise Unreadable("that is too long to be one number")
    if re.search(r"\d\s*[–—]\s*\d|(?<![\w.])\d+(?:\.\d+)?-\d", text):
        raise Unreadable("that reads as a range; one number is asked for (a difference is written 9 - 4)")
    core = text.strip().replace("−", "-")
    if not re.search(r"\d|nan|inf", core, re.IGNORECASE):
        raise Unreadable("there is no number in it")
    core = APPROXIMATELY.sub("", core)
    if re.fullmatch(r"\s*0x[0-9a-f]+\s*", core, re.IGNORECASE):  # a byte, 0x4C
        return reading(int(core, 16))
    core = TIMES.sub("", core)
    scale = 1.0
    unit = UNIT.search(core)
    if unit and unit.group(1).lower() not in ("e", "nan", "inf"):
        if unit.group(1).lower() not in BYTE_UNITS:
            raise Unreadable(f"'{unit.group(1)}' is not a unit I know (bytes: B, kB, KiB, MB, MiB, GB, GiB)")
        scale = BYTE_UNITS[unit.group(1).lower()]
        core = core[: unit.start()]
    core = THOUSANDS.sub(lambda m: re.sub(r"[,_\u202f]", "", m.group(0)), core)
    if "," in core:
        parts = [p.strip() for p in core.split(",")]
        if len(parts) > 2 or " " in core or not all(LITERAL.fullmatch(p) for p in parts):
            raise Unreadable(f"that reads as {len(parts)} numbers; one is asked for (thousands are written 1,280)")
        raise Unreadable(f"'{core.strip()}': a comma separates thousands (1,280); decimals take a point (1.28)")
    if not core.strip():
        raise Unreadable("there is no number in it")
    value = evaluate(core.replace("^", "**").replace("×", "*").replace("·", "*").replace("÷", "/"))
    return reading(value * scale, precision(core) * scale)


def precision(core: str) -> float:
    """The step of the last digit of a lone decimal with two or more significant digits
    ('1.3' -> 0.1, '0.0250' -> 0.0001, '1.25e3' -> 10); 0 for anything else."""
    m = re.fullmatch(r"\s*[-+]?(\d*)\.(\d+)(?:[eE]([-+]?\d+))?\s*", core)
    if not m:
        return 0.0
    digits = (m.group(1) + m.group(2)).lstrip("0")
    if len(digits) < 2:
        return 0.0
    return 10.0 ** (int(m.group(3) or 0) - len(m.group(2)))


def evaluate(expr: str) -> float:
    """An arithmetic expression of numbers (+ - * / ** and brackets), in floats, without eval."""
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError):
        raise Unreadable(unread_number(expr)) from None
    try:
        value = float(arithmetic(tree.body))
    except (OverflowError, ZeroDivisionError, TypeError):
        raise Unreadable("that expression has no finite value") from None
    if not math.isfinite(value) and not re.fullmatch(r"\s*[-+]?(?:nan|inf)\s*", expr, re.IGNORECASE):
        raise Unreadable("that expression has no finite value")
    return value


def arithmetic(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return float(node.value)
    if isinstance(node, ast.Name) and node.id.lower() in ("nan", "inf"):
        return float(node.id.lower())
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = arithmetic(node.operand)
        return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        left, right = arithmetic(node.left), arithmetic(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 1100 or abs(left) > 1e6):
            raise OverflowError
        return OPERATORS[type(node.op)](left, right)
    raise Unreadable(unread_number(ast.unparse(node)))


def unread_number(expr: str) -> str:
    numbers = LITERAL.findall(expr)
    if len(numbers) > 1 and re.fullmatch(r"[\s\d.eE+-]+", expr):
        return f"that reads as {len(numbers)} numbers ({', '.join(numbers[:4])}); one is asked for"
    return f"I could not read '{expr.strip()[:40]}' as a number"


# ---------------------------------------------------------------------------------------------
# Sets

EMPTY = re.compile(r"^\s*(?:none|nothing|empty|no\s+\w+|[{\[(]\s*[}\])]|∅)\s*$", re.IGNORECASE)
RANGE = re.compile(r"(\d+)\s*(?:-|–|—|\.\.\.?|\bto\b)\s*(\d+)")


def parse_set(text: str) -> frozenset[int]:
    """Integers 0 and up in any order, separated by commas, spaces or 'and'; a-b is a range."""
    if len(text) > LONGEST:
        raise Unreadable("that is too long to read")
    if EMPTY.match(text):
        return frozenset()
    body = RANGE.sub(r"\1-\2", re.sub(r"[{}\[\]()]", " ", text))  # '0 .. 4', '0 to 4' -> '0-4'
    members: set[int] = set()
    for token in re.split(r"[,;&\s]+|\band\b", body):
        if token:
            members |= set_member(token)
    if not members:
        raise Unreadable("there is no number in it")
    return frozenset(members)


def set_member(token: str) -> set[int]:
    if re.fullmatch(r"\d+", token):
        return {int(token)}
    span = re.fullmatch(r"(\d+)-(\d+)", token)
    if span:
        low, high = int(span.group(1)), int(span.group(2))
        if low > high:
            raise Unreadable(f"the range {token} runs backwards: write the smaller end first")
        if high - low >= LARGEST_SET:
            raise Unreadable(f"the range {token} has more than {LARGEST_SET} members")
        return set(range(low, high + 1))
    if re.fullmatch(r"[-+]\d+", token):
        raise Unreadable(f"'{token}': the members are numbered from 0, and a range is written 0-4")
    if re.fullmatch(r"\d*\.\d+", token):
        raise Unreadable(f"'{token}': the members are whole numbers")
    raise Unreadable(f"I could not read '{token[:20]}' as a number or a range like 0-4")


# ---------------------------------------------------------------------------------------------
# Shapes

LABEL = re.compile(r"^[A-Za-z_][\w]*\s*=\s*")  # 'B=' in B=1
SIZE = re.compile(r"\d+(?:\s*\*\s*\d+)*")  # 512 or 4*48


def parse_shape(text: str) -> tuple[int, ...]:
    """The sizes in order; axes separated by commas, or (without commas) by x or spaces."""
    if len(text) > LONGEST:
        raise Unreadable("that is too long to read")
    if APPROXIMATELY.match(text.strip()):  # "about 1" read as the shape [1], "about" as an axis's label
        raise Unreadable("a shape is exact: give its sizes ([1, 7, 512] or 1x7x512)")
    body = re.sub(r"[\[\]()]", " ", text.replace("×", "x"))
    if re.search(r"\d\.\d", body):
        raise Unreadable("sizes are whole numbers")
    if re.search(r"(?<![\w=*])-\s*\d", body):
        raise Unreadable("sizes are not negative")
    if "," in body:
        pieces = [size_of(piece) for piece in body.split(",")]
    else:
        tokens = [t for t in re.split(r"\s*(?<![a-z])x(?![a-z])\s*|\s+", body.strip()) if t]
        pieces = [size_of(t) if re.fullmatch(r"(?:[A-Za-z_]\w*=)?\d+(?:\*\d+)*|[A-Za-z_]+", t) else unread_size(t)
                  for t in tokens]
    sizes = tuple(p for p in pieces if p is not None)
    if not sizes:
        raise Unreadable("there is no size in it")
    return sizes


def unread_size(token: str) -> int:
    raise Unreadable(f"I could not read '{token[:20]}' as a size")


def size_of(piece: str) -> int | None:
    """'B=1 batch' -> 1, '4*48' -> 192, 'batch' -> None (a label alone)."""
    piece = LABEL.sub("", piece.strip())
    found = SIZE.findall(piece)
    if not found:
        if re.fullmatch(r"[A-Za-z_ ]*", piece):
            return None
        raise Unreadable(f"I could not read '{piece[:20]}' as a size")
    if len(found) > 1:
        raise Unreadable(f"'{piece[:30]}' holds {len(found)} sizes: separate the axes with commas")
    return math.prod(int(n) for n in found[0].split("*"))


# ---------------------------------------------------------------------------------------------
# Choices and the dispatch


def parse_choice(text: str, options: Sequence[str]) -> int:
    """The index of the option meant: its number (1..), its letter (a..), its text, a unique start of
    it, or words only one option holds ("same" for "about the same")."""
    answer = text.strip().lower().rstrip(").")
    if not answer:
        raise Unreadable("there is no answer in it")
    if answer.isdigit() and 1 <= int(answer) <= len(options):
        return int(answer) - 1
    if len(answer) == 1 and "a" <= answer <= "z" and ord(answer) - ord("a") < len(options):
        return ord(answer) - ord("a")
    lowered = [o.strip().lower() for o in options]
    if answer in lowered:
        return lowered.index(answer)
    starts = [i for i, o in enumerate(lowered) if o.startswith(answer)]
    if len(starts) == 1:
        return starts[0]
    holding = [i for i, o in enumerate(lowered) if re.search(rf"(?<!\w){re.escape(answer)}(?!\w)", o)]
    if not starts and len(holding) == 1:
        return holding[0]
    starts = starts or holding
    raise Unreadable("that starts more than one option" if starts else "that is none of the options")


READERS = {"shape": parse_shape, "number": parse_number, "set": parse_set}


def read(kind: str, text: str, options: Sequence[str] = ()):
    """(the value, "") or (None, why it could not be read and how to write it)."""
    try:
        if kind == "choice":
            return parse_choice(text, options), ""
        if kind not in READERS:
            raise ValueError(f"unknown prediction kind {kind!r}")
        return READERS[kind](text), ""
    except Unreadable as e:
        return None, f"{e}; {FORMS[kind]}"


def parse(kind: str, text: str, options: Sequence[str] = ()):
    """The value, or None when the text cannot be read."""
    return read(kind, text, options)[0]
