"""`stepper lesson start` with --prompt, --model or an empty NAME, and the commands the lesson messages suggest."""

import shlex
import shutil

from helpers.cli import stepper

from stepper.lessons.schema import find_lesson


def test_a_prompt_without_a_model_is_one_line_naming_lesson_starts_options(tmp_path):
    """A lesson's model is synthetic: a text prompt needs --model DIR. The error named --ids, which
    `lesson start` does not have, and came after the exercise file was made."""
    done = stepper("lesson", "start", "tour", "--prompt", "hello", "--plain", cwd=tmp_path,
                   env={"STEPPER_DATA_DIR": str(tmp_path / "data")})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == ("stepper: error: --prompt needs --model DIR, a checkpoint with its tokenizer: lesson "
                           "tour's model tiny has synthetic weights and no tokenizer\n")
    assert not (tmp_path / "stepper-lessons").exists()


def test_a_lesson_walked_on_another_model_says_its_text_is_written_for_its_own(tmp_path):
    """The tour's text speaks of tiny ("shaped like Kimi K2", "synthetic (seed 0)"): walked on
    another model, the learner is told that the numbers are that model's."""
    done = stepper("lesson", "start", "tour", "--model", "tiny-v3", "--plain", stdin="q\n", cwd=tmp_path,
                   env={"STEPPER_DATA_DIR": str(tmp_path / "data")})
    assert done.returncode == 0, done.stderr
    assert ("walking it on tiny-v3 instead of tiny, the model its text is written for: the numbers and sizes shown "
            "are tiny-v3's") in done.stdout.splitlines()


def test_an_empty_lesson_name_is_refused_not_taken_for_the_current_lesson(tmp_path):
    for command in ("start", "check", "hint", "reset"):
        done = stepper("lesson", command, "", "--plain", cwd=tmp_path, env={"STEPPER_DATA_DIR": str(tmp_path / "data")})
        assert done.returncode == 2 and done.stderr.startswith("stepper: error: no lesson '' (lessons: tour, "), command
    assert not (tmp_path / "stepper-lessons").exists() and not (tmp_path / "data").exists()


def suggested(text: str, start: str) -> list[str]:
    """The arguments of the `stepper ...` command a message suggests (the first quoted that begins with `start`)."""
    command = next(part for part in text.split("`") if part.startswith(start))
    return shlex.split(command)[1:]


def test_the_commands_suggested_for_another_workspace_work_as_shown(tmp_path):
    """With --workspace "my lessons", the commands the messages suggest name it, quoted: the next
    lesson's start made its file in ./stepper-lessons, and `start int4` (said when its file is
    missing) did not make the file that check then looked for."""
    env = {"STEPPER_DATA_DIR": str(tmp_path / "data")}
    started = stepper("lesson", "start", "tour", "--workspace", "my lessons", "--plain", stdin="q\n", cwd=tmp_path,
                      env=env)
    turn = " ".join(started.stdout.split())
    assert suggested(turn, "stepper lesson check") == ["lesson", "check", "tour", "--workspace", "my lessons"]
    shutil.copy(find_lesson("tour").solution, tmp_path / "my lessons" / "tour.py")
    passed = " ".join(stepper(*suggested(turn, "stepper lesson check"), cwd=tmp_path, env=env).stdout.split())
    assert suggested(passed, "stepper run") == ["run", "--use", "my lessons/tour.py"]
    assert suggested(passed, "stepper lesson start") == ["lesson", "start", "rmsnorm", "--workspace", "my lessons"]
    missing = stepper("lesson", "check", "int4", "--workspace", "my lessons", cwd=tmp_path, env=env)
    assert missing.returncode == 2
    made = stepper(*suggested(missing.stderr, "stepper lesson start"), stdin="q\n", cwd=tmp_path, env=env)
    assert made.returncode == 0 and (tmp_path / "my lessons" / "int4.py").is_file()
