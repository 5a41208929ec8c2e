"""Guided lessons: content read from `lessons/`, walked through with the step debugger.

A lesson is a folder `NN-name/` (lessons/README.md documents the format): `lesson.toml` with the
run to step through and the steps, `exercise.py` (the stub the learner fills in) and
`solution.py`. Walking a lesson runs the interpreter with a `LessonDebugger` sink that stops at
each step's tensor, asks the step's predictions before showing it, shows it with the debugger's
view, explains it with text filled in from the run's real tensors, then hands over to the
debugger's prompt until the learner moves on.

Texts are templates filled from the run's real tensors (`stepper.lesson_templates`), with
computed facts from `stepper.lesson_facts`; answers are read and judged by `stepper.lesson_answers`;
exercises are checked by `stepper.lesson_check`.

The learner's files live in a workspace (default `./stepper-lessons/`, one `NAME.py` per lesson);
progress lives in the user's data directory ($STEPPER_DATA_DIR, else $XDG_DATA_HOME/stepper, else
~/.local/share/stepper), never in the repository.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from stepper import catalog
from stepper.errors import StepperError
from stepper.lessons import answers, facts
from stepper.lessons.templates import (
    ATTRIBUTES,
    FACT,
    RUN_FIELDS,
    SCOPE_ARG,
    Context,
    config_value,
    fmt,
    placeholders,
    qualified,
    render,
    split_spec,
    tensor_name_split,
    value_of,
)
from stepper.presets import preset
from stepper.session import Plan, RunSpec, execute, prepare
from stepper.trace import Event
from stepper.views.debugger import CommandSource, Debugger, Quit
from stepper.weights.names import layer_shapes, shape_of

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10: tomli if the user has it
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ModuleNotFoundError:
        tomllib = None  # type: ignore[assignment]

FOLDER = re.compile(r"^(\d{2})-([a-z0-9][a-z0-9-]*)$")
WORKSPACE = Path("stepper-lessons")
LESSON_FILE = "lesson.toml"
STUB_FILE = "exercise.py"
SOLUTION_FILE = "solution.py"


# ---------------------------------------------------------------------------------------------
# Where lessons are


def lessons_root() -> Path:
    """`lessons/` of a source checkout (editable installs too), else the copy shipped in the
    package as `stepper/lessons_data` (pyproject maps the one onto the other)."""
    env = os.environ.get("STEPPER_LESSONS_DIR")
    here = Path(__file__).resolve().parent
    candidates = [Path(env)] if env else [here.parent.parent / "lessons", here.parent / "lessons_data"]
    for root in candidates:
        if root.is_dir() and any(root.glob(f"*/{LESSON_FILE}")):
            return root
    raise StepperError(f"no lessons found (looked in {', '.join(map(str, candidates))})")


# ---------------------------------------------------------------------------------------------
# The format


@dataclass(frozen=True)
class Wrong:
    answer: Any  # a value of the prediction's kind, or "*" for any other wrong answer
    why: str


@dataclass(frozen=True)
class Prediction:
    question: str
    kind: str  # shape | number | set | choice
    answer: Any  # a template ("{layers.1.self_attn.kv.shape}") or a literal value
    tolerance: float = 0.0
    atol: float = 0.0
    options: tuple[str, ...] = ()  # choice: the options, in order
    option_why: tuple[str, ...] = ()  # choice: why each option is wrong (when it is)
    wrong: tuple[Wrong, ...] = ()
    tensor: str | None = None  # the tensor a shape question is about (default: the step's stop)


@dataclass(frozen=True)
class Step:
    stop: str  # the full emitted name the walk stops at
    text: str = ""  # shown before the predictions
    predict: tuple[Prediction, ...] = ()
    explain: str = ""  # shown after the tensor
    commands: tuple[str, ...] = ()  # debugger commands run after the explanation (p, e, s, x, w, h)


@dataclass(frozen=True)
class Exercise:
    functions: tuple[str, ...]
    hints: tuple[str, ...]
    runs: tuple[RunSpec, ...]  # the runs the check compares, in order
    rtol: float = 1e-4  # tensor-relative tolerance of the run comparison


@dataclass(frozen=True)
class Lesson:
    number: int
    name: str
    folder: Path
    title: str
    summary: str
    intro: str
    outro: str
    run: RunSpec
    steps: tuple[Step, ...]
    exercise: Exercise

    @property
    def stub(self) -> Path:
        return self.folder / STUB_FILE

    @property
    def solution(self) -> Path:
        return self.folder / SOLUTION_FILE

    @property
    def label(self) -> str:
        return f"lesson {self.number} ({self.name})"


TOP_KEYS = {"title", "summary", "intro", "outro", "run", "exercise", "steps"}
RUN_KEYS = {"model", "layer", "layers", "ids", "prompt_len", "start_pos", "decode", "seed", "attn"}
EXERCISE_KEYS = {"functions", "hints", "runs", "rtol"}
STEP_KEYS = {"stop", "text", "predict", "explain", "commands"}
PREDICT_KEYS = {"question", "kind", "answer", "tolerance", "atol", "options", "wrong", "tensor"}
WRONG_KEYS = {"answer", "why"}
OPTION_KEYS = {"answer", "why"}
STOP_COMMANDS = {"p", "print", "e", "explain", "w", "where", "x", "compare", "h", "history", "s", "show"}


class Reader:
    """Typed access to one table of a lesson file; every problem names the file and the key."""

    def __init__(self, path: Path, where: str, table: Any, allowed: set[str]):
        self.path, self.where = path, where
        if not isinstance(table, dict):
            raise self.fail(f"must be a table, got {table!r}")
        unknown = sorted(set(table) - allowed)
        if unknown:
            raise self.fail(f"unknown key '{unknown[0]}' (allowed: {', '.join(sorted(allowed))})")
        self.table = table

    def fail(self, why: str) -> StepperError:
        return StepperError(f"{self.path}: {self.where}: {why}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        if key not in self.table:
            if default is ...:
                raise self.fail(f"'{key}' is missing")
            return default
        value = self.table[key]
        if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, float, (int, float))):
            raise self.fail(f"'{key}' has the wrong type: {value!r}")
        return value


def load_lesson(folder: Path) -> Lesson:
    match = FOLDER.match(folder.name)
    if not match:
        raise StepperError(f"{folder}: a lesson folder is named NN-name, like 02-rmsnorm")
    path = folder / LESSON_FILE
    if tomllib is None:  # pragma: no cover - Python 3.10 without tomli
        raise StepperError(f"{path}: lessons are TOML; they need Python 3.11+, or `pip install tomli` on 3.10")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise StepperError(f"{path}: cannot read it ({e})") from None
    except tomllib.TOMLDecodeError as e:
        raise StepperError(f"{path}: not valid TOML ({e})") from None
    top = Reader(path, "top level", raw, TOP_KEYS)
    run = run_spec(Reader(path, "[run]", top.get("run", dict), RUN_KEYS), RunSpec())
    ex = Reader(path, "[exercise]", top.get("exercise", dict), EXERCISE_KEYS)
    runs = tuple(run_spec(Reader(path, f"[exercise] runs[{i}]", r, RUN_KEYS), run)
                 for i, r in enumerate(ex.get("runs", list, [{}])))
    exercise = Exercise(
        functions=tuple(strings(ex, "functions")),
        hints=tuple(strings(ex, "hints")),
        runs=runs,
        rtol=float(ex.get("rtol", (int, float), 1e-4)),
    )
    steps = tuple(read_step(path, i, s) for i, s in enumerate(top.get("steps", list)))
    return Lesson(
        number=int(match.group(1)), name=match.group(2), folder=folder, title=top.get("title", str),
        summary=top.get("summary", str), intro=top.get("intro", str, ""), outro=top.get("outro", str, ""),
        run=run, steps=steps, exercise=exercise,
    )


def strings(reader: Reader, key: str) -> list[str]:
    values = reader.get(key, list)
    if not values or not all(isinstance(v, str) for v in values):
        raise reader.fail(f"'{key}' must be a non-empty list of strings")
    return values


def run_spec(r: Reader, base: RunSpec) -> RunSpec:
    fields: dict[str, Any] = {}
    for key in ("model", "attn"):
        if key in r.table:
            fields[key] = r.get(key, str)
    for key in ("layer", "prompt_len", "start_pos", "decode", "seed"):
        if key in r.table:
            fields[key] = r.get(key, int)
    if "ids" in r.table:
        ids = r.get("ids", list)
        if not all(isinstance(i, int) for i in ids):
            raise r.fail("'ids' must be a list of token ids")
        fields["ids"] = tuple(ids)
    if "layers" in r.table:
        layers = r.get("layers", list)
        if len(layers) != 2 or not isinstance(layers[0], int):
            raise r.fail("'layers' must be [first, stop]")
        fields["layers"] = (layers[0], layers[1])
    return dataclasses.replace(base, **fields)


def read_step(path: Path, i: int, raw: Any) -> Step:
    r = Reader(path, f"steps[{i}]", raw, STEP_KEYS)
    predicts = r.get("predict", (list, dict), [])
    predicts = [predicts] if isinstance(predicts, dict) else predicts
    commands = r.get("commands", list, [])
    for command in commands:
        if not isinstance(command, str) or command.split(" ")[0] not in STOP_COMMANDS:
            raise r.fail(f"command {command!r}: only {', '.join(sorted(STOP_COMMANDS))} may run at a stop")
    return Step(
        stop=r.get("stop", str), text=r.get("text", str, ""), explain=r.get("explain", str, ""),
        predict=tuple(read_prediction(path, f"steps[{i}].predict[{j}]", p) for j, p in enumerate(predicts)),
        commands=tuple(commands),
    )


def read_prediction(path: Path, where: str, raw: Any) -> Prediction:
    r = Reader(path, where, raw, PREDICT_KEYS)
    kind = r.get("kind", str)
    if kind not in answers.KINDS:
        raise r.fail(f"kind must be one of {', '.join(answers.KINDS)}, got '{kind}'")
    options, option_why = (), ()
    if kind == "choice":
        items = [Reader(path, f"{where}.options[{k}]", o, OPTION_KEYS) for k, o in enumerate(r.get("options", list))]
        options = tuple(o.get("answer", str) for o in items)
        option_why = tuple(o.get("why", str, "") for o in items)
    wrong = tuple(
        Wrong(w.get("answer", (str, list, int, float)), w.get("why", str))
        for w in (Reader(path, f"{where}.wrong[{k}]", x, WRONG_KEYS) for k, x in enumerate(r.get("wrong", list, [])))
    )
    return Prediction(
        question=r.get("question", str), kind=kind, answer=r.get("answer", (str, list, int, float)),
        tolerance=float(r.get("tolerance", (int, float), 0.0)), atol=float(r.get("atol", (int, float), 0.0)),
        options=options, option_why=option_why, wrong=wrong, tensor=r.get("tensor", str, None),
    )


def all_lessons() -> list[Lesson]:
    root = lessons_root()
    folders = sorted(p for p in root.iterdir() if p.is_dir() and (p / LESSON_FILE).is_file())
    return [load_lesson(f) for f in folders]


def find_lesson(name: str, lessons: Sequence[Lesson] | None = None) -> Lesson:
    """A lesson by name (`rmsnorm`), number (`2`) or folder name (`02-rmsnorm`)."""
    lessons = all_lessons() if lessons is None else lessons
    key = name.strip().lower()
    for lesson in lessons:
        if key in (lesson.name, lesson.folder.name) or (key.isdigit() and int(key) == lesson.number):
            return lesson
    raise StepperError(f"no lesson '{name}' (lessons: {', '.join(l.name for l in lessons)}; `stepper lesson list`)")


# ---------------------------------------------------------------------------------------------
# Judging an answer


def expected_value(pred: Prediction, ctx: Context) -> Any:
    value = value_of(pred.answer, ctx)
    if pred.kind == "choice":
        index = answers.parse_choice(str(value), pred.options)
        if index is None:
            raise StepperError(f"prediction '{pred.question[:40]}': answer {value!r} is not one of its options")
        return index
    if isinstance(value, str):
        parsed = answers.parse(pred.kind, value)
        if parsed is None:
            raise StepperError(f"prediction '{pred.question[:40]}': cannot read the answer {value!r}")
        return parsed
    if pred.kind == "shape":
        return tuple(value)
    if pred.kind == "set":
        return frozenset(value if isinstance(value, (list, tuple)) else [value])
    return float(value)


def judge(pred: Prediction, text: str, ctx: Context, stop_key: str | None) -> answers.Verdict:
    kind = pred.kind
    answer = answers.parse(kind, text, pred.options)
    if answer is None:
        return answers.Verdict(False, f"I could not read that: {answers.HOW_TO_WRITE[kind]}", False)
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
    return fmt(float(expected))


# ---------------------------------------------------------------------------------------------
# Checking a lesson's content without running it


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


# ---------------------------------------------------------------------------------------------
# Progress, in the user's data directory


def data_dir() -> Path:
    if os.environ.get("STEPPER_DATA_DIR"):
        return Path(os.environ["STEPPER_DATA_DIR"])
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "stepper"


class Progress:
    """progress.json: per lesson whether it was walked, passed, given up, hints shown, predictions."""

    def __init__(self, path: Path | None = None):
        self.path = path or data_dir() / "progress.json"
        self.data: dict[str, Any] = {"version": 1, "current": None, "lessons": {}}
        if self.path.exists():
            try:
                loaded = json.loads(self.path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise StepperError(f"progress file {self.path} is unreadable ({e}): fix or delete it") from None
            if not isinstance(loaded, dict) or not isinstance(loaded.get("lessons"), dict):
                raise StepperError(f"progress file {self.path} is not stepper's progress: fix or delete it")
            self.data.update(loaded)

    def lesson(self, name: str) -> dict[str, Any]:
        entry = self.data["lessons"].setdefault(name, {})
        for key, default in (("walked", False), ("passed", False), ("gave_up", False), ("hints", 0),
                             ("right", 0), ("asked", 0)):
            entry.setdefault(key, default)
        return entry

    @property
    def current(self) -> str | None:
        return self.data.get("current")

    @current.setter
    def current(self, name: str) -> None:
        self.data["current"] = name

    def save(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as e:
            raise StepperError(f"cannot write progress file {self.path} ({e})") from None


def default_lesson(progress: Progress, lessons: Sequence[Lesson]) -> Lesson:
    """The lesson a command without NAME means: the current one, else the first not passed."""
    if progress.current:
        try:
            return find_lesson(progress.current, lessons)
        except StepperError:
            pass
    for lesson in lessons:
        if not progress.lesson(lesson.name)["passed"]:
            return lesson
    return lessons[-1]


# ---------------------------------------------------------------------------------------------
# The learner's workspace


@dataclass(frozen=True)
class Workspace:
    root: Path = WORKSPACE

    def file(self, lesson: Lesson) -> Path:
        return self.root / f"{lesson.name}.py"

    def ensure(self, lesson: Lesson) -> tuple[Path, bool]:
        """The learner's exercise file, copied from the stub if it does not exist yet (never overwritten)."""
        path = self.file(lesson)
        if path.exists():
            return path, False
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(lesson.stub, path)
        except OSError as e:
            raise StepperError(f"cannot create {path} ({e})") from None
        return path, True

    def existing(self, lesson: Lesson) -> Path:
        path = self.file(lesson)
        if not path.is_file():
            raise StepperError(f"no exercise file {path}: `stepper lesson start {lesson.name}` creates it"
                               + (f" (workspace {self.root})" if self.root != WORKSPACE else ""))
        return path

    def reset(self, lesson: Lesson) -> tuple[Path, Path | None]:
        """Put the stub back; an existing file is kept as NAME.py.bak."""
        path = self.file(lesson)
        backup = None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            if path.exists():
                backup = path.with_name(path.name + ".bak")
                shutil.copyfile(path, backup)
            shutil.copyfile(lesson.stub, path)
        except OSError as e:
            raise StepperError(f"cannot reset {path} ({e})") from None
        return path, backup


