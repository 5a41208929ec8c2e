"""Checking a lesson's text without running it: the names it mentions, its placeholders, and
the token or head each quoted value is computed on.

`tests/cli/test_lessons.py` runs these over every lesson: every mentioned tensor or weight must
be catalogued or a weight of the lesson's model, every placeholder must parse, and a sentence
about one token (head, row) quotes only values computed on that token (head, row).
"""

from __future__ import annotations

import inspect
import re

from stepper import catalog
from stepper.errors import StepperError
from stepper.lessons import facts
from stepper.lessons.schema import Lesson
from stepper.lessons.templates import (
    ATTRIBUTES,
    FACT,
    RUN_FIELDS,
    SCOPE_ARG,
    config_value,
    placeholders,
    preset_value,
    qualified,
    split_spec,
    tensor_name_split,
)
from stepper.presets import PRESETS, V4_PRESETS
from stepper.session import prepare, preset_config
from stepper.weights.names import layer_shapes, shape_of


def mentioned_names(lesson: Lesson) -> list[str]:
    """Every tensor or weight name the lesson mentions: stops, template names, debugger commands,
    `backticked` names in the text and prediction tensors."""
    names = [step.stop for step in lesson.steps]
    texts = [lesson.intro, lesson.outro, *lesson.exercise.hints]
    for step in lesson.steps:
        texts += [step.text, step.explain]
        for pred in step.predict:
            texts += [pred.question, *pred.option_why, *(w.why for w in pred.wrong)]
            texts += [a for a in (pred.answer, *(w.answer for w in pred.wrong)) if isinstance(a, str)]
            names += [pred.tensor] if pred.tensor else []
        for command in step.commands:
            names += command_names(command)
    for text in texts:
        names += re.findall(r"`([a-z0-9_.]+)`", text)
        for expr in placeholders(text):
            body, _ = split_spec(expr)
            if not body.startswith(("fact.", "config.", "preset.", "run.")):
                try:
                    names.append(tensor_name_split(body.strip())[0])
                except StepperError:
                    names.append(re.split(r"[\[.]", body.strip())[0] + "?")  # not a catalogued name
        for fact in FACT.finditer(text):
            args = [a.strip() for a in (fact.group(2) or "").split(",")]
            names += [a for a in args if "." in a and not SCOPE_ARG.fullmatch(a)]
    return [n for n in names if n.endswith("?") or looks_like_tensor(n)]


def command_names(command: str) -> list[str]:
    word, _, rest = command.partition(" ")
    args = rest.split()
    if word in ("s", "show"):
        args = args[1:]
    names = [a.split("[")[0] for a in args if not a.isdigit()]
    return names


def looks_like_tensor(name: str) -> bool:
    return bool(re.fullmatch(r"(?:(?:prefill|decode\d+)\.)?(?:layers\.\d+\.)?[a-z_]+(?:\.[a-z_0-9]+)*", name)) and (
        "." in name or name in catalog.load().names()
    )


def unknown_names(lesson: Lesson) -> list[str]:
    """Mentioned names that are neither catalogued tensors nor weights of the lesson's model."""
    cfg = prepare(lesson.run).config
    known = set(catalog.load().names())
    weights = set(layer_shapes(cfg, 0)) | set(layer_shapes(cfg, min(1, cfg.num_hidden_layers - 1)))
    bad = []
    for name in dict.fromkeys(mentioned_names(lesson)):
        if name.startswith(("model.", "lm_head")):
            try:
                shape_of(cfg, name.removesuffix("_scale_inv"))
            except StepperError:
                bad.append(name)
        elif name.endswith((".weight", ".weight_scale_inv", "e_score_correction_bias")):
            if not any(w.endswith("." + name.removesuffix("_scale_inv")) for w in weights):
                bad.append(name)
        elif catalog.key_of(name) not in known or not qualified(name):
            bad.append(name)
    return bad


