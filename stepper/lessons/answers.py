"""Reading a learner's prediction and saying whether it is right, and if not, why not.

Four kinds of prediction:

- `shape`: `[1, 7, 512]`, `1x7x512`, `(1,7,512)`, `1 7 512`, `[B=1, T=7, 512]` all read as (1, 7, 512).
- `number`: `1.81`, `-0.5`, `1e-6`, `2^-6`, `3/8`; right within a relative `tolerance` (plus an
  absolute `atol`).
- `set`: integers in any order (`13, 2, 28`): expert ids, groups; compared as sets.
- `choice`: one of the listed options, by its text (or the start of it), its number or its letter.

A wrong answer gets the lesson's own explanation when it matches one of the lesson's `wrong`
answers (or its catch-all `*`), else a generic one worked out from the expected value: for shapes
from the tensor's named dimensions (the batch axis left out, the heads not yet split, a size that
is another config field), for numbers the factor or sign it is off by, for sets what is missing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from stepper import catalog
from stepper.config import Config
from stepper.presets import preset

KINDS = ("shape", "number", "set", "choice")

# Config fields worth naming when a size equals one of them.
SIZE_FIELDS = (
    "hidden_size", "intermediate_size", "moe_intermediate_size", "num_attention_heads", "q_lora_rank",
    "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "qk_head_dim", "n_routed_experts",
    "num_experts_per_tok", "vocab_size",
)


@dataclass(frozen=True)
class Verdict:
    right: bool
    why: str = ""  # for a wrong answer: why it is wrong; for an unreadable one: how to write it
    readable: bool = True


# ---------------------------------------------------------------------------------------------
# Parsing


def parse_shape(text: str) -> tuple[int, ...] | None:
    """Every integer in the text, in order: '[1, 7, 512]', '1x7x512', '(1,7,512)', '1 7 512'."""
    if re.search(r"\d\.\d", text):
        return None
    numbers = re.findall(r"\d+", text)
    return tuple(int(n) for n in numbers) if numbers else None


NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


def parse_number(text: str) -> float | None:
    """'1.81', '-0.5', '1e-6', '2^-6' or '2**-6', '3/8'; the first number in the text otherwise."""
    text = text.strip().replace("−", "-").replace("×", "*")
    power = re.fullmatch(rf"\s*({NUMBER})\s*(?:\^|\*\*)\s*\(?\s*([-+]?\d+)\s*\)?\s*", text)
    if power:
        return float(power.group(1)) ** int(power.group(2))
    fraction = re.fullmatch(rf"\s*({NUMBER})\s*/\s*({NUMBER})\s*", text)
    if fraction and float(fraction.group(2)) != 0:
        return float(fraction.group(1)) / float(fraction.group(2))
    first = re.search(NUMBER, text)
    return float(first.group(0)) if first else None


def parse_set(text: str) -> frozenset[int] | None:
    numbers = re.findall(r"-?\d+", text)
    return frozenset(int(n) for n in numbers) if numbers else None


def parse_choice(text: str, options: Sequence[str]) -> int | None:
    """The index of the option meant: its number (1..), its letter (a..), its text or a unique start of it."""
    answer = text.strip().lower().rstrip(").")
    if not answer:
        return None
    if answer.isdigit() and 1 <= int(answer) <= len(options):
        return int(answer) - 1
    if len(answer) == 1 and "a" <= answer <= "z" and ord(answer) - ord("a") < len(options):
        return ord(answer) - ord("a")
    lowered = [o.strip().lower() for o in options]
    if answer in lowered:
        return lowered.index(answer)
    starts = [i for i, o in enumerate(lowered) if o.startswith(answer)]
    return starts[0] if len(starts) == 1 else None


def parse(kind: str, text: str, options: Sequence[str] = ()):
    if kind == "shape":
        return parse_shape(text)
    if kind == "number":
        return parse_number(text)
    if kind == "set":
        return parse_set(text)
    if kind == "choice":
        return parse_choice(text, options)
    raise ValueError(f"unknown prediction kind {kind!r}")


HOW_TO_WRITE = {
    "shape": "write a shape like [1, 7, 512] or 1x7x512",
    "number": "write a number like 0.25, 1e-6 or 2^-6",
    "set": "write the numbers separated by commas, like 3, 17, 28",
    "choice": "answer with the option's letter, number or text",
}


def same(kind: str, a, b, tolerance: float = 0.0, atol: float = 0.0) -> bool:
    """Is the parsed answer `a` the value `b`?"""
    if kind == "number":
        return abs(a - b) <= atol + tolerance * abs(b)
    if kind == "shape":
        return tuple(a) == tuple(b)
    if kind == "set":
        return frozenset(a) == frozenset(b)
    return a == b


# ---------------------------------------------------------------------------------------------
# Why a wrong answer is wrong, when the lesson has nothing specific to say


def why_wrong(kind: str, answer, expected, *, dims: Sequence[str] = (), cfg: Config | None = None,
              options: Sequence[str] = ()) -> str:
    if kind == "shape":
        return why_shape(tuple(answer), tuple(expected), dims, cfg)
    if kind == "number":
        return why_number(float(answer), float(expected))
    if kind == "set":
        return why_set(frozenset(answer), frozenset(expected))
    return f"not '{options[answer]}'" if options else "not that one"


def dim_label(symbol: str) -> str:
    entry = catalog.load().raw["dims"].get(symbol)
    return f"{symbol} ({entry['label']})" if entry else symbol


def dim_size_name(symbol: str) -> str | None:
    """The config expression a dimension's size comes from ('kv_lora_rank + qk_rope_head_dim')."""
    entry = catalog.load().raw["dims"].get(symbol)
    if entry is None or entry["size"] == catalog.RUNTIME:
        return None
    return entry["size"]