# ---------------------------------------------------------------------------------------------
# Walking a lesson


class LessonInput(CommandSource):
    """Debugger commands and predictions from one stream: a terminal, or a pipe line by line."""

    def ask(self, prompt: str) -> str | None:
        if self.script:
            return self._echo_as(prompt, self.script.pop(0))
        if self.interactive:
            try:
                return self.console.input(prompt)
            except EOFError:
                return None
        line = self.stdin.readline()
        return None if not line else self._echo_as(prompt, line.rstrip("\n"))

    def _echo_as(self, prompt: str, line: str) -> str:
        self.console.print(Text(prompt, style="bold") + Text(line))
        return line


ANSWER_PROMPT = "your prediction> "
LESSON_HELP = "Enter: next stop · n: next tensor · p NAME[i] · e explain · s attention|routing|hist · w where · q quit"


@dataclass
class LessonDebugger(Debugger):
    """The step debugger, stopping at a lesson's steps to ask, show and explain."""

    lesson: Lesson | None = None
    plan: Plan | None = None
    step_index: int = 0
    right: int = 0
    asked: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        self.stepping = False
        self.stops = 1  # the lesson prints its own help line

    def __call__(self, event: Event) -> None:
        self.history[event.name] = event
        self.current = event
        steps = self.lesson.steps
        if self.step_index < len(steps) and event.name == steps[self.step_index].stop:
            self.step_index += 1
            self.teach(steps[self.step_index - 1], event)
            self.repl()
        elif self.should_stop(event):
            self.show(event)
            self.repl()
        else:
            self.skipped += 1

    def execute(self, line: str) -> bool:
        if line.strip() in ("", "c", "continue"):
            self.stepping = False
            return True
        return super().execute(line)

    def context(self) -> Context:
        return Context(self.plan, {name: e.array for name, e in self.history.items()})

    def say(self, text: str, ctx: Context, style: str | None = None) -> None:
        say(self.console, text, ctx, style)

    def teach(self, step: Step, event: Event) -> None:
        if self.skipped:
            self.console.print(f"({self.skipped} tensors passed)", style="dim")
            self.skipped = 0
        ctx = self.context()
        n = len(self.lesson.steps)
        self.console.rule(f"step {self.step_index}/{n} · {self.breadcrumb(event)}", style="magenta", align="left")
        self.say(step.text, ctx)
        for pred in step.predict:
            self.predict(pred, ctx, event.key)
        self.console.print(self.breadcrumb(event), style="bold magenta")
        self.console.print(self.rows.render(event), soft_wrap=True)
        entry = self.catalog.entry(event.key)
        if entry:
            self.console.print(f"    {entry['description']}", style="italic")
        self.say(step.explain, ctx)
        for command in step.commands:
            self.console.print(Text("(stepper) ", style="dim") + Text(command, style="dim"))
            try:
                super().execute(command)
            except StepperError as e:
                self.console.print(f"{e}", style="red")
        self.console.print(Text(LESSON_HELP, style="dim"))

    def predict(self, pred: Prediction, ctx: Context, stop_key: str) -> None:
        expected = expected_value(pred, ctx)
        question = render(prose(pred.question), ctx)
        if pred.kind == "choice":
            question += "\n" + "   ".join(f"{chr(ord('a') + i)}) {o}" for i, o in enumerate(pred.options))
        self.console.print(styled("predict: " + question, "bold yellow"), soft_wrap=False)
        self.asked += 1
        tries = unreadable = 0
        while True:
            line = self.commands.ask(ANSWER_PROMPT)
            if line is not None and line.strip().lower() in ("q", "quit"):
                raise Quit
            if line is None or line.strip() in ("", "?", "skip"):
                break
            verdict = judge(pred, line, ctx, stop_key)
            if verdict.right:
                self.right += 1
                self.console.print(f"✓ right: {show_answer(pred, expected)}", style="bold green")
                return
            self.console.print(styled(f"✗ {verdict.why}", "red"), soft_wrap=False)
            tries += verdict.readable
            unreadable += not verdict.readable
            if tries >= 2 or unreadable >= 3:
                break
            self.console.print("try again, or press Enter to see the answer", style="dim")
        self.console.print(f"→ the answer: {show_answer(pred, expected)}", style="bold")