def template_errors(lesson: Lesson) -> list[str]:
    """Placeholders that cannot be parsed (unknown fact, attribute, config field, tensor name)."""
    errors = []
    texts = [lesson.intro, lesson.outro]
    for step in lesson.steps:
        texts += [step.text, step.explain]
        for pred in step.predict:
            texts += [pred.question, *pred.option_why, *(w.why for w in pred.wrong)]
            texts += [a for a in (pred.answer, *(w.answer for w in pred.wrong)) if isinstance(a, str)]
    for text in texts:
        try:
            found = placeholders(text)
        except StepperError as e:
            errors.append(str(e))
            continue
        for expr in found:
            try:
                check_placeholder(split_spec(expr)[0], lesson.run.model)
            except (StepperError, KeyError) as e:
                errors.append(f"{{{expr}}}: {e}")
    return errors


def check_placeholder(body: str, model: str = "tiny") -> None:
    """Raise when a placeholder's body (its format spec taken off) names nothing a lesson can show;
    a config field is looked up in the lesson's own model (a preset)."""
    fact = FACT.fullmatch(body.strip())
    if fact:
        if fact.group(1) not in facts.FACTS:
            raise StepperError(f"unknown fact '{fact.group(1)}'")
        if fact.group(4) and fact.group(4) not in ATTRIBUTES:
            raise StepperError(f"unknown attribute '.{fact.group(4)}'")
    elif body.startswith("config."):
        config_value(preset_config(model if model in PRESETS or model in V4_PRESETS else "tiny"),
                     body[len("config."):])
    elif body.startswith("preset."):
        preset_value(body[len("preset."):])
    elif body.startswith("run."):
        if body[len("run."):] not in RUN_FIELDS:
            raise StepperError(f"no run field '{body}'")
    else:
        _, _, attr = tensor_name_split(body.strip())
        if attr is not None and attr not in ATTRIBUTES:
            raise StepperError(f"unknown attribute '.{attr}'")


# ---------------------------------------------------------------------------------------------
# Facts about one token or head, computed on that token or head

SUBJECT = re.compile(r"\b(token|head|row)\s+(\d+|\{fact\.telling_token[^}]*\})", re.IGNORECASE)
LAST = re.compile(r"\blast\s+(?:position|token)\b", re.IGNORECASE)  # index -1 on the token axis
SUBJECT_AXES = {"token": ("T", "N"), "head": ("H",), "row": ("T",)}  # the axes each word picks
FACT_PARAMETER = {"token": "token", "head": "head", "row": "token"}
LAYOUT_ATTRIBUTES = {"shape", "ndim", "size", "dtype", "nbytes"}  # about the tensor, not its values


def lesson_texts(lesson: Lesson) -> list[tuple[str, list[str]]]:
    """Each text of a lesson, with the answer templates its subjects also govern (a question's)."""
    texts: list[tuple[str, list[str]]] = [(lesson.intro, []), (lesson.outro, [])]
    for step in lesson.steps:
        texts += [(step.text, []), (step.explain, [])]
        for pred in step.predict:
            answer = [pred.answer] if isinstance(pred.answer, str) else []
            texts.append((pred.question, answer))
            texts += [(t, []) for t in (*pred.option_why, *(w.why for w in pred.wrong))]
    return texts


def sentences(text: str) -> list[str]:
    """The text cut at sentence ends (. ! ? then a space or the end, outside placeholders) and
    at blank lines."""
    out, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += (c == "{") - (c == "}")
        end = c in ".!?" and (i + 1 == len(text) or text[i + 1].isspace())
        if depth == 0 and (end or text.startswith("\n\n", i)):
            out.append(text[start : i + 1])
            start = i + 1
    return [*out, text[start:]]


def subjects_in(sentence: str) -> list[tuple[int, str, str]]:
    """(offset, kind, value) of each 'token 0', 'head 2', 'row 3', 'token {fact.telling_token(...)}',
    'the last position' (token -1)."""
    found = [(m.start(), "token", "-1") for m in LAST.finditer(sentence)]
    for m in SUBJECT.finditer(sentence):
        value = "telling" if m.group(2).startswith("{") else m.group(2)
        found.append((m.start(), m.group(1).lower(), value))
    return sorted(found)


