"""`stepper lesson start` with --prompt, --model or an empty NAME: what the learner is told."""

from helpers.cli import stepper


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
