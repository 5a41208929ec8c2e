"""Checking a lesson's text without running it: the names it mentions, and its placeholders.

`tests/cli/test_lessons.py` runs both over every lesson: every mentioned tensor or weight must be
catalogued or a weight of the lesson's model, and every placeholder must parse.
"""

from __future__ import annotations

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
    qualified,
    split_spec,
    tensor_name_split,
)
from stepper.presets import preset
from stepper.session import prepare
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
            body, _ = split_spec(expr)
            fact = FACT.fullmatch(body.strip())
            try:
                if fact:
                    if fact.group(1) not in facts.FACTS:
                        raise StepperError(f"unknown fact '{fact.group(1)}'")
                    if fact.group(4) and fact.group(4) not in ATTRIBUTES:
                        raise StepperError(f"unknown attribute '.{fact.group(4)}'")
                elif body.startswith("config."):
                    config_value(preset("tiny"), body[len("config."):])
                elif body.startswith("preset."):
                    name, _, path = body[len("preset."):].partition(".")
                    config_value(preset(name), path)
                elif body.startswith("run."):
                    if body[len("run."):] not in RUN_FIELDS:
                        raise StepperError(f"no run field '{body}'")
                else:
                    _, _, attr = tensor_name_split(body.strip())
                    if attr is not None and attr not in ATTRIBUTES:
                        raise StepperError(f"unknown attribute '.{attr}'")
            except (StepperError, KeyError) as e:
                errors.append(f"{{{expr}}}: {e}")
    return errors