def subject_errors(lesson: Lesson) -> tuple[int, list[str]]:
    """(how many quoted values were checked, the problems): in a sentence about token 0 (or
    head 2, or row 3, or the telling token), every tensor value it quotes must be indexed on that
    token's axis at 0, and every fact with a token (head) argument must be given that token."""
    checked, problems = 0, []
    for text, governed in lesson_texts(lesson):
        whole = subjects_in(text)
        for sentence in sentences(text):
            mentions = subjects_in(sentence)
            for offset, expr in placeholder_offsets(sentence):
                subjects = nearest(mentions, offset)
                n, found = check_subjects(expr, subjects)
                checked, problems = (checked + n, problems
                                     + [f"{lesson.name}: '{sentence.strip()[:90]}': {p}" for p in found])
        for expr in (e for answer in governed for e in placeholders(answer)):
            n, found = check_subjects(expr, nearest(whole, len(text)))
            checked, problems = checked + n, problems + [f"{lesson.name}: the answer to '{text.strip()[:60]}': "
                                                         f"{p}" for p in found]
    return checked, problems


def placeholder_offsets(sentence: str) -> list[tuple[int, str]]:
    found, i = [], 0
    while i < len(sentence):
        if sentence.startswith(("{{", "}}"), i):
            i += 2
        elif sentence[i] == "{" and "}" in sentence[i:]:
            end = sentence.index("}", i)
            found.append((i, split_spec(sentence[i + 1 : end])[0].strip()))
            i = end + 1
        else:
            i += 1
    return found


def nearest(mentions: list[tuple[int, str, str]], offset: int) -> dict[str, str]:
    """Per kind, the subject the placeholder at `offset` speaks of: the last mention before it,
    else the first after it in the same sentence."""
    chosen: dict[str, str] = {}
    for _, kind, value in reversed([m for m in mentions if m[0] > offset]):
        chosen[kind] = value  # the first after it, unless...
    for _, kind, value in (m for m in mentions if m[0] <= offset):
        chosen[kind] = value  # ...one comes before it: the last of those
    return chosen


def check_subjects(expr: str, subjects: dict[str, str]) -> tuple[int, list[str]]:
    if not subjects or expr.startswith(("config.", "preset.", "run.", "fact.telling_token")):
        return 0, []
    fact = FACT.fullmatch(expr)
    if fact:
        return check_fact(expr, fact, subjects)
    try:
        name, index, attr = tensor_name_split(expr)
    except StepperError:
        return 0, []
    entry = catalog.load().entry(catalog.key_of(name))
    if entry is None or attr in LAYOUT_ATTRIBUTES:
        return 0, []
    dims = entry["dims"]
    entries = [e.strip() for e in index[1:-1].split(",")] if index else []
    checked, problems = 0, []
    for kind, value in subjects.items():
        axis = next((i for i, d in enumerate(dims) if d in SUBJECT_AXES[kind]), None)
        if axis is None or (kind == "row" and "S" not in dims):
            continue
        checked += 1
        given = entries[axis] if axis < len(entries) and "..." not in entries else None
        if given != value:
            on = "the whole tensor" if given is None or ":" in (given or "") else f"{kind} {given}"
            problems.append(f"{{{expr}}} is computed on {on}, not on {kind} {value} (axis {dims[axis]})")
    return checked, problems


def check_fact(expr: str, fact: re.Match, subjects: dict[str, str]) -> tuple[int, list[str]]:
    func = facts.FACTS.get(fact.group(1))
    if func is None:
        return 0, []
    args = [a.strip() for a in (fact.group(2) or "").split(",") if a.strip()]
    try:
        bound = inspect.signature(func).bind(None, *args)
    except TypeError:
        return 0, []
    bound.apply_defaults()
    checked, problems = 0, []
    for kind, value in subjects.items():
        parameter = FACT_PARAMETER[kind]
        if parameter in bound.arguments:
            checked += 1
            if str(bound.arguments[parameter]) != value:
                problems.append(f"{{{expr}}} is computed for {parameter} {bound.arguments[parameter]}, not {kind} "
                                f"{value}")
    return checked, problems
