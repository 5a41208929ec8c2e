"""Lesson text through a pipe: each paragraph on one line (the reader's pager or editor wraps it),
never cut at 80 columns, and no line ending in spaces."""

import shutil
from pathlib import Path

from tests.helpers.cli import stepper

ROOT = Path(__file__).resolve().parents[2]


def test_piped_lesson_text_keeps_its_paragraphs_whole_without_trailing_spaces(tmp_path):
    env = {"STEPPER_DATA_DIR": str(tmp_path / "data")}
    started = stepper("lesson", "start", "tour", cwd=tmp_path, env=env)
    listed = stepper("lesson", "list", cwd=tmp_path, env=env)
    shutil.copy(ROOT / "lessons" / "01-tour" / "solution.py", tmp_path / "stepper-lessons" / "tour.py")
    checked = stepper("lesson", "check", "tour", cwd=tmp_path, env=env)
    assert (started.returncode, listed.returncode, checked.returncode) == (0, 0, 0), checked.stdout + checked.stderr
    for result in (started, listed, checked):
        lines = result.stdout.splitlines()
        assert lines and not [line for line in lines if line != line.rstrip()], result.args
    intro = next(line for line in started.stdout.splitlines() if line.startswith("stepper runs a model"))
    assert len(intro) > 120 and intro.endswith("exactly as a real FP8 checkpoint stores them.")
    turn = next(line for line in started.stdout.splitlines() if line.startswith("your turn:"))
    assert turn.endswith("if you are stuck)")
