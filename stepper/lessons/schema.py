"""A lesson's format: the folders under `lessons/`, what `lesson.toml` holds, and reading it.

A lesson is a folder `NN-name/` (lessons/README.md documents the format): `lesson.toml` with the
run to step through and the steps, `exercise.py` (the stub the learner fills in) and
`solution.py`. Every problem in a lesson file is one error naming the file and the key.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepper.errors import StepperError
from stepper.lessons import answers
from stepper.session import RunSpec
from stepper.untrusted import cut, said
from stepper.untrusted.jsonfile import read_regular

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10: tomli if the user has it
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ModuleNotFoundError:
        tomllib = None  # type: ignore[assignment]

FOLDER = re.compile(r"^(\d{2})-([a-z0-9][a-z0-9-]*)$")
LESSON_FILE = "lesson.toml"
STUB_FILE = "exercise.py"
SOLUTION_FILE = "solution.py"
LESSON_BYTES = 16 << 20  # a lesson file: the shipped ones are under 20 KB; TOML is read in pure Python


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
            raise self.fail(f"must be a table, got {said(table)}")
        unknown = sorted(set(table) - allowed)
        if unknown:
            raise self.fail(f"unknown key '{cut(unknown[0])}' (allowed: {', '.join(sorted(allowed))})")
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
            raise self.fail(f"'{key}' has the wrong type: {said(value)}")
        return value


def load_lesson(folder: Path) -> Lesson:
    match = FOLDER.match(folder.name)
    if not match:
        raise StepperError(f"{folder}: a lesson folder is named NN-name, like 02-rmsnorm")
    path = folder / LESSON_FILE
    if tomllib is None:  # pragma: no cover - Python 3.10 without tomli
        raise StepperError(f"{path}: lessons are TOML; they need Python 3.11+, or `pip install tomli` on 3.10")
    try:
        raw = tomllib.loads(read_regular(path, LESSON_BYTES, "a lesson file").decode("utf-8"))
    except OSError as e:
        raise StepperError(f"{path}: cannot read it ({e})") from None
    except UnicodeDecodeError as e:
        raise StepperError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except tomllib.TOMLDecodeError as e:
        raise StepperError(f"{path}: not valid TOML ({e})") from None
    except ValueError as e:  # a value tomllib reads with Python's own: an integer of 5,000 digits
        why = cut(str(e).split(";")[0], 100)  # (Python's advice on sys.set_int_max_str_digits left out)
        raise StepperError(f"{path}: not valid TOML (a value cannot be read: {why})") from None
    except RecursionError:  # tomllib recurses once per nested array or table (it is pure Python: a clean error)
        raise StepperError(f"{path}: arrays or tables nested too deeply") from None
    top = Reader(path, "top level", raw, TOP_KEYS)
    run = run_spec(Reader(path, "[run]", top.get("run", dict), RUN_KEYS), RunSpec(), folder)
    ex = Reader(path, "[exercise]", top.get("exercise", dict), EXERCISE_KEYS)
    runs = tuple(run_spec(Reader(path, f"[exercise] runs[{i}]", r, RUN_KEYS), run, folder)
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


def run_spec(r: Reader, base: RunSpec, folder: Path) -> RunSpec:
    fields: dict[str, Any] = {}
    for key in ("model", "attn"):
        if key in r.table:
            fields[key] = r.get(key, str)
    if fields.get("model", "").endswith(".json"):  # a config of the lesson's own (synthetic weights), in its folder
        config = folder / fields["model"]
        if Path(fields["model"]).name != fields["model"] or not config.is_file():
            raise r.fail(f"'model' {said(fields['model'])}: a config file must be in the lesson's folder")
        fields["model"] = str(config)
    for key in ("layer", "prompt_len", "start_pos", "decode", "seed"):
        if key in r.table:
            fields[key] = r.get(key, int)
            least = 1 if key == "prompt_len" else 0  # (named here: the run would name the command line's option)
            if fields[key] < least:
                raise r.fail(f"'{key}' must be >= {least}, got {fields[key]}")
    if "ids" in r.table:
        ids = r.get("ids", list)
        if not all(isinstance(i, int) for i in ids):
            raise r.fail("'ids' must be a list of token ids")
        fields["ids"] = tuple(ids)
    if "layers" in r.table:
        layers = r.get("layers", list)
        if len(layers) != 2 or not all(type(n) is int for n in layers):
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
            raise r.fail(f"command {said(command)}: only {', '.join(sorted(STOP_COMMANDS))} may run at a stop")
    return Step(
        stop=r.get("stop", str), text=r.get("text", str, ""), explain=r.get("explain", str, ""),
        predict=tuple(read_prediction(path, f"steps[{i}].predict[{j}]", p) for j, p in enumerate(predicts)),
        commands=tuple(commands),
    )


def read_prediction(path: Path, where: str, raw: Any) -> Prediction:
    r = Reader(path, where, raw, PREDICT_KEYS)
    kind = r.get("kind", str)
    if kind not in answers.KINDS:
        raise r.fail(f"kind must be one of {', '.join(answers.KINDS)}, got {said(kind)}")
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