def field_names(value: int, cfg: Config | None) -> str:
    """' (kv_lora_rank)' when a size is a config field of this model, or of Kimi K2 at full size."""
    if cfg is None:
        return ""
    here = [f for f in SIZE_FIELDS if getattr(cfg, f, None) == value]
    if here:
        return f" ({' or '.join(here[:2])})"
    kimi = preset("kimi-k2")
    there = [f for f in SIZE_FIELDS if getattr(kimi, f) == value and getattr(cfg, f) != value]
    if there:
        f = there[0]
        return f" (Kimi K2's full-size {f}; this {cfg.name} model's {f} is {getattr(cfg, f)})"
    return ""


def why_shape(a: tuple[int, ...], e: tuple[int, ...], dims: Sequence[str], cfg: Config | None) -> str:
    dims = list(dims) if len(dims) == len(e) else []
    labels = ", ".join(dim_label(s) for s in dims) if dims else ""
    heads = len(e) == 4 and dims[1:2] == ["H"]
    if len(a) != len(e):
        if e and e[0] == 1 and a == e[1:]:
            return "stepper keeps the batch axis: B = 1 comes first, even for one sequence"
        if heads and a == (e[0], e[2], e[1] * e[3]):
            return (f"that is the shape before the heads are split: the projection gives [B, T, H*{e[3]}], "
                    f"which is viewed as [B, T, H, {e[3]}] and transposed so each head is its own [T, {e[3]}] matrix")
        if dims[:1] == ["N"] and len(a) == len(e) + 1 and a[0] * a[1] == e[0] and a[2:] == e[1:]:
            return (f"the router works on tokens, not sequences: batch and positions are flattened "
                    f"into N = B*T = {e[0]} rows")
        if len(e) == len(a) + 1 and any(e[:i] + e[i + 1:] == a for i in range(len(e)) if e[i] == 1):
            i = next(i for i in range(len(e)) if e[i] == 1 and e[:i] + e[i + 1:] == a)
            what = dim_label(dims[i]) if dims else f"axis {i}"
            return f"an axis of size 1 is still an axis: {what} is 1 here and stays in the shape"
        if len(e) == 3 and len(a) == 4 and a[0] == e[0] and a[2] == e[1] and a[1] * a[3] == e[2]:
            return "that is the shape before the heads are merged back: [B, H, T, V] becomes [B, T, H*V]"
        return f"it has {len(e)} axes" + (f": [{labels}]" if labels else "")
    if sorted(a) == sorted(e):
        if heads and a == (e[0], e[2], e[1], e[3]):
            return ("that is the view before the transpose: [B, T, H, ...] becomes [B, H, T, ...], heads in front, "
                    "so each head is a [T, ...] matrix to multiply")
        return "the right sizes in the wrong order" + (f": the axes are [{labels}]" if labels else "")
    reasons = []
    for i, (x, y) in enumerate(zip(a, e)):
        if x == y:
            continue
        symbol = dims[i] if dims else None
        what = dim_label(symbol) if symbol else f"axis {i}"
        size = dim_size_name(symbol) if symbol else None
        named = f" (= {size})" if size else field_names(y, cfg)
        note = ""
        if symbol == "T" and y == 1:
            note = ": a decode step runs one new token"
        elif symbol == "S":
            note = ": every position attended to, cached ones included"
        reasons.append(f"{what} is {y}{named}{note}, not {x}{field_names(x, cfg) if x != y else ''}")
    return "; ".join(reasons)


def why_number(a: float, e: float) -> str:
    if e != 0 and math.isclose(a, -e, rel_tol=0.02):
        return "right size, wrong sign"
    if e != 0 and a != 0 and (a > 0) == (e > 0):
        ratio = a / e
        for r, word in ((ratio, "times"), (1 / ratio, "a")):
            n = round(r)
            if n >= 2 and math.isclose(r, n, rel_tol=0.02):
                return f"that is {n} times the answer" if word == "times" else f"that is 1/{n} of the answer"
    return "too high" if a > e else "too low"


def why_set(a: frozenset[int], e: frozenset[int]) -> str:
    parts = [f"{len(a & e)} of {len(e)} right"]
    if a - e:
        parts.append(f"not {', '.join(map(str, sorted(a - e)))}")
    if e - a:
        parts.append(f"missing {len(e - a)}")
    if len(a) != len(e):
        parts.append(f"the answer has exactly {len(e)}")
    return "; ".join(parts)
