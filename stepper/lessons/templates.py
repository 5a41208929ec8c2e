"""Lesson text templates: `{...}` placeholders filled from a run, without `eval`.

A placeholder is `{EXPR}` or `{EXPR:FORMAT}` (a Python format spec); `{{` and `}}` are literal
braces. EXPR is a tensor emitted so far with an optional NumPy-style index and one attribute
(`{layers.1.self_attn.compressed_kv.shape}`, `{layers.0.input_layernorm[0, 0].rms:.3f}`), a
config field (`{config.kv_lora_rank}`), another preset's (`{preset.kimi-k2.kv_lora_rank}`), the
run (`{run.prompt}`), or a named fact from `stepper.lessons.facts` (`{fact.cache_ratio(kimi-k2)}`).
Indices are parsed by the debugger's safe index parser; names must be catalogued.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from stepper import catalog, untrusted
from stepper.config import Config
from stepper.errors import StepperError
from stepper.lessons import facts
from stepper.lessons.context import Context
from stepper.presets import PRESETS, V4_PRESETS
from stepper.session import preset_config
from stepper.views.debugger import take


def tensor_name_split(expr: str) -> tuple[str, str | None, str | None]:
    """'layers.1.mlp.gate.topk_idx[0].tolist' -> (name, '[0]', 'tolist'); the name is the longest
    dotted prefix whose catalogue key exists."""
    index = None
    if "[" in expr:
        start = expr.index("[")
        end = expr.find("]", start)
        if end < 0:
            raise StepperError(f"'{expr}': unclosed [")
        head, index, tail = expr[:start], expr[start : end + 1], expr[end + 1 :]
        if tail and not re.fullmatch(r"\.[a-z_]+", tail):
            raise StepperError(f"'{expr}': after the index comes at most one .attribute")
        if not is_tensor_name(head):
            raise StepperError(f"'{head}' is not a catalogued tensor name")
        return head, index, tail[1:] or None
    parts = expr.split(".")
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        if is_tensor_name(name):
            rest = parts[cut:]
            if len(rest) > 1:
                raise StepperError(f"'{expr}': at most one .attribute after a tensor name")
            return name, None, rest[0] if rest else None
    raise StepperError(f"'{expr}' names no catalogued tensor")


def is_tensor_name(name: str) -> bool:
    return bool(name) and re.fullmatch(r"[a-z0-9_.]+", name) is not None and catalog.key_of(name) in set(
        catalog.load().names()
    ) and name == qualified(name)


def qualified(name: str) -> str:
    """Names are phase.layers.N.key / layers.N.key / key; reject odd forms like 'layers.x.key'."""
    m = re.fullmatch(r"(?:(?:prefill|decode\d+)\.)?(?:layers\.\d+\.)?([a-z_.]+)", name)
    return name if m else ""


def finite(a: np.ndarray) -> np.ndarray:
    values = np.asarray(a, dtype=np.float64).ravel()
    return values[np.isfinite(values)]


ATTRIBUTES = {
    "shape": lambda a: list(a.shape),
    "ndim": lambda a: a.ndim,
    "size": lambda a: int(a.size),
    "dtype": lambda a: str(a.dtype),
    "nbytes": lambda a: int(a.nbytes),
    "min": lambda a: float(finite(a).min()),
    "max": lambda a: float(finite(a).max()),
    "mean": lambda a: float(finite(a).mean()),
    "std": lambda a: float(finite(a).std()),
    "sum": lambda a: float(finite(a).sum()),
    "absmax": lambda a: float(np.abs(finite(a)).max()),
    "rms": lambda a: float(np.sqrt(np.mean(np.square(finite(a))))),
    "norm": lambda a: float(np.sqrt(np.sum(np.square(finite(a))))),
    "argmax": lambda a: int(np.argmax(a)),
    "argmin": lambda a: int(np.argmin(a)),
    "tolist": lambda a: a.tolist(),
    "sorted": lambda a: sorted(a.ravel().tolist()),
    "value": lambda a: a.item(),
    "ninf": lambda a: int(np.isinf(a).sum()),
    "nnan": lambda a: int(np.isnan(a).sum()),
    "nonzero": lambda a: int(np.count_nonzero(a)),
}

SCOPE_ARG = re.compile(r"(?:(?:prefill|decode\d+)\.)?layers\.\d+|decode\d+|prefill")  # a fact's scope argument
FACT = re.compile(r"fact\.([a-z_0-9]+)(?:\(([^()]*)\))?(\[[^\]]*\])?(?:\.([a-z_]+))?")


def attribute(value: Any, index: str | None, attr: str | None) -> Any:
    if index is None and attr is None:
        return value
    array = np.asarray(value)
    if index is not None:
        array = np.asarray(take(array, index))
    if attr is None:
        return array.item() if array.ndim == 0 else array.tolist()
    if attr not in ATTRIBUTES:
        raise StepperError(f"unknown attribute '.{attr}' (known: {', '.join(ATTRIBUTES)})")
    return ATTRIBUTES[attr](array)


def config_value(cfg: Config, path: str) -> Any:
    value: Any = cfg
    for part in path.split("."):
        names = {f.name for f in dataclasses.fields(value)} | ({"qk_head_dim"} if isinstance(value, Config) else set())
        if not dataclasses.is_dataclass(value) or part not in names:
            raise StepperError(f"no config field '{path}'")
        value = getattr(value, part)
    return list(value) if isinstance(value, tuple) else value


RUN_FIELDS = ("model", "prompt", "T", "start_pos", "end_pos", "decode", "seed", "attn", "generated")


def run_value(ctx: Context, name: str) -> Any:
    spec = ctx.spec
    prompt = list(ctx.plan.prompt)
    values = {
        "model": spec.model, "prompt": prompt, "T": len(prompt), "start_pos": spec.start_pos,
        "end_pos": spec.start_pos + len(prompt) - 1, "decode": spec.decode, "seed": spec.seed, "attn": spec.attn,
    }
    if name == "generated":
        if ctx.result is None:
            raise StepperError("run.generated is known only at the end of the run (use it in the outro)")
        return list(ctx.result.generated)
    if name not in values:
        raise StepperError(f"no run field '{name}' (known: {', '.join(RUN_FIELDS)})")
    return values[name]


def preset_value(path: str) -> Any:
    """'deepseek-v3.2.index_topk' -> that preset's field: the longest preset name before a dot
    (a preset's name may hold one)."""
    names = [n for n in (*PRESETS, *V4_PRESETS) if path.startswith(n + ".")]
    if not names:
        raise StepperError(f"no preset in 'preset.{path}' (presets: {', '.join([*PRESETS, *V4_PRESETS])})")
    name = max(names, key=len)
    return config_value(preset_config(name), path[len(name) + 1:])


def evaluate(expr: str, ctx: Context) -> Any:
    """The value of one placeholder's expression (no format spec)."""
    expr = expr.strip()
    fact = FACT.fullmatch(expr)
    if fact:
        name, args, index, attr = fact.groups()
        args_list = [a.strip() for a in args.split(",")] if args and args.strip() else []
        return attribute(facts.compute(name, ctx, args_list), index, attr)
    if expr.startswith("config."):
        return config_value(ctx.cfg, expr[len("config."):])
    if expr.startswith("preset."):
        return preset_value(expr[len("preset."):])
    if expr.startswith("run."):
        return run_value(ctx, expr[len("run."):])
    name, index, attr = tensor_name_split(expr)
    return attribute(ctx.tensor(name), index, attr)


def split_spec(body: str) -> tuple[str, str]:
    """'x[0, :4].rms:.3f' -> ('x[0, :4].rms', '.3f'): the last ':' outside brackets and parentheses."""
    depth, cut = 0, -1
    for i, c in enumerate(body):
        if c in "[(":
            depth += 1
        elif c in "])":
            depth -= 1
        elif c == ":" and depth == 0:
            cut = i
    return (body, "") if cut < 0 else (body[:cut], body[cut + 1 :])


def placeholders(text: str) -> list[str]:
    """The expressions inside `{...}` (format specs included), `{{`/`}}` skipped."""
    found, i = [], 0
    while i < len(text):
        if text.startswith(("{{", "}}"), i):
            i += 2
        elif text[i] == "{":
            end = text.find("}", i)
            if end < 0:
                raise StepperError(f"unclosed {{ in {text[i:i + 40]!r}")
            found.append(text[i + 1 : end])
            i = end + 1
        else:
            i += 1
    return found


MAX_SPEC_NUMBER = 100  # a width or precision in a format spec: {x:99999999} would make a string that long


def fmt(value: Any, spec: str = "") -> str:
    if any(int(n) > MAX_SPEC_NUMBER for n in re.findall(r"\d+", spec)):
        raise StepperError(f"format spec ':{untrusted.cut(spec, 20)}' has a width or precision past {MAX_SPEC_NUMBER}")
    if isinstance(value, (np.generic, np.ndarray)):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(fmt(v, spec) for v in value) + "]"
    if spec:
        return format(value, spec)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def render(text: str, ctx: Context) -> str:
    out, i = [], 0
    while i < len(text):
        if text.startswith("{{", i) or text.startswith("}}", i):
            out.append(text[i])
            i += 2
        elif text[i] == "{":
            end = text.find("}", i)
            if end < 0:
                raise StepperError(f"unclosed {{ in {text[i:i + 40]!r}")
            expr, spec = split_spec(text[i + 1 : end])
            try:
                out.append(fmt(evaluate(expr, ctx), spec))
            except StepperError as e:
                raise StepperError(f"template {{{text[i + 1:end]}}}: {e}") from None
            except Exception as e:  # noqa: BLE001 - a lesson's template must never crash the walk with a traceback
                raise StepperError(f"template {{{text[i + 1:end]}}}: {type(e).__name__}: {e}") from None
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def value_of(template: Any, ctx: Context) -> Any:
    """A prediction's expected answer: one placeholder's raw value, or a literal."""
    if isinstance(template, str):
        found = placeholders(template)
        if len(found) == 1 and template.strip() == "{" + found[0] + "}":
            expr, _ = split_spec(found[0])
            return evaluate(expr, ctx)
        return render(template, ctx)
    return template
