"""Saying whether a learner's prediction is right, and if not, why not.

`stepper.lessons.reading` reads the answer (a shape, a number, a set, a choice; the forms it
accepts are listed there); an answer it cannot read is refused with what was in the way, and the
learner is asked again. A number is right within the prediction's relative `tolerance` (plus an
absolute `atol`); an exact one (no tolerance) also when it is the expected value rounded to the
digits written (1.3 KiB for 1280 B). Sets are compared as sets.

A wrong answer gets the lesson's own explanation when it matches one of the lesson's `wrong`
answers (or its catch-all `*`), else a generic one worked out from the expected value: for shapes
from the tensor's named dimensions (the batch axis left out, the heads not yet split, a size that
is another config field), for numbers the factor or sign it is off by, for sets what is missing.
A generic explanation is a hint, not the answer: it names axes and where their sizes come from,
never the expected sizes or value (the learner may try again; Enter shows the answer).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from stepper import catalog
from stepper.config import Config
from stepper.lessons.reading import FORMS, parse, read
from stepper.presets import preset

__all__ = ["FORMS", "KINDS", "Verdict", "parse", "read", "same", "why_wrong"]

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


def same(kind: str, a, b, tolerance: float = 0.0, atol: float = 0.0) -> bool:
    """Is the parsed answer `a` the value `b`? Where the value is exact (no tolerance), a number
    written to a few digits (1.3 KiB) also matches every value it rounds from (1.25 to 1.35 KiB);
    a tolerance, where the lesson gives one, says how close an answer must be."""
    if kind == "number":
        exact = tolerance == 0 and atol == 0
        written = getattr(a, "step", 0.0) / 2 * (1 + 1e-9) if exact else 0.0
        return abs(a - b) <= max(atol + tolerance * abs(b), written)
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


def config_fields(value: int, cfg: Config | None) -> list[str]:
    """The config fields of this model whose value is `value` (at most two)."""
    return [] if cfg is None else [f for f in SIZE_FIELDS if getattr(cfg, f, None) == value][:2]


def field_names(value: int, cfg: Config | None, field: str | None = None) -> str:
    """What a size the learner wrote is: ' (kv_lora_rank)' when it is a config field of this model,
    ' (Kimi K2's full-size kv_lora_rank, not this tiny model's)' when it is one of Kimi K2 at full
    size (`field` first: the one the axis's size comes from)."""
    if cfg is None:
        return ""
    here = config_fields(value, cfg)
    if here:
        return f" ({' or '.join(here)})"
    kimi = preset("kimi-k2")
    there = [f for f in SIZE_FIELDS if getattr(kimi, f) == value and getattr(cfg, f) != value]
    if field in there:
        there.insert(0, field)
    if there:
        return f" (Kimi K2's full-size {there[0]}, not this {cfg.name} model's)"
    return ""


def why_shape(a: tuple[int, ...], e: tuple[int, ...], dims: Sequence[str], cfg: Config | None) -> str:
    dims = list(dims) if len(dims) == len(e) else []
    concept = why_layout(a, e, dims)
    if concept:
        return concept
    if len(a) != len(e):
        return why_axes(a, e, dims, cfg)
    if sorted(a) == sorted(e):
        return why_order(a, e, dims)
    return why_sizes(a, e, dims, cfg)


def why_layout(a: tuple[int, ...], e: tuple[int, ...], dims: list[str]) -> str:
    """The mistakes of layout worth a sentence of their own: heads not split, not merged, not
    transposed; batch and positions not flattened for the router."""
    heads = len(e) == 4 and dims[1:2] == ["H"]
    if heads and a == (e[0], e[2], e[1] * e[3]):
        return ("that is the shape before the heads are split: the projection gives [B, T, H*D], "
                "which is viewed as [B, T, H, D] and transposed so each head is its own [T, D] matrix")
    if heads and a == (e[0], e[2], e[1], e[3]) and e[1] != e[2]:
        return ("that is the view before the transpose: [B, T, H, ...] becomes [B, H, T, ...], heads in front, "
                "so each head is a [T, ...] matrix to multiply")
    if dims[:1] == ["N"] and len(a) == len(e) + 1 and a[0] * a[1] == e[0] and a[2:] == e[1:]:
        return "the router works on tokens, not sequences: batch and positions are flattened into N = B*T rows"
    merged = len(e) == 3 and len(a) == 4 and dims[2:] == ["Hv"] and 1 not in a[1:]
    if merged and a[0] == e[0] and a[2] == e[1] and a[1] * a[3] == e[2]:
        return "that is the shape before the heads are merged back: [B, H, T, V] becomes [B, T, H*V]"
    if merged and a[:2] == e[:2] and a[2] * a[3] == e[2]:
        return "that is the heads side by side, not yet merged: [B, T, H, V] is reshaped to [B, T, H*V]"
    return ""


def axis(dims: list[str], i: int) -> str:
    """How to name axis i: 'H (heads)', 'the head axis (one shared rope head)', or 'axis 2'."""
    if not dims:
        return f"axis {i + 1}"
    if dims[i] == "one":
        return "the head axis (one shared rope head)"
    return dim_label(dims[i])


def axis_names(dims: list[str]) -> str:
    """'[B, T, kv_lora]': a shape by its axes' names."""
    return f"[{', '.join('H=1' if d == 'one' else d for d in dims)}]"


def layout(e: tuple[int, ...], dims: list[str]) -> str:
    """'the shape is [B, T, kv_lora]', or 'the shape has 3 axes' when they have no names (the sizes
    are the answer)."""
    return f"the shape is {axis_names(dims)}" if dims else f"the shape has {len(e)} axes"


def axis_count(a: tuple[int, ...], e: tuple[int, ...], dims: list[str]) -> str:
    """'the shape has 3 axes, [B, T, kv_lora]; that has 1'."""
    return f"the shape has {len(e)} axes{', ' + axis_names(dims) if dims else ''}; that has {len(a)}"


def aligned(short: tuple[int, ...], long: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
    """Which positions of `long` have no counterpart in `short`: those leaving the fewest sizes
    unequal. Equal sizes in a row are matched from the left, so the one left over is the last
    of them ([1, 7, 16] against [1, 1, 7, 16] misses the second 1)."""
    best: tuple[int, tuple[int, ...]] | None = None
    for gone in itertools.combinations(range(len(long)), len(long) - len(short)):
        kept = [x for i, x in enumerate(long) if i not in gone]
        unequal = sum(x != y for x, y in zip(kept, short))
        if best is None or unequal < best[0] or (unequal == best[0] and gone > best[1]):
            best = (unequal, gone)
    assert best is not None
    return best[1], best[0]


def why_axes(a: tuple[int, ...], e: tuple[int, ...], dims: list[str], cfg: Config | None) -> str:
    """An axis missing or one too many: the axes named, after aligning the answer to the shape."""
    if len(a) < len(e):
        gone, unequal = aligned(a, e)
        rest = tuple(x for i, x in enumerate(e) if i not in gone)
        if unequal and len(gone) > 1:  # no telling which axes were meant
            return axis_count(a, e, dims)
        what = " and ".join(axis(dims, i) for i in gone)
        verb = "is" if len(gone) == 1 else "are"
        if gone == (0,) and e[0] == 1 and (dims[:1] in (["B"], [])):
            reason = "stepper keeps the batch axis: B = 1 comes first, even for one sequence"
        elif all(e[i] == 1 for i in gone):
            reason = f"an axis of size 1 is still an axis: {what} {verb} missing; {layout(e, dims)}"
        else:
            reason = f"{what} {verb} missing; {layout(e, dims)}"
        kept_dims = [d for i, d in enumerate(dims) if i not in gone]
        sizes = why_sizes(a, rest, kept_dims, cfg) if a != rest else ""
        return reason + (f"; and {sizes}" if sizes else "")
    extra, unequal = aligned(e, a)
    rest = tuple(x for i, x in enumerate(a) if i not in extra)
    if unequal and len(extra) > 1:
        return axis_count(a, e, dims)
    where = []
    for i in extra:
        before = i - sum(j < i for j in extra)  # how many of the shape's axes come before it
        place = f"after {axis(dims, before - 1)}" if before else "in front"
        where.append(f"the {a[i]} {place}")
    reason = (f"{'one axis' if len(extra) == 1 else f'{len(extra)} axes'} too many: {layout(e, dims)}, "
              f"with nothing for {' or '.join(where)}")
    sizes = why_sizes(rest, e, dims, cfg) if rest != e else ""
    return reason + (f"; and {sizes}" if sizes else "")


def why_order(a: tuple[int, ...], e: tuple[int, ...], dims: list[str]) -> str:
    """The right sizes in another order: which axis comes first, by name (not by size)."""
    wrong = [i for i, (x, y) in enumerate(zip(a, e)) if x != y]
    if len(wrong) == 2 and dims:
        i, j = wrong
        return f"the right sizes in the wrong order: {axis(dims, i)} comes before {axis(dims, j)}"
    return f"the right sizes in the wrong order; {layout(e, dims)}" if dims else "the right sizes in the wrong order"


def why_sizes(a: tuple[int, ...], e: tuple[int, ...], dims: list[str], cfg: Config | None) -> str:
    """Axis by axis, each size that differs: what the axis is and where its size comes from (a
    config field, the run), not the size itself."""
    reasons = []
    for i, (x, y) in enumerate(zip(a, e)):
        if x != y:
            reasons.append(f"{axis(dims, i)} is not {x}{size_hint(dims[i] if dims else None, x, y, cfg)}")
    return "; ".join(reasons)


def size_hint(symbol: str | None, wrote: int, size: int, cfg: Config | None) -> str:
    """Where an axis's size comes from: ' (Kimi K2's full-size kv_lora_rank, ...): it is
    kv_lora_rank', ': a decode step runs one new token', ': it is a size of this run'."""
    formula = dim_size_name(symbol) if symbol else None
    if symbol is not None and formula is None:  # B, T, S, N: sizes of the run, not of the config
        if symbol == "T" and size == 1:
            return ": a decode step runs one new token"
        if symbol == "S":
            return ": every position attended to, cached ones included"
        return ": it is a size of this run, not of the config"
    if formula == "1":
        return ""
    written = field_names(wrote, cfg, formula)
    if formula:
        return f"{written}: it is {formula}"
    fields = config_fields(size, cfg)
    return f"{written}: it is {' or '.join(fields)}" if fields else written


def telling_factor(n: int) -> bool:
    """Factors worth naming: small ones (a head count, 4 bytes a number), powers of 2 and of 10."""
    return 2 <= n <= 16 or (n & (n - 1) == 0) or str(n).rstrip("0") == "1"


def why_number(a: float, e: float) -> str:
    if e != 0 and math.isclose(a, -e, rel_tol=0.02):
        return "right size, wrong sign"
    if e != 0 and a != 0 and (a > 0) == (e > 0):
        ratio = a / e
        for r, word in ((ratio, "times"), (1 / ratio, "a")):
            n = round(r)
            if n >= 2 and telling_factor(n) and math.isclose(r, n, rel_tol=0.02):
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