def say(console: Console, text: str, ctx: Context, style: str | None = None) -> None:
    """Print lesson text: prose paragraphs wrapped to the console, tables and formulas (indented
    lines, or multi-line facts) as they are."""
    for i, paragraph in enumerate(p for p in prose(text).split("\n\n") if p.strip()):
        rendered = render(paragraph, ctx)
        if i:
            console.print()
        verbatim = "\n" in rendered or paragraph.startswith(" ")
        console.print(styled(rendered, style), soft_wrap=verbatim)


def prose(text: str) -> str:
    """Join the lines of each paragraph so the console can wrap it to its width; paragraphs with
    an indented line (a table, code) keep their lines."""
    paragraphs = re.split(r"\n\s*\n", text.strip("\n"))
    out = []
    for paragraph in paragraphs:
        lines = paragraph.split("\n")
        if any(line.startswith(" ") for line in lines):
            out.append(paragraph)
        else:
            out.append(" ".join(line.strip() for line in lines))
    return "\n\n".join(out)


def styled(text: str, style: str | None = None) -> Text:
    """Lesson prose: `code` spans in cyan, the rest as written."""
    out = Text(style=style or "")
    for i, part in enumerate(re.split(r"(`[^`]*`)", text)):
        if i % 2:
            out.append(part, style="cyan")
        else:
            out.append(part)
    return out


