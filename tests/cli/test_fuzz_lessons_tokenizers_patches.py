"""Derandomized, bounded fuzzing of what a user or a file gives stepper besides checkpoints:
lesson files (lesson.toml changed field by field, or as text), tokenizer files (a tokenizer.json
changed field by field) and patch expressions. Every example ends in exit 0 or 1, or exit 2
with one line; never a traceback."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import tomllib
from helpers.cli import ends_well, stepper
from helpers.files import linked
from helpers.malformed import changed_at, paths_of
from helpers.tokenizer_files import write_tiktoken_model, write_tokenizer_json
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepper.presets import preset
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.synth_checkpoint import synth_checkpoint

ROOT = Path(__file__).resolve().parents[2]
LESSON = ROOT / "lessons" / "02-rmsnorm"
SETTINGS = settings(max_examples=30, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

leaf = st.one_of(st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True), st.text(max_size=12),
                 st.sampled_from([0, -1, 1, 2**63, 1e308, "", "\x1b[2J", "{config.hidden_size:999999999}", "{",
                                  "{layers.9.output}", "number", "choice", "layers.0.output", "p layers.0.output"]))
value = st.recursive(leaf, lambda inner: st.lists(inner,
                                                  max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                     max_leaves=6)


# -- lesson files -------------------------------------------------------------------------------


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return "nan" if math.isnan(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(map(toml_value, v)) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"


def toml_text(tree: dict) -> str:
    """TOML of a parsed lesson file: one `key = value` line per top-level key (inline tables)."""
    return "".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in tree.items())


SOUND_LESSON = tomllib.loads((LESSON / "lesson.toml").read_text())
LESSON_PATHS = paths_of(SOUND_LESSON)


@pytest.fixture(scope="module")
def lesson_place(tmp_path_factory) -> Path:
    place = tmp_path_factory.mktemp("lessons")
    shutil.copytree(LESSON, place / "lessons" / "01-fuzz")
    return place


def lesson_commands(place: Path, text: str | bytes) -> None:
    """list, hint, check of the stub and a headless start, on the lesson file `text`."""
    path = place / "lessons" / "01-fuzz" / "lesson.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogateescape"))
    env = {"STEPPER_LESSONS_DIR": str(place / "lessons"), "STEPPER_DATA_DIR": str(place / "data")}
    for args, stdin in ((("lesson", "list", "--plain"), ""), (("lesson", "hint", "fuzz"), ""),
                        (("lesson", "check", "fuzz", "--file", str(LESSON / "exercise.py")), ""),
                        (("lesson", "start", "fuzz", "--plain", "--workspace", str(place / "ws")), "1\n\n\n\nq\n")):
        ends_well(stepper(*args, cwd=place, env=env, stdin=stdin))


def test_the_sound_lesson_file_round_trips_through_the_writer():
    assert tomllib.loads(toml_text(SOUND_LESSON)) == SOUND_LESSON


@SETTINGS
@given(changes=st.lists(st.tuples(st.sampled_from(LESSON_PATHS), value | st.just(KeyError)), min_size=1, max_size=3))
def test_fuzzed_lesson_files(lesson_place, changes):
    lesson_commands(lesson_place, toml_text(changed_at(SOUND_LESSON, changes)))


@pytest.mark.parametrize("text", [
    b"a = " + b"[" * 100_000, b"a = " + b"{b = " * 100_000, b"\xff\xfe title", b"title = 'x'\ntitle = 'y'\n",
    toml_text({**SOUND_LESSON, "intro": "{config.hidden_size:999999999}"}).encode(),
], ids=["deep-arrays", "deep-tables", "not-utf8", "twice", "huge-width"])
def test_hostile_lesson_texts(lesson_place, text):
    lesson_commands(lesson_place, text)


def test_a_format_width_past_the_bound_is_one_line(lesson_place):
    path = lesson_place / "lessons" / "01-fuzz" / "lesson.toml"
    path.write_text(toml_text({**SOUND_LESSON, "intro": "{config.hidden_size:999999999}"}))
    env = {"STEPPER_LESSONS_DIR": str(lesson_place / "lessons"), "STEPPER_DATA_DIR": str(lesson_place / "data")}
    out = stepper("lesson", "start", "fuzz", "--plain", "--workspace", str(lesson_place / "ws"), cwd=lesson_place,
                  env=env, stdin="q\n")
    assert out.returncode == 2 and out.stderr == (
        "stepper: error: template {config.hidden_size:999999999}: format spec ':999999999' has a width or precision "
        "past 100\n")


HOSTILE_FILES = {  # a lesson file changed one way -> the end of its one line (`lesson list`); exit 2, never a traceback
    "title-a-long-list": (lambda t: t.replace('title = "RMSNorm and the residual stream"',
                                              "title = [" + "1, " * 100_000 + "]"),
                          "top level: 'title' has the wrong type: [1, 1, 1, 1, 1, 1, ...]"),
    "key-long": (lambda t: '"' + "k" * 100_000 + '" = 1\n' + t,
                 (f"top level: unknown key '{'k' * 60}...' (allowed: exercise, intro, outro, run, steps, summary, "
                  "title)")),
    "kind-long": (lambda t: t.replace('kind = "number"', 'kind = "' + "n" * 100_000 + '"', 1),
                  ("steps[0].predict[0]: kind must be one of shape, number, set, choice, got "
                   f"'{'n' * 27}...{'n' * 28}'")),
    "command-long": (lambda t: t.replace("[[steps.predict]]", 'commands = ["' + "x" * 100_000 + '"]\n[[steps.predict]]',
                                         1),
                     (f"steps[0]: command '{'x' * 27}...{'x' * 28}': only compare, e, explain, h, history, p, "
                      "print, s, show, w, where, x may run at a stop")),
    "integer-of-5000-digits": (lambda t: t.replace("prompt_len = 7", "prompt_len = " + "9" * 5000),  # a ValueError
                               ("not valid TOML (a value cannot be read: Exceeds the limit (4300 digits) for integer "
                                "string conversion: value has 5000 digits)")),
    "layers-a-string": (lambda t: t.replace("prompt_len = 7", 'layers = [1, "x"]'),  # a TypeError at the run
                        "[run]: 'layers' must be [first, stop]"),
    "seed-negative": (lambda t: t.replace("prompt_len = 7", "seed = -1"),  # NumPy's ValueError at the run
                      "[run]: 'seed' must be >= 0, got -1"),
    "prompt-len-zero": (lambda t: t.replace("prompt_len = 7", "prompt_len = 0"), ("[run]: 'prompt_len' must be >= 1, "
                                                                                  "got 0")),
    "20-MB": (lambda t: t.replace('intro = """', 'intro = """' + ("x" * 999 + "\n") * 20_000, 1),
              "20,000,000 bytes, more than a lesson file holds (at most 16 MiB)"),
}


@pytest.mark.parametrize("case", HOSTILE_FILES)
def test_a_hostile_lesson_file_is_one_short_line_naming_it(lesson_place, case):
    edit, says = HOSTILE_FILES[case]
    path = lesson_place / "lessons" / "01-fuzz" / "lesson.toml"
    text = edit((LESSON / "lesson.toml").read_text())
    path.write_text(text)
    env = {"STEPPER_LESSONS_DIR": str(lesson_place / "lessons"), "STEPPER_DATA_DIR": str(lesson_place / "data")}
    out = stepper("lesson", "list", "--plain", cwd=lesson_place, env=env)
    size = f"{len(text.encode()):,} bytes" if case == "20-MB" else ""
    assert out.returncode == 2 and out.stderr == f"stepper: error: {path}: {says.replace('20,000,000 bytes', size)}\n"


def test_a_stop_of_100_000_characters_is_shown_cut(lesson_place):
    path = lesson_place / "lessons" / "01-fuzz" / "lesson.toml"
    path.write_text((LESSON / "lesson.toml").read_text().replace('stop = "layers.0.hidden_states"',
                                                                 'stop = "' + "s" * 100_000 + '"', 1))
    env = {"STEPPER_LESSONS_DIR": str(lesson_place / "lessons"), "STEPPER_DATA_DIR": str(lesson_place / "data")}
    out = stepper("lesson", "start", "fuzz", "--plain", "--workspace", str(lesson_place / "ws"), cwd=lesson_place,
                  env=env, stdin="q\n")
    assert out.returncode == 2 and out.stderr == (f"stepper: error: {path}: step 1 stops at '{'s' * 60}...', which the "
                                                  "run never emitted (or not in this order)\n")


# -- tokenizer files ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def token_place(tmp_path_factory) -> tuple[Path, dict]:
    """A tiny checkpoint with a byte-level BPE tokenizer.json (its parsed form beside it)."""
    folder = synth_checkpoint(SyntheticWeights(preset("tiny"), seed=0), tmp_path_factory.mktemp("tok") / "c")
    write_tokenizer_json(folder, vocab_size=300)
    return folder, json.loads((folder / "tokenizer.json").read_text())


TOKENIZER_VALUES = value | st.sampled_from([
    {"strategy": {"Fixed": 10**8}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0, "pad_type_id": 0,
     "pad_token": "<bos>"},
    {"direction": "Right", "max_length": 2, "strategy": "LongestFirst", "stride": 1},
    {"type": "Split", "pattern": {"Regex": "(.*a){12}x"}, "behavior": "Isolated", "invert": False},
    {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "[UNK]"}, {"Regex": "("}, 2**64, -1,
])


def tokenizer_paths(sound: dict) -> list[tuple]:
    """Paths into the file, the vocabulary and merges left out (thousands of entries of one kind)."""
    return [p for p in paths_of(sound) if not (len(p) > 2 and p[:2] in (("model", "vocab"), ("model", "merges")))]


@SETTINGS
@given(data=st.data())
def test_fuzzed_tokenizer_files(token_place, tmp_path_factory, data):
    folder, sound = token_place
    changes = data.draw(st.lists(st.tuples(st.sampled_from(tokenizer_paths(sound)),
                                           TOKENIZER_VALUES | st.just(KeyError)),
                                 min_size=1, max_size=3))
    copy_ = linked(folder, tmp_path_factory.mktemp("t"), but={"tokenizer.json"})
    (copy_ / "tokenizer.json").write_text(json.dumps(changed_at(sound, changes)))
    prompt = data.draw(st.text(min_size=1, max_size=20) | st.just("a" * 40))
    ends_well(stepper("run", "--model", str(copy_), "--prompt", prompt, "--plain", "--only", "embed"))


@pytest.fixture(scope="module")
def kimi_place(tmp_path_factory) -> Path:
    """The tiny checkpoint with a Kimi tiktoken.model and tokenizer_config.json."""
    folder = synth_checkpoint(SyntheticWeights(preset("tiny"), seed=0), tmp_path_factory.mktemp("kimi") / "c")
    write_tiktoken_model(folder)
    return folder


kimi_lines = st.sampled_from(["", "YQ== 0", "YQ== -1", "YQ==", "YQ== 1 2", "!!! 3", "YQ== 99999999999999999999",
                              "\x1b[2J 4", "YWJj 5", "YQ== 5"]) | st.text(max_size=20)


@SETTINGS
@given(data=st.data())
def test_fuzzed_kimi_tokenizer_files(kimi_place, tmp_path_factory, data):
    lines = (kimi_place / "tiktoken.model").read_text().splitlines()
    at = data.draw(st.integers(0, len(lines) - 1))
    lines[at:at + data.draw(st.integers(0, 2))] = data.draw(st.lists(kimi_lines, max_size=3))
    config = data.draw(st.just(None) | value.map(lambda v: {"added_tokens_decoder": v}) | value)
    copy_ = linked(kimi_place, tmp_path_factory.mktemp("k"), but={"tiktoken.model", "tokenizer_config.json"})
    (copy_ / "tiktoken.model").write_text("\n".join(lines) + "\n")
    if config is not None:
        (copy_ / "tokenizer_config.json").write_text(json.dumps(config))
    prompt = data.draw(st.text(min_size=1, max_size=20) | st.just("[BOS]hello <|im_end|>"))
    ends_well(stepper("run", "--model", str(copy_), "--prompt", prompt, "--plain", "--only", "embed"))


# -- patch expressions --------------------------------------------------------------------------

atoms = st.sampled_from(["x", "0", "1.5", "-2", "nan", "inf", "1e309", "x[0]", "x[..., 7]", "x[0, :, 3]", "x[::-1]",
                         "open", "__import__('os')", "x.T", "y", "'s'", "None", "x[9999]", "x[1:2:0]", "2**99"])
OPERATORS = st.sampled_from(["+", "-", "*", "/", "**", "//", "@", ","])
expressions = st.recursive(atoms, lambda e: st.tuples(e, OPERATORS, e).map(lambda t: f"({t[0]}{t[1]}{t[2]})")
                           | e.map(lambda a: f"-{a}"), max_leaves=8)
patches = st.one_of(
    expressions,
    st.tuples(st.sampled_from(["x[0]", "x[..., 1]", "x[0, 0]", "x[", "y[0]"]),
              expressions).map(lambda t: f"{t[0]}={t[1]}"),
    st.text(max_size=30),
    st.sampled_from(["-" * 100_000 + "x", "(" * 300 + "x" + ")" * 300, "x" + "*2" * 200, "x[" * 50 + "0" + "]" * 50]),
)


@SETTINGS
@given(expr=patches, name=st.sampled_from(["logits", "layers.1.mlp.gate.topk_idx", "*.attn_weights", "nothing", ""]))
def test_fuzzed_patches(expr, name):
    ends_well(stepper("run", "--plain", "--only", "logits", "--prompt-len", "2", "--patch", f"{name}={expr}"))
