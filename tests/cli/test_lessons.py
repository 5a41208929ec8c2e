"""Lessons: content, headless walks, exercise checks, `--use` swaps, answers, progress and the CLI."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from stepper import catalog, session
from stepper.cli.main import app
from stepper.errors import StepperError
from stepper.lessons import check, overrides
from stepper.lessons.context import Context
from stepper.lessons.judge import judge
from stepper.lessons.lint import mentioned_names, subject_errors, template_errors, unknown_names
from stepper.lessons.progress import Progress
from stepper.lessons.prose import join_lines, say
from stepper.lessons.reading import Unreadable, parse_choice, parse_number, parse_set, parse_shape
from stepper.lessons.schema import Prediction, Wrong, all_lessons, find_lesson
from stepper.lessons.templates import render, value_of
from stepper.lessons.walk import right_answers, walk
from stepper.lessons.workspace import Workspace
from stepper.seams.trace import Recorder
from stepper.session import RunSpec, prepare, run
from stepper.views.debugger import CommandSource

LESSONS = all_lessons()
IDS = [lesson.name for lesson in LESSONS]
REQUIRED = {"tour", "rmsnorm", "fp8", "mla-latent", "rope-yarn", "absorption", "moe-routing", "decode-cache",
            "three-routers", "sparse-attention", "compressed-attention", "hyper-connections"}
REQUIRED_EXERCISES = {"rms_norm", "decode", "dequantize", "rope_inv_freq", "apply_rope", "absorbed", "route",
                      "index_scores", "gated_pool", "sinkhorn"}



@pytest.fixture(autouse=True)
def data_dir(tmp_path, monkeypatch):
    """Progress goes to a fresh STEPPER_DATA_DIR, never to the user's data directory."""
    path = tmp_path / "data"
    monkeypatch.setenv("STEPPER_DATA_DIR", str(path))
    return path


def stepper(*args: str, stdin: str = ""):
    """`stepper ARGS` in-process (typer's runner): exit_code, stdout, stderr. STEPPER_DATA_DIR and the
    working directory come from the test's fixtures."""
    return CliRunner().invoke(app, list(args), input=stdin)


def flat(text: str) -> str:
    """The text with its line breaks and runs of spaces made single spaces (output wraps at the width)."""
    return " ".join(text.split())


def tensors(spec: RunSpec, use: list[Path] | None = None) -> dict[str, np.ndarray]:
    recorder = Recorder()
    with overrides.use(use or []):
        run(spec, [recorder])
    return recorder.tensors()


# ---------------------------------------------------------------------------------------------
# Content


def test_the_lessons_and_exercises_the_issue_asks_for():
    assert REQUIRED <= set(IDS)
    exercised = {name for lesson in LESSONS for name in lesson.exercise.functions}
    assert REQUIRED_EXERCISES <= exercised
    assert exercised <= set(overrides.EXERCISES)
    for lesson in LESSONS:
        assert lesson.stub.is_file() and lesson.solution.is_file() and lesson.exercise.hints
        assert lesson.steps and all(step.predict for step in lesson.steps), f"{lesson.name}: every stop asks first"


@pytest.mark.parametrize("lesson", LESSONS, ids=IDS)
def test_every_name_a_lesson_mentions_is_in_the_catalogue(lesson):
    names = mentioned_names(lesson)
    assert any(catalog.key_of(n) in catalog.load().names() for n in names)
    assert unknown_names(lesson) == []
    assert template_errors(lesson) == []


def test_a_misspelt_name_is_caught(tmp_path):
    folder = tmp_path / "01-bad"
    shutil.copytree(find_lesson("rmsnorm").folder, folder)
    toml = folder / "lesson.toml"
    toml.write_text(toml.read_text().replace("layers.0.self_attn.q_a_norm.shape", "layers.0.self_attn.q_a_nrom.shape")
                    .replace("`self_attn.q_a`", "`self_attn.q_aa`"))
    from stepper.lessons.schema import load_lesson

    lesson = load_lesson(folder)
    assert "self_attn.q_aa" in unknown_names(lesson)
    assert any("q_a_nrom" in e for e in template_errors(lesson))


@pytest.mark.parametrize("lesson", LESSONS, ids=IDS)
def test_every_lesson_walks_headless_to_the_end(lesson):
    out = io.StringIO()
    console = Console(file=out, width=100, no_color=True, highlight=False, markup=False, soft_wrap=True)
    walked = walk(lesson, console, CommandSource(console, io.StringIO("\n".join(right_answers(lesson)) + "\n"), False))
    text = out.getvalue()
    assert walked.finished, text[-2000:]
    assert walked.first_try == walked.asked > 0 and walked.retried == 0
    assert f"predictions: {walked.asked} of {walked.asked} right at the first try\n" in text
    assert text.count("✓ right") == walked.asked
    assert "end of the run" in text and "(end of commands" not in text


def test_a_wrong_prediction_is_explained_by_the_lesson():
    lesson = find_lesson("tour")
    answers = right_answers(lesson)
    answers[0:0] = [f"[1, 7, {prepare(lesson.run).config.vocab_size}]"]  # then the right one
    out = io.StringIO()
    console = Console(file=out, width=200, no_color=True, soft_wrap=True)
    walked = walk(lesson, console, CommandSource(console, io.StringIO("\n".join(answers) + "\n"), False))
    assert walked.finished and (walked.first_try, walked.retried) == (walked.asked - 1, 1)
    assert "✗ 1000 is the vocabulary size" in out.getvalue()
    assert (f"predictions: {walked.asked - 1} of {walked.asked} right at the first try, 1 more on a retry"
            in out.getvalue())


@pytest.mark.parametrize("name, written", [
    ("mla-latent", {"1280.0": "1,280", "576.0": "576 B", "35.55555555555556": "35.6x"}),  # as stepper prints them
    ("rope-yarn", {"{0, 1, 2, 3, 4}": "0-4", "{3, 11}": "11 and 3", "0.2617215999259001": "0.262"}),
])
def test_answers_written_as_a_learner_writes_them_are_right_at_the_first_try(name, written):
    lesson = find_lesson(name)
    answers = [written.get(a, a) for a in right_answers(lesson)]
    assert set(written.values()) <= set(answers)
    out = io.StringIO()
    console = Console(file=out, width=200, no_color=True, soft_wrap=True)
    walked = walk(lesson, console, CommandSource(console, io.StringIO("\n".join(answers) + "\n"), False))
    assert walked.finished and walked.first_try == walked.asked, out.getvalue()[-3000:]


