"""A run that makes many named tensors is said to be long, before it starts, by the one plan: a note
under `stepper run`'s header, in the API a LongRunWarning when the call starts and the same note in
run.notes (stepper.run("tiny", decode=10_000) ran for many minutes with nothing said). The count
of tensors is the measure, not a time."""

import warnings

import pytest
from helpers.cli import stepper

import stepper as api
from stepper import planning


@pytest.fixture
def long_from_100(monkeypatch):
    monkeypatch.setattr(planning, "LONG_RUN", 100)  # tiny's prefill and one decode step make 199


def test_the_api_warns_before_the_run_and_notes_it(long_from_100):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        before_the_first_tensor = []
        run = api.run("tiny", prompt_len=2, decode=1, keep="*logits",
                      patch={"prefill.embed": lambda x, name: before_the_first_tensor.append(len(caught))})
    assert before_the_first_tensor == [1]
    assert [w.category for w in caught] == [api.LongRunWarning] and caught[0].filename == __file__
    line = ("a long run: it makes 199 named tensors (2 steps through 3 layers), each of them whatever keep= keeps; "
            "fewer decode= steps or layers make fewer")
    assert str(caught[0].message) == line and len(run.emitted) == 199
    assert f"note: {line}" in run.notes


def test_the_command_line_says_it_under_the_header(long_from_100):
    done = stepper("run", "--plain", "--prompt-len", "2", "--decode", "1", "--only", "*logits")
    assert done.returncode == 0, done.stderr
    assert ("note: a long run: it makes 199 named tensors (2 steps through 3 layers), each of them whatever --only "
            "keeps; fewer --decode steps or layers make fewer") in done.stdout.splitlines()[:6]


def test_a_run_under_the_count_says_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error", api.LongRunWarning)
        run = api.run("tiny", prompt_len=2, decode=1, keep="*logits")
    assert not [line for line in run.notes if "long run" in line]
    assert planning.LONG_RUN == 20_000


def test_with_json_the_note_goes_to_stderr_and_stdout_holds_json_alone(long_from_100):
    """--json printed no header, and so nothing of a long run: the note goes to stderr, as the API's warning."""
    import json

    done = stepper("run", "--json", "--prompt-len", "2", "--decode", "1", "--only", "*logits")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ("stepper: note: a long run: it makes 199 named tensors (2 steps through 3 layers), each of "
                           "them whatever --only keeps; fewer --decode steps or layers make fewer\n")
    names = [json.loads(line)["name"] for line in done.stdout.splitlines()]
    assert "prefill.logits" in names and "decode0.logits" in names and all(n.endswith("logits") for n in names)


def test_with_json_a_run_under_the_count_writes_nothing_on_stderr():
    done = stepper("run", "--json", "--prompt-len", "2", "--only", "*logits")
    assert done.returncode == 0 and done.stderr == "" and done.stdout.count("\n") == 3  # the two routers', the model's
