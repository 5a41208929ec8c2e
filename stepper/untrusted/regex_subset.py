"""The `re:` entries of a compressed-tensors config's `targets` and `ignore`, run with bounded work.

A regular expression from a file runs in Python's backtracking engine, which can take time
exponential in the name's length (`(.*.*)*!`: every way of splitting the name among the repeats is
tried before the match fails). So a pattern is read before it runs, and only a subset whose work
is bounded is accepted: characters, classes, `.`, anchors, groups and alternatives, with repeats
(`*`, `+`, `?`, `{m,n}`) only of a single character or class; no repeated group, lookaround or
backreference. A match then tries at most one way of placing each repeat's count and each
alternative; the product over the pattern, on a name of MAX_NAME characters, must stay within
MAX_WAYS. The configs Kimi ships (`.*self_attn.*`, `.*mlp\\.(gate|up|gate_up|down)_proj.*`) need
about 10^5; `.*.*.*.*!` would need 10^8.

A bounded engine (RE2) would accept more, but is no core dependency; a time limit would make the
answer depend on the machine. The names matched are stepper's own (`model.layers.3.mlp.experts.7.
gate_proj`), far shorter than MAX_NAME.
"""

from __future__ import annotations

import re

try:  # Python's own regular-expression parser: 3.11 renamed the module
    from re import _constants as sre  # type: ignore[attr-defined]
    from re import _parser as sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as sre  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

from stepper.errors import StepperError
from stepper.untrusted import cut

MAX_NAME = 128  # longest module name a pattern runs on
MAX_WAYS = 10**7  # ways a match may place the repeats and alternatives on such a name
MAX_LENGTH = 256  # characters of a pattern
MAX_GROUPS_DEEP = 16  # groups inside groups
SINGLE = {sre.LITERAL, sre.NOT_LITERAL, sre.ANY, sre.IN, sre.CATEGORY}
REPEATS = {sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", sre.MAX_REPEAT)}
NO_WORK = {sre.AT}
SUBSET = ("characters, classes, '.', anchors, groups and alternatives, with *, +, ? and {m,n} "
          "only after a single character or class")


def refusal(pattern: str) -> str | None:
    """Why a pattern is outside the bounded subset, or None when it is inside."""
    if len(pattern) > MAX_LENGTH:
        return f"is longer than {MAX_LENGTH} characters"
    if paren_depth(pattern) > MAX_GROUPS_DEEP:
        return f"nests groups more than {MAX_GROUPS_DEEP} deep"
    try:
        parsed = sre_parse.parse(pattern)
        re.compile(pattern)
    except (re.error, OverflowError, RecursionError) as e:
        return f"is not a regular expression ({e})"
    try:
        ways = ways_of(parsed, MAX_NAME)
    except ValueError as e:
        return f"uses {e}, outside the subset stepper runs ({SUBSET})"
    if ways > MAX_WAYS:
        return (f"could try {ways:.1e} ways of matching a name of {MAX_NAME} characters (at most {MAX_WAYS:.0e}): "
                "fewer repeats, please")
    return None


def paren_depth(pattern: str) -> int:
    """The deepest nesting of unescaped parentheses (a bracket in a class counts too: an overestimate)."""
    depth = deepest = 0
    escaped = False
    for char in pattern:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ")":
            depth -= 1
    return deepest


def ways_of(items, n: int) -> int:
    """How many ways a backtracking match can place the items of a parsed sequence on n characters:
    the product of each item's choices (a repeat: its counts; alternatives: the sum of theirs)."""
    ways = 1
    for op, av in items:
        if op in SINGLE or op in NO_WORK:
            continue
        if op is sre.SUBPATTERN:
            ways *= ways_of(av[-1], n)
        elif op is sre.BRANCH:
            ways *= sum(ways_of(branch, n) for branch in av[1])
        elif op in REPEATS:
            low, high, item = av
            if len(item) != 1 or item[0][0] not in SINGLE:
                raise ValueError("a repeated group")
            ways *= min(high, n) - min(low, n) + 1
        else:
            raise ValueError(NAMES.get(op, str(op).lower()))
    return ways


NAMES = {sre.GROUPREF: "a backreference", sre.ASSERT: "a lookaround", sre.ASSERT_NOT: "a lookaround",
         sre.GROUPREF_EXISTS: "a conditional"}


def matches(pattern: str, name: str) -> bool:
    """Whether pattern (checked by `refusal` when the config was read) matches from name's start."""
    if len(name) > MAX_NAME:
        raise StepperError(f"module name {cut(name, 40)} is longer than {MAX_NAME} characters, the longest a "
                           "quantization_config pattern is run on")
    return re.match(pattern, name) is not None