def test_unreadable_answers_are_no_try_and_a_shown_answer_is_not_right():
    """First tries and retries are counted apart; an answer refused as unreadable is asked again
    and is not a try; a prediction answered wrong twice (then shown) counts as neither."""
    lesson = find_lesson("mla-latent")
    right = right_answers(lesson)  # each step: its answers, then "" to go on
    assert right[1] == right[3] == right[5] == ""
    answers = ["?", "1 7 ?", "[1, 7, 128]", right[0], right[0], "",  # step 1: help, unreadable, wrong, right; again
               "1,2.5", right[2], "",  # step 2: unreadable, then right: a first try
               "1 7 16", "[1, 4, 7, 16]", "", *right[6:]]  # step 3 (k_pe): wrong twice, then shown
    out = io.StringIO()
    console = Console(file=out, width=200, no_color=True, soft_wrap=True)
    walked = walk(lesson, console, CommandSource(console, io.StringIO("\n".join(answers) + "\n"), False))
    text = out.getvalue()
    assert walked.finished, text[-2000:]
    assert (walked.first_try, walked.retried) == (walked.asked - 2, 1)
    assert text.count("I could not read that") == 2 and "→ the answer: [1, 1, 7, 16]" in text
    assert "that looks like an answer, but this stop's predictions are done" in text  # typed at the prompt
    assert "write the sizes in order, like [1, 7, 512], 1x7x512 or 1 7 512; Enter shows the answer" in text  # ?



def test_a_debugger_command_typed_at_a_prediction_is_told_and_is_no_try():
    """`p k_pe` at a prediction prompt is not graded as an answer: the walk says the commands come
    after the predictions, asks again, and the right answer after it is a first try."""
    lesson = find_lesson("mla-latent")
    right = right_answers(lesson)
    answers = ["p compressed_kv", "s hist compressed_kv", "x compressed_kv[0]", "p compressed_kv", *right]
    out = io.StringIO()
    console = Console(file=out, width=200, no_color=True, soft_wrap=True)
    walked = walk(lesson, console, CommandSource(console, io.StringIO("\n".join(answers) + "\n"), False))
    text = out.getvalue()
    assert walked.finished and walked.first_try == walked.asked, text[-2000:]
    assert text.count("that is a debugger command: a stop's commands come after its predictions") == 4
    assert "I could not read that" not in text

# ---------------------------------------------------------------------------------------------
# Exercises


@pytest.mark.parametrize("lesson", LESSONS, ids=IDS)
def test_every_stub_fails_and_every_solution_passes(lesson):
    stub = check.check(lesson, lesson.stub)
    assert not stub.passed
    assert stub.outcomes[0].detail, "a failing check says why"
    solution = check.check(lesson, lesson.solution)
    assert solution.passed, [(o.title, o.detail) for o in solution.outcomes]


@pytest.mark.parametrize("lesson", LESSONS, ids=IDS)
def test_use_solution_gives_bit_identical_runs(lesson):
    for spec in lesson.exercise.runs:
        plain, swapped = {e.name: e.array for e in check.golden(spec)}, tensors(spec, [lesson.solution])
        assert list(plain) == list(swapped)
        for name, array in plain.items():
            assert swapped[name].dtype == array.dtype and np.array_equal(swapped[name], array, equal_nan=True), name


def test_use_with_a_wrong_function_changes_the_downstream_tensors(tmp_path):
    wrong = tmp_path / "wrong.py"
    wrong.write_text("import numpy as np\n\n\ndef rms_norm(x, weight, eps):\n"
                     "    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps))  # no weight\n")
    plain, swapped = tensors(RunSpec()), tensors(RunSpec(), [wrong])
    assert np.array_equal(plain["layers.0.hidden_states"], swapped["layers.0.hidden_states"])
    for name in ("layers.0.input_layernorm", "layers.1.self_attn.compressed_kv", "logits"):
        assert not np.allclose(plain[name], swapped[name]), name


def test_use_with_a_wrong_fp8_decode_reaches_the_fp8_products(tmp_path):
    fp8 = find_lesson("fp8").solution.read_text()
    wrong = tmp_path / "fp8.py"
    wrong.write_text(fp8.replace("exponent - 7)", "exponent - 6)"))  # every normal value doubled
    plain, swapped = tensors(RunSpec()), tensors(RunSpec(), [wrong])
    np.testing.assert_allclose(swapped["layers.0.self_attn.q_a"], 2 * plain["layers.0.self_attn.q_a"],
                               rtol=1e-5, atol=1e-4)  # subnormals are not doubled
    assert not np.allclose(plain["logits"], swapped["logits"])


def test_use_with_the_fp8_solution_keeps_the_absorbed_attention_bit_identical():
    spec = RunSpec(prompt_len=3, decode=1, attn="absorb")  # kv_b is decoded whole, into reused memory
    plain, swapped = tensors(spec), tensors(spec, [find_lesson("fp8").solution])
    assert "decode0.layers.1.self_attn.q_nope_absorbed" in plain and plain.keys() == swapped.keys()
    for name, array in plain.items():
        assert np.array_equal(swapped[name], array, equal_nan=True), name


def test_use_swaps_in_restores_stepper_and_rejects_other_signatures(tmp_path):
    from stepper.model import ops

    x, weight = np.ones((2, 4), np.float32), np.full(4, 3, np.float32)
    mine = tmp_path / "mine.py"
    mine.write_text("def rms_norm(x, weight, eps):\n    return x * 0 + 7\n")
    with overrides.use([mine]):
        assert (ops.rms_norm(x, weight, 1e-6) == 7).all()
    np.testing.assert_allclose(ops.rms_norm(x, weight, 1e-6), 3 / np.sqrt(1 + 1e-6), rtol=1e-6)
    bad = tmp_path / "bad.py"
    bad.write_text("def rms_norm(x, w):\n    return x\n")
    expected = r"bad\.py: rms_norm\(x, w\) has a different signature .* rms_norm\(x, weight, eps\)"
    with pytest.raises(StepperError, match=expected), overrides.use([bad]):
        pass
    np.testing.assert_allclose(ops.rms_norm(x, weight, 1e-6), 3 / np.sqrt(1 + 1e-6), rtol=1e-6)


