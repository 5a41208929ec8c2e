"""Judging a prediction: the expected answer from the run, the learner's answer against it, why not.

`stepper.lessons.answers` reads answers and explains generic mistakes; this module adds what the
lesson itself says: its expected value (a template filled from the run), the explanation of each
option of a choice, and its `wrong` answers.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from stepper import catalog
from stepper.errors import StepperError
from stepper.lessons import answers
from stepper.lessons.context import Context
from stepper.lessons.schema import Prediction
from stepper.lessons.templates import fmt, render, value_of


def expected_value(pred: Prediction, ctx: Context) -> Any:
    value = value_of(pred.answer, ctx)
    if pred.kind == "choice":
        index = answers.parse("choice", str(value), pred.options)
        if index is None:
            raise StepperError(f"prediction '{pred.question[:40]}': answer {value!r} is not one of its options")
        return index
    if isinstance(value, str):
        parsed = answers.parse(pred.kind, value)
        if parsed is None:
            raise StepperError(f"prediction '{pred.question[:40]}': cannot read the answer {value!r}")
        return parsed
    value = value.tolist() if isinstance(value, (np.ndarray, np.generic)) else value
    items = value if isinstance(value, (list, tuple)) else [value]
    whole = all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in items)
    if pred.kind == "shape" and isinstance(value, (list, tuple)) and whole:
        return tuple(value)
    if pred.kind == "set" and whole:
        return frozenset(items)
    if pred.kind == "number" and isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    raise StepperError(f"prediction '{pred.question[:40]}': the answer {value!r} is not a {pred.kind}")


def judge(pred: Prediction, text: str, ctx: Context, stop_key: str | None) -> answers.Verdict:
    kind = pred.kind
    answer, unreadable = answers.read(kind, text, pred.options)
    if answer is None:
        return answers.Verdict(False, f"I could not read that: {unreadable}", False)
    expected = expected_value(pred, ctx)
    if answers.same(kind, answer, expected, pred.tolerance, pred.atol):
        return answers.Verdict(True)
    ctx.answer = answer
    try:
        if kind == "choice" and pred.option_why[answer]:
            return answers.Verdict(False, render(pred.option_why[answer], ctx))
        for wrong in pred.wrong:
            if wrong.answer == "*":
                return answers.Verdict(False, render(wrong.why, ctx))
            value = value_of(wrong.answer, ctx)
            parsed = answers.parse(kind, value, pred.options) if isinstance(value, str) else value
            if parsed is not None and answers.same(kind, answer, parsed if kind != "shape" else tuple(parsed),
                                                          pred.tolerance, pred.atol):
                return answers.Verdict(False, render(wrong.why, ctx))
    finally:
        ctx.answer = None
    key = stop_key if pred.tensor is None else (catalog.key_of(pred.tensor) if pred.tensor else None)
    entry = catalog.load().entry(key) if key else None
    dims = entry["dims"] if entry else ()
    return answers.Verdict(False, answers.why_wrong(kind, answer, expected, dims=dims, cfg=ctx.cfg,
                                                                  options=pred.options))


def show_answer(pred: Prediction, expected: Any) -> str:
    if pred.kind == "choice":
        return pred.options[expected]
    if pred.kind == "shape":
        return "[" + ", ".join(map(str, expected)) + "]"
    if pred.kind == "set":
        return "{" + ", ".join(map(str, sorted(expected))) + "}"
    value = float(expected)
    return str(int(value)) if value.is_integer() and abs(value) < 1e12 else fmt(value)  # 139264, not 1.393e+05