@dataclass(frozen=True)
class Walked:
    finished: bool
    right: int
    asked: int


def walk(lesson: Lesson, console: Console, source: LessonInput) -> Walked:
    """Run the lesson's interpreter run, stopping at its steps; the outro at the end."""
    plan = prepare(lesson.run)
    debugger = LessonDebugger(console, plan.config, source, plan.weights, lesson=lesson, plan=plan)
    console.rule(f"lesson {lesson.number} · {lesson.title}", style="bold", align="left")
    say(console, lesson.intro, Context(plan))
    try:
        result = execute(plan, [debugger])
    except Quit:
        console.print(f"quit at step {debugger.step_index} of {len(lesson.steps)}; "
                      f"`stepper lesson start {lesson.name}` starts again", style="dim")
        return Walked(False, debugger.right, debugger.asked)
    if debugger.step_index < len(lesson.steps):
        missing = lesson.steps[debugger.step_index].stop
        raise StepperError(f"{lesson.folder / LESSON_FILE}: step {debugger.step_index + 1} stops at '{missing}', "
                           "which the run never emitted (or not in this order)")
    console.rule("end of the run", style="magenta", align="left")
    say(console, lesson.outro, Context(plan, debugger.context().tensors, result))
    console.print(f"predictions: {debugger.right} of {debugger.asked} right", style="bold")
    return Walked(True, debugger.right, debugger.asked)


def right_answers(lesson: Lesson) -> list[str]:
    """The input lines of a walk that answers every prediction right and goes on at every stop
    (for headless runs: CI pipes these into `stepper lesson start`)."""
    from stepper.trace import Recorder

    plan = prepare(lesson.run)
    recorder = Recorder()
    execute(plan, [recorder])
    ctx = Context(plan, recorder.tensors())
    lines = []
    for step in lesson.steps:
        for pred in step.predict:
            value = expected_value(pred, ctx)
            lines.append(repr(float(value)) if pred.kind == "number" else show_answer(pred, value))
        lines.append("")
    return lines