# Calls of each exercise in a tiny run of 3 positions and one decode step (3 layers, the first
# dense; the naive prefill, the absorbed decode step), counted by hand from the layer's math:
# rms_norm: input, q_a, kv_a and post-attention norms per layer, the final norm; apply_rope: the
# query's and the shared key's per layer; latent per layer; absorbed per layer of the decode
# step; route per MoE layer.
CALLS = {"rms_norm": 2 * (4 * 3 + 1), "apply_rope": 2 * 2 * 3, "latent": 2 * 3, "absorbed": 3, "route": 2 * 2,
         "index_scores": 2 * 3,  # prefill and one decode step, 3 layers
         "gated_delta_rule": 2 * 3,  # tiny-kimi-linear: its 3 KDA layers, prefill and decode step
         "gated_pool": 2 * 5,  # tiny-v4: the compressor and the indexer's in 2 CSA layers, 1 HCA layer; 2 steps
         "sinkhorn": 2 * 2 * 4}  # tiny-v4: before the attention and the MoE of 4 layers, 2 steps
MODEL = {"dequantize_int4": "tiny-int4", "index_scores": "tiny-v32",  # INT4 weights only there; the indexer in V3.2
         "gated_delta_rule": "tiny-kimi-linear", "gated_pool": "tiny-v4", "sinkhorn": "tiny-v4"}


@pytest.mark.parametrize("name", overrides.EXERCISES)
def test_a_swapped_exercise_runs_at_every_place_the_interpreter_calls_it(name):
    """No table of call sites: each call of an exercise, wherever it is made, runs what is swapped in."""
    spec = RunSpec(model=MODEL.get(name, "tiny"), prompt_len=3, decode=1)
    reference, calls = overrides.reference(name), []

    def spy(*args, **kwargs):
        calls.append(1)
        return reference(*args, **kwargs)

    recorder = Recorder()
    with overrides.patched({name: spy}):
        run(spec, [recorder])
    assert len(calls) == CALLS.get(name, len(calls)) and calls, f"{name} called {len(calls)} times"
    for event in check.golden(spec):  # and the run is stepper's own, bit for bit
        assert np.array_equal(recorder.tensors()[event.name], event.array, equal_nan=True), event.name


def test_check_shows_the_first_mismatch_with_both_values(tmp_path):
    wrong = tmp_path / "route.py"
    wrong.write_text(find_lesson("moe-routing").solution.read_text()
                     .replace("take_along_axis(scores, topk_idx", "take_along_axis(scores_for_choice, topk_idx"))
    report = check.check(find_lesson("moe-routing"), wrong)
    assert not report.passed
    detail = "\n".join(report.outcomes[-1].detail)
    assert "layers.1.mlp.gate.topk_weight differs" in detail
    assert "expected" in detail and "got" in detail and "first difference at [" in detail


# ---------------------------------------------------------------------------------------------
# Predictions


@pytest.fixture(scope="module")
def ctx():
    return Context(prepare(RunSpec()))


@pytest.mark.parametrize("text", ["[1, 7, 512]", "1x7x512", "(1,7,512)", "1 7 512", "[B=1, T=7, 512]", "1×7×512"])
def test_shape_answer_forms(text, ctx):
    assert parse_shape(text) == (1, 7, 512)
    assert judge(Prediction("?", "shape", [1, 7, 512]), text, ctx, None).right


def test_number_set_and_choice_forms(ctx):
    assert parse_number("2^-6") == 2**-6 and parse_number("3/8") == 0.375 and parse_number("≈ 1.81x") == 1.81
    assert judge(Prediction("?", "number", 1.8133, tolerance=0.01), "1.81", ctx, None).right
    assert not judge(Prediction("?", "number", 1.8133, tolerance=0.001), "1.7", ctx, None).right
    assert parse_set("{30, 0, 24, 29}") == {0, 24, 29, 30}
    assert judge(Prediction("?", "set", [0, 29, 24, 30]), "24 30 0 29", ctx, None).right
    options = ("larger", "smaller", "about the same")
    assert parse_choice("b", options) == 1 and parse_choice("2", options) == 1 and parse_choice("about", options) == 2
    assert parse_choice("same", options) == 2 and parse_choice("the same", options) == 2  # words only one option holds
    with pytest.raises(Unreadable, match="more than one option"):
        parse_choice("same", ("the same sign", "the same size"))
    with pytest.raises(Unreadable, match="none of the options"):
        parse_choice("sam", options)  # a word's start inside an option is not read as the option
    assert judge(Prediction("?", "choice", "smaller", options=options), "Smaller", ctx, None).right


@pytest.mark.parametrize("expected, answer, reason", [
    ([1, 4, 7, 48], "[1, 7, 192]", "before the heads are split"),
    ([1, 4, 7, 48], "[1, 7, 4, 48]", "before the transpose"),
    ([1, 7, 320], "[7, 320]", "keeps the batch axis"),
    ([7, 32], "[1, 7, 32]", "flattened"),
    ([1, 7, 128], "[1, 7, 512]", "Kimi K2's full-size kv_lora_rank"),
    ([1, 7, 144], "[1, 7, 128]", "kv_lora_rank + qk_rope_head_dim"),
    ([1, 4, 1, 6], "[1, 4, 1, 1]", "cached ones included"),
])
def test_a_wrong_shape_says_why(expected, answer, reason, ctx):
    tensor = {(1, 4, 7, 48): "layers.0.self_attn.q", (1, 7, 320): "embed", (7, 32): "layers.1.mlp.gate.logits",
              (1, 7, 128): "layers.0.self_attn.compressed_kv", (1, 7, 144): "layers.0.self_attn.kv_a",
              (1, 4, 1, 6): "decode0.layers.1.self_attn.attn_scores"}[tuple(expected)]
    verdict = judge(Prediction("?", "shape", expected, tensor=tensor), answer, ctx, None)
    assert not verdict.right and reason in verdict.why, verdict.why


def test_wrong_numbers_sets_and_unreadable_answers_say_why(ctx):
    pred = Prediction("?", "number", 448, wrong=(Wrong("480", "0x7F is NaN in e4m3fn"),))
    assert judge(pred, "480", ctx, None).why == "0x7F is NaN in e4m3fn"
    assert "2 times" in judge(Prediction("?", "number", 84), "168", ctx, None).why
    assert "wrong sign" in judge(Prediction("?", "number", 0.5), "-0.5", ctx, None).why
    why = judge(Prediction("?", "set", [0, 24, 29, 30]), "0, 24, 5", ctx, None).why
    assert "2 of 4 right" in why and "not 5" in why and "exactly 4" in why
    verdict = judge(Prediction("?", "shape", [1, 7, 512]), "no idea", ctx, None)
    assert not verdict.readable and "1x7x512" in verdict.why


# ---------------------------------------------------------------------------------------------
# The command line: workspace, progress, hints, solution, reset, watch


def test_cli_start_check_hint_solution_reset(tmp_path, data_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lesson = find_lesson("tour")
    answers = "\n".join(right_answers(lesson)) + "\n"
    started = stepper("lesson", "start", "tour", "--plain", stdin=answers)
    assert started.exit_code == 0, started.stderr
    assert f"predictions: {sum(len(s.predict) for s in lesson.steps)} of" in started.stdout
    mine = tmp_path / "stepper-lessons" / "tour.py"
    assert mine.read_text() == lesson.stub.read_text()
    progress = json.loads((data_dir / "progress.json").read_text())
    assert progress["current"] == "tour" and progress["lessons"]["tour"]["walked"]
    assert not list(Path(__file__).parents[2].glob("progress.json"))

    failed = stepper("lesson", "check")  # NAME defaults to the current lesson
    assert failed.exit_code == 1 and "not written yet" in failed.stdout
    refused = stepper("lesson", "solution", "tour")
    assert refused.exit_code == 2 and "--give-up" in refused.stderr
    hint = stepper("lesson", "hint", "tour")
    assert hint.exit_code == 0 and hint.stdout.startswith("hint 1 of")
    assert json.loads((data_dir / "progress.json").read_text())["lessons"]["tour"]["hints"] == 1

    mine.write_text(lesson.solution.read_text())
    again = stepper("lesson", "start", "tour", stdin="q\n")
    assert again.exit_code == 0 and mine.read_text() == lesson.solution.read_text(), "start never overwrites"
    passed = stepper("lesson", "check", "tour")
    assert passed.exit_code == 0 and "passed!" in passed.stdout
    walked = flat(stepper("lesson", "start", "tour", "--plain", stdin=answers).stdout)
    assert "your softmax in `stepper-lessons/tour.py` passed already: `stepper lesson solution tour` shows ours" in (
        walked) and "your turn" not in walked
    shown = stepper("lesson", "solution", "tour", "--plain")
    assert shown.exit_code == 0 and "def softmax" in shown.stdout
    listed = stepper("lesson", "list")
    assert "1 of" in listed.stdout and "passed" in listed.stdout and str(data_dir) in listed.stdout

    reset = stepper("lesson", "reset", "tour")
    assert reset.exit_code == 0 and mine.read_text() == lesson.stub.read_text()
    assert (tmp_path / "stepper-lessons" / "tour.py.bak").read_text() == lesson.solution.read_text()
    assert "tour" not in json.loads((data_dir / "progress.json").read_text())["lessons"]


def test_next_is_one_rule_for_check_and_list_and_the_markers_have_a_legend(tmp_path, monkeypatch):
    """After tour and fp8 pass, both `check` and `list` say rmsnorm is next (the first lesson not
    done), never a lesson already passed; `list` explains its markers."""
    monkeypatch.chdir(tmp_path)
    for name in ("tour", "fp8"):
        path, _ = Workspace().ensure(find_lesson(name))
        path.write_text(find_lesson(name).solution.read_text())
    assert "next: `stepper lesson start rmsnorm`" in flat(stepper("lesson", "check", "tour").stdout)
    progress = Progress()
    progress.lesson("mla-latent")["passed"] = True
    progress.current = "fp8"
    progress.save()
    checked = stepper("lesson", "check", "fp8", "--plain")
    assert checked.exit_code == 0 and "next: `stepper lesson start rmsnorm`" in flat(checked.stdout), checked.stdout
    listed = stepper("lesson", "list", "--plain").stdout
    assert "next: stepper lesson start rmsnorm" in flat(listed)
    assert "◀ the current lesson" in listed and " ◀\n" in listed
    rows = {line.split()[1]: line for line in listed.splitlines() if line[:2].strip().isdigit()}
    assert rows["rmsnorm"].endswith("· ◀") and "passed" in rows["mla-latent"] and rows["fp8"].endswith("passed")
    other = stepper("lesson", "check", "rmsnorm", "--file", str(find_lesson("rmsnorm").solution))  # not recorded
    assert "next: `stepper lesson start rope-yarn`" in flat(other.stdout), other.stdout
    assert "not recorded: another file than your exercise's" in flat(other.stdout)  # no solution it cannot open
    assert "lesson solution rmsnorm" not in flat(other.stdout)
    assert not Progress().lesson("rmsnorm")["passed"]


def test_after_a_pass_start_without_name_and_the_list_agree_on_the_next_lesson(tmp_path):
    """Once tour passes, `lesson start` without NAME starts rmsnorm, and `lesson list` marks rmsnorm
    and names it next (the output as a user sees it, through a pipe)."""
    from helpers.cli import stepper as command

    assert command("lesson", "start", "--plain", stdin="q\n", cwd=tmp_path).returncode == 0
    (tmp_path / "stepper-lessons" / "tour.py").write_text(find_lesson("tour").solution.read_text())
    assert command("lesson", "check", "--plain", cwd=tmp_path).returncode == 0  # NAME: the current lesson, tour
    listed = command("lesson", "list", "--plain", cwd=tmp_path).stdout.splitlines()
    marked = [line.split()[1] for line in listed if line.endswith(" ◀")]
    assert marked == ["rmsnorm"]
    assert f"1 of {len(all_lessons())} exercises passed · next: stepper lesson start rmsnorm" in listed
    started = command("lesson", "start", "--plain", stdin="q\n", cwd=tmp_path)
    assert started.returncode == 0
    assert started.stdout.splitlines()[0] == "your exercise file: stepper-lessons/rmsnorm.py (a fresh copy of the stub)"
    assert Progress().current == "rmsnorm"


def test_list_names_the_first_lesson_not_done_next_even_while_another_is_current(tmp_path):
    """Started on rmsnorm with tour not done: `lesson list` marks rmsnorm (the current lesson) but names
    tour next, as `lesson check rmsnorm` does once it passes (docs/usage.md: the same next lesson)."""
    from helpers.cli import stepper as command

    assert command("lesson", "start", "rmsnorm", "--plain", stdin="q\n", cwd=tmp_path).returncode == 0
    listed = command("lesson", "list", "--plain", cwd=tmp_path).stdout.splitlines()
    assert [line.split()[1] for line in listed if line.endswith(" ◀")] == ["rmsnorm"]
    assert f"0 of {len(all_lessons())} exercises passed · next: stepper lesson start tour" in listed
    (tmp_path / "stepper-lessons" / "rmsnorm.py").write_text(find_lesson("rmsnorm").solution.read_text())
    checked = command("lesson", "check", "rmsnorm", "--plain", cwd=tmp_path)
    assert checked.returncode == 0 and "next: `stepper lesson start tour`" in flat(checked.stdout), checked.stdout
    listed = command("lesson", "list", "--plain", cwd=tmp_path).stdout.splitlines()
    assert f"1 of {len(all_lessons())} exercises passed · next: stepper lesson start tour" in listed


def test_cli_errors_are_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    unknown = stepper("lesson", "start", "nope")
    assert unknown.exit_code == 2 and unknown.stderr.count("\n") == 1 and "no lesson 'nope'" in unknown.stderr
    missing = stepper("lesson", "check", "fp8")
    assert missing.exit_code == 2 and "stepper lesson start fp8" in missing.stderr


PROGRESS_FILES = {  # progress.json edited by hand -> what follows its path in the one line (all were tracebacks)
    "nested-deeply": ("[" * 100_000 + "]" * 100_000, (": JSON nested too deeply (more than 100 arrays or objects "
                                                      "inside one another): fix or delete it")),
    "nan": ('{"current": null, "lessons": {"rmsnorm": {"hints": NaN}}}', ": NaN is not JSON: fix or delete it"),
    "lesson-a-number": ('{"current": null, "lessons": {"rmsnorm": 5}}',
                        ": lessons['rmsnorm'] must be an object, got 5: fix or delete it"),
    "current-a-list": ('{"current": [1], "lessons": {}}',
                       ": 'current' must be a lesson name or null, got [1]: fix or delete it"),
    "hints-a-string": ('{"current": null, "lessons": {"rmsnorm": {"hints": "2"}}}',
                       ": lessons['rmsnorm'].hints must be a whole number >= 0, got '2': fix or delete it"),
    "hints-a-float": ('{"current": null, "lessons": {"rmsnorm": {"hints": 1.0}}}',
                      ": lessons['rmsnorm'].hints must be a whole number >= 0, got 1.0: fix or delete it"),
    "passed-a-list": ('{"current": null, "lessons": {"rmsnorm": {"passed": [1]}}}',
                      ": lessons['rmsnorm'].passed must be true or false, got [1]: fix or delete it"),
}


@pytest.mark.parametrize("case", PROGRESS_FILES)
def test_a_progress_file_edited_by_hand_is_one_line_naming_the_field(data_dir, case):
    text, says = PROGRESS_FILES[case]
    data_dir.mkdir()
    (data_dir / "progress.json").write_text(text)
    for args in (("lesson", "list", "--plain"), ("lesson", "hint", "rmsnorm")):
        out = stepper(*args)
        assert out.exit_code == 2, out.stderr
        assert out.stderr == f"stepper: error: progress file {data_dir / 'progress.json'}{says}\n"
    assert (data_dir / "progress.json").read_text() == text  # not replaced


def test_run_and_step_use_swap_in_a_file(tmp_path):
    solution = find_lesson("rmsnorm").solution
    base = ["run", "--json", "--only", "logits"]
    plain = stepper(*base).stdout
    same = stepper(*base, "--use", str(solution))
    assert same.exit_code == 0 and same.stdout == plain and "using your rms_norm" in same.stderr
    sinkhorn = stepper(*base, "--use", str(find_lesson("hyper-connections").solution))  # DeepSeek-V4's, on an MLA model
    assert sinkhorn.exit_code == 0 and sinkhorn.stdout == plain
    assert sinkhorn.stderr.endswith("\nyour sinkhorn was never called: this run's model has no step it computes\n")
    bad = tmp_path / "bad.py"
    bad.write_text("def rms_norm(x):\n    return x\n")
    refused = stepper(*base, "--use", str(bad))
    assert refused.exit_code == 2 and refused.stderr.count("\n") == 1 and "bad.py: rms_norm(x)" in refused.stderr
    stub = stepper("step", "--plain", "--use", str(find_lesson("rmsnorm").stub), stdin="c\n")
    assert stub.exit_code == 2 and "in rms_norm: is not written yet" in stub.stderr


def test_watch_rechecks_on_save_and_stops_on_pass(tmp_path, data_dir):
    lesson = find_lesson("decode-cache")
    Workspace(tmp_path / "ws").ensure(lesson)
    mine = tmp_path / "ws" / "decode-cache.py"
    env = {**os.environ, "STEPPER_DATA_DIR": str(data_dir)}
    proc = subprocess.Popen([sys.executable, "-m", "stepper", "lesson", "watch", "decode-cache", "--workspace",
                             str(tmp_path / "ws"), "--interval", "0.1", "--plain"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    timer = threading.Timer(120, proc.kill)  # a watch that never ends fails the test instead of hanging it
    timer.start()
    try:
        first = []  # the first check (fails: the stub's mask); stdin stays open, as a terminal's would
        while not first or not first[-1].startswith(("not yet", "passed!")) and first[-1]:
            first.append(proc.stdout.readline())
        time.sleep(0.2)  # a save a moment later has a new modification time
        mine.write_text(lesson.solution.read_text())
        proc.wait(timeout=60)
        out, err = "".join(first) + proc.stdout.read(), proc.stderr.read()
    finally:
        timer.cancel()
        proc.kill()
        proc.stdin.close()
    assert proc.returncode == 0, err
    assert "press Enter to re-check, q to quit" in out
    assert out.count("checking ") >= 2 and "causal_mask differs" in out and "passed!" in out
    assert Progress(data_dir / "progress.json").lesson("decode-cache")["passed"]


def test_watch_quits_on_q(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Workspace().ensure(find_lesson("tour"))
    done = stepper("lesson", "watch", "tour", "--plain", stdin="\nq\n")
    assert done.exit_code == 0 and done.stdout.count("checking ") == 2 and "stopped watching" in done.stdout


@pytest.mark.parametrize("lesson", LESSONS, ids=IDS)
def test_every_explanation_of_a_wrong_answer_renders_at_its_stop(lesson):
    from stepper.lessons.judge import expected_value
    from stepper.lessons.templates import render, value_of

    plan = prepare(lesson.run)
    recorder = Recorder()
    run(lesson.run, [recorder])
    order = [e.name for e in recorder.events]
    for step in lesson.steps:
        seen = order[: order.index(step.stop) + 1]
        ctx = Context(plan, {name: recorder.tensors()[name] for name in seen})
        for pred in step.predict:
            ctx.answer = expected_value(pred, ctx)
            texts = [pred.question, *pred.option_why, *(w.why for w in pred.wrong)]
            assert all(isinstance(render(t, ctx), str) for t in texts)
            for wrong in pred.wrong:
                if wrong.answer != "*":
                    assert value_of(wrong.answer, ctx) is not None


def wrong_answers(pred, expected, ctx) -> list[str]:
    """The lesson's own wrong answers and a few generic ones: for a shape an axis dropped, one
    added, a size changed; for a number its negative and a value too high; for a set one member
    left out and one added."""
    written = [w.answer for w in pred.wrong if w.answer != "*"]
    texts = [v if isinstance(v, str) else str(list(v) if pred.kind == "shape" else v)
             for v in (value_of(w, ctx) for w in written)]
    if pred.kind == "shape":
        e = list(expected)
        texts += [str(e[:i] + e[i + 1:]) for i in range(len(e))] + [str([1, *e]), str([*e, 1])]
        texts += [str(e[:i] + [e[i] + 3] + e[i + 1:]) for i in range(len(e))]
    elif pred.kind == "number":
        texts += [repr(-expected) if expected else "-1", repr(expected * 1.7 + 0.3)]
    elif pred.kind == "set":
        texts += [", ".join(map(str, sorted(expected)[1:])) or "999", ", ".join(map(str, sorted(expected | {999})))]
    return texts


@pytest.mark.parametrize("lesson", LESSONS, ids=IDS)
def test_a_wrong_answer_gets_a_hint_not_the_answer(lesson):
    """Before "try again", what a wrong prediction is told never holds the answer itself (the
    answer as shown after Enter: [1, 7, 128], 2.5, {0, 3})."""
    from stepper.lessons.judge import expected_value, show_answer

    plan = prepare(lesson.run)
    recorder = Recorder()
    run(lesson.run, [recorder])
    order = [e.name for e in recorder.events]
    told = 0
    for step in lesson.steps:
        ctx = Context(plan, {name: recorder.tensors()[name] for name in order[: order.index(step.stop) + 1]})
        for pred in (p for p in step.predict if p.kind != "choice"):
            expected = expected_value(pred, ctx)
            answer = show_answer(pred, expected)
            forms = [answer] + ([answer.strip("[]{}")] if pred.kind != "number" else [])
            for text in wrong_answers(pred, expected, ctx):
                verdict = judge(pred, text, ctx, step.stop)
                if verdict.right or not verdict.readable:
                    continue
                told += 1
                for form in forms:
                    found = re.search(r"(?<![\w.])" + re.escape(form) + r"(?![\w]|\.\d)", verdict.why)
                    assert found is None, f"{pred.question[:60]!r}: {text} is told {verdict.why!r}, the answer {answer}"
    assert told > 0


# ---------------------------------------------------------------------------------------------
# Facts quoted about one token or head


def test_every_value_quoted_about_one_token_or_head_is_computed_on_it():
    """Over every lesson's texts: in a sentence about token 0 (head 2, row 3, the telling token),
    each quoted tensor value is indexed on that token's axis and each fact gets that token."""
    checked = 0
    for lesson in LESSONS:
        n, problems = subject_errors(lesson)
        assert problems == [], problems
        checked += n
    assert checked >= 30, f"only {checked} quoted values were about one token or head"


def test_a_whole_tensor_value_in_a_sentence_about_one_token_is_caught(tmp_path):
    from stepper.lessons.schema import load_lesson

    folder = tmp_path / "07-routing"
    shutil.copytree(find_lesson("moe-routing").folder, folder)
    toml = folder / "lesson.toml"
    text = toml.read_text()
    text = text.replace("min {layers.1.mlp.gate.scores[0].min:.3f}",
                        "min {layers.1.mlp.gate.scores.min:.3f}")  # as it was
    text = text.replace("For token 0, expert {fact.routed(layers.1, 0, 0, expert)}",
                        "For token 1, expert {fact.routed(layers.1, 0, 0, expert)}")
    text = text.replace('explain = """\nOne row per token,', (
        'explain = """\nRow 3 of head 1 has {layers.1.mlp.gate.logits[3].max:.3f} and head 2 '
        '{layers.1.self_attn.attn_weights[0, 1, 3].sum}. The last token: {layers.1.mlp.gate.logits[0].max}. '
        'One row per token,'))
    toml.write_text(text)
    _, problems = subject_errors(load_lesson(folder))
    said = "\n".join(problems)
    assert "{layers.1.mlp.gate.scores.min} is computed on the whole tensor, not on token 0 (axis N)" in said
    assert "{fact.routed(layers.1, 0, 0, expert)} is computed for token 0, not token 1" in said
    assert "{layers.1.self_attn.attn_weights[0, 1, 3].sum} is computed on head 1, not on head 2 (axis H)" in said
    assert sum("is computed for token 0, not token 1" in p for p in problems) == 4  # the question's answer too
    assert "{layers.1.mlp.gate.logits[0].max} is computed on token 0, not on token -1 (axis N)" in said
    assert len(problems) == 7, said  # logits has no head axis; scores[0].sum and max stay right


def test_token_0s_score_range_is_token_0s():
    lesson = find_lesson("moe-routing")
    step = next(s for s in lesson.steps if s.stop == "layers.1.mlp.gate.scores")
    recorder = Recorder()
    run(lesson.run, [recorder])
    order = [e.name for e in recorder.events]
    seen = {n: recorder.tensors()[n] for n in order[: order.index(step.stop) + 1]}
    from stepper.lessons.templates import render

    said = render(step.explain, Context(prepare(lesson.run), seen))
    token0 = seen["layers.1.mlp.gate.scores"][0]
    assert f"min {token0.min():.3f}, max {token0.max():.3f}" in said
    assert seen["layers.1.mlp.gate.scores"].min() < token0.min(), "the whole tensor's range differs (else no test)"


# ---------------------------------------------------------------------------------------------
# Lesson text at 80 columns


def texts_at_their_stops(lesson):
    """(text, context) for every text a walk shows, the context as it is when it is shown."""
    plan = prepare(lesson.run)
    recorder = Recorder()
    result = run(lesson.run, [recorder])
    order, everything = [e.name for e in recorder.events], recorder.tensors()
    out = [(lesson.intro, Context(plan))]
    for step in lesson.steps:
        ctx = Context(plan, {n: everything[n] for n in order[: order.index(step.stop) + 1]})
        out += [(step.text, ctx), (step.explain, ctx)]
        out += [(join_lines(pred.question), ctx) for pred in step.predict]
    return [*out, (lesson.outro, Context(plan, everything, result))]


@pytest.mark.parametrize("lesson", LESSONS, ids=IDS)
def test_lesson_text_fits_80_columns_without_a_broken_word(lesson):
    for text, ctx in texts_at_their_stops(lesson):
        out = io.StringIO()
        say(Console(file=out, width=80, no_color=True, highlight=False, markup=False, soft_wrap=True), text, ctx)
        lines = out.getvalue().splitlines()
        assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
        printed = set(out.getvalue().split())
        words = render(join_lines(text), ctx).split()
        assert [w for w in words if w not in printed] == [], "a word broken across lines"


# ---------------------------------------------------------------------------------------------
# The sparse-attention lesson's cost figures


def test_the_indexer_cost_facts_count_the_products_the_run_makes():
    """index_macs and mla_macs, counted from the shapes of the tensors an absorbed tiny-v32 decode
    step makes (each index head's q against a key; each head's score over the latent and the rope
    key, then its weighted sum of the latent), agree with the facts computed from the config; at
    DeepSeek-V3.2's size they are 64 x 128 and 128 x (512 + 64 + 512), and 128K saves 13.4 times."""
    from stepper.lessons import facts

    spec = RunSpec(model="tiny-v32", prompt_len=3, decode=1, attn="absorb")
    seen = tensors(spec)
    ctx = Context(prepare(spec), seen)
    q = seen["decode0.layers.0.self_attn.indexer.q_rope"]  # [B, Hi, 1, Di]
    assert facts.compute("index_macs", ctx, []) == q.shape[1] * q.shape[3]
    scored = (seen["decode0.layers.0.self_attn.q_nope_absorbed"].shape[-1]
              + seen["decode0.layers.0.self_attn.q_pe_rope"].shape[-1])
    summed = seen["decode0.layers.0.self_attn.attn_output_latent"].shape[-1]
    heads = seen["decode0.layers.0.self_attn.attn_weights"].shape[1]
    assert facts.compute("mla_macs", ctx, []) == heads * (scored + summed)
    assert facts.compute("index_macs", ctx, ["deepseek-v3.2"]) == 8192
    assert facts.compute("mla_macs", ctx, ["deepseek-v3.2"]) == 139264
    dense, sparse = 139264 * 131072, 8192 * 131072 + 139264 * 2048
    assert facts.compute("sparse_saving", ctx, ["deepseek-v3.2", "131072"]) == pytest.approx(dense / sparse)
    assert facts.compute("sparse_macs", ctx, ["deepseek-v3.2", "1000"]) == (8192 + 139264) * 1000  # all kept
    even = facts.compute("break_even", ctx, ["deepseek-v3.2"])
    assert facts.compute("sparse_saving", ctx, ["deepseek-v3.2", str(round(even))]) == pytest.approx(1.0)
    assert facts.compute("read_saving", ctx, ["deepseek-v3.2", "131072"]) == pytest.approx(
        576 * 131072 / (128 * 131072 + 576 * 2048))
    with pytest.raises(StepperError, match="no Lightning Indexer"):
        facts.compute("index_macs", ctx, ["deepseek-v3"])


def test_the_indexer_token_facts_follow_the_runs_mask():
    from stepper.lessons import facts

    lesson = find_lesson("sparse-attention")
    seen = tensors(lesson.run)
    ctx = Context(prepare(lesson.run), seen)
    mask = seen["layers.0.self_attn.indexer.mask"][0]  # [T, S]
    T = mask.shape[0]
    assert facts.compute("self_dropped", ctx, ["layers.0"]) == [t for t in range(T) if mask[t, t] != 0]
    assert facts.compute("kept_positions", ctx, ["layers.0", "-1"]) == [int(s) for s in np.nonzero(mask[-1] == 0)[0]]
    assert facts.compute("unpruned_tokens", ctx, ["layers.0"]) == sum(
        bool((mask[t, : t + 1] == 0).all()) for t in range(T))
    assert facts.compute("recent_positions", ctx, ["layers.0", "-1"]) == list(range(T - 4, T))
    scores = seen["layers.0.self_attn.indexer.index_scores"][0, -1]
    order = [int(s) for s in np.argsort(-scores, kind="stable")]  # best first; all T are in the last one's past
    kept = order[:4]
    ctx.answer = {*kept[:3], order[-1]}  # three right, the worst instead of the fourth
    said = facts.compute("kept_why", ctx, ["layers.0", "-1"])
    assert said == (f"3 of 4 right. position {order[-1]} scores {scores[order[-1]]:.3f}, rank {T} of {T}; "
                    f"position {kept[3]} scores {scores[kept[3]]:.3f}, rank 4: kept")
    ctx.answer = {T}
    missed = "; ".join(f"position {s} scores {scores[s]:.3f}, rank {order.index(s) + 1}: kept" for s in sorted(kept))
    assert facts.compute("kept_why", ctx, ["layers.0", "-1"]) == (
        f"0 of 4 right. position {T} is not in its past (positions 0 to {T - 1}); {missed}; it keeps exactly 4")


def test_a_passed_check_names_the_model_the_exercise_runs_on(tmp_path, monkeypatch):
    """index_scores runs only where there is an indexer: the line after a pass says --model tiny-v32."""
    monkeypatch.chdir(tmp_path)
    lesson = find_lesson("sparse-attention")
    done = stepper("lesson", "check", "sparse-attention", "--file", str(lesson.solution), "--plain")
    assert done.exit_code == 0, done.stdout
    assert f"`stepper run --use {lesson.solution} --model tiny-v32` runs the whole model" in flat(done.stdout)


def test_a_lesson_on_a_model_that_does_not_compute_its_stops_is_refused_before_the_workspace(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = stepper("lesson", "start", "delta-state", "--model", "tiny-glm5", "--workspace", "ws", "--plain", stdin="")
    assert out.exit_code == 2 and out.stderr == (
        "stepper: error: lesson delta-state stops at prefill.layers.0.self_attn.k_unit, which --model tiny-glm5 does "
        "not compute: walk it on tiny-kimi-linear's family, or leave --model out\n")
    assert not (tmp_path / "ws").exists()


def test_a_lesson_on_another_model_plans_its_run_once(tmp_path, monkeypatch):
    """Checking the stops against --model and the walk share one plan: a checkpoint's headers are
    read once, not twice."""
    monkeypatch.chdir(tmp_path)
    plans = []
    real = session.prepare
    monkeypatch.setattr(session, "prepare", lambda *a, **k: plans.append(a[0].model) or real(*a, **k))
    out = stepper("lesson", "start", "rmsnorm", "--model", "tiny-v3", "--workspace", "ws", "--plain", stdin="q\n")
    assert out.exit_code == 0, out.stdout + out.stderr
    assert "quit at step" in out.stdout and plans == ["tiny-v3"]


def test_a_step_heading_too_long_for_80_columns_is_whole_on_a_terminal_and_through_a_pipe(tmp_path):
    """The step's heading names the tensor about to be predicted: a rule would cut it short
    (`› compressed attention › sin…`), so a heading too long for one is printed whole instead."""
    from tests.helpers.terminal import on_terminal

    heading = "step 1/6 · layer 0 (sliding window, hash-routed) › compressed attention › sink_mass"
    screen = on_terminal("lesson", "start", "compressed-attention", "--workspace", tmp_path / "ws", columns=80,
                         env={"STEPPER_DATA_DIR": str(tmp_path / "data")})
    at = next(i for i, line in enumerate(screen.lines) if line.startswith("step 1/6"))
    assert " ".join(line.strip() for line in screen.lines[at:at + 2]) == heading
    assert all(len(line) <= 80 for line in screen.lines) and "…" not in screen.lines[at]
    piped = stepper("lesson", "start", "compressed-attention", "--workspace", str(tmp_path / "ws2"), "--plain")
    assert heading in piped.stdout.splitlines()


def test_a_stops_footer_lists_the_pictures_of_the_lessons_model(tmp_path, monkeypatch):
    """Lesson 12 walks Kimi Linear: its stops offer s state (the delta rule's state), as the debugger's do,
    and not s scales (its weights are BF16: no FP8 block scales to draw)."""
    monkeypatch.chdir(tmp_path)
    out = stepper("lesson", "start", "delta-state", "--workspace", "ws", "--plain", stdin="\n" * 8 + "q\n")
    assert "s attention|routing|hist|state · w where · q quit" in flat(out.stdout)


def test_check_of_a_missing_file_is_a_usage_error_and_an_empty_one_names_the_lessons_function(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    missing = stepper("lesson", "check", "hyper-connections", "--file", str(tmp_path / "nowhere.py"), "--plain")
    assert missing.exit_code == 2
    assert missing.stderr == f"stepper: error: --file {tmp_path / 'nowhere.py'}: no such file\n"
    (tmp_path / "ws").mkdir()
    folder = stepper("lesson", "check", "hyper-connections", "--file", "ws", "--plain")  # (it said: no such file)
    assert folder.exit_code == 2
    assert folder.stderr == "stepper: error: --file ws: is a folder; give the exercise's .py file in it\n"
    (tmp_path / "empty.py").write_text("")
    empty = stepper("lesson", "check", "hyper-connections", "--file", "empty.py", "--plain")
    assert empty.exit_code == 1 and "empty.py defines none of the exercise functions (sinkhorn)" in empty.stdout


def test_a_gated_pool_that_overflows_on_large_gates_does_not_pass(tmp_path, monkeypatch):
    """Lesson 14's hint says the max keeps exp from overflowing: its check has gates of 1000."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "naive.py").write_text("import numpy as np\n\n\ndef gated_pool(slots_kv, slots_gate):\n"
                                       "    w = np.exp(slots_gate)\n    w = w / w.sum(axis=2, keepdims=True)\n"
                                       "    return w, np.sum(slots_kv * w, axis=2)\n")
    out = stepper("lesson", "check", "compressed-attention", "--file", "naive.py", "--plain")
    assert out.exit_code == 1
    assert "✗ gated_pool differs on large gates [[1000, -1000], [1001, -1001]]" in out.stdout
