"""A learner's loop that never ends: `lesson check` and `lesson watch` stop it after a time limit
and report the line it was on, instead of waiting forever (watch deaf to saves and q)."""

import _thread
import re
import threading

import pytest
from typer.testing import CliRunner

from stepper.cli.main import app
from stepper.lessons import check
from stepper.lessons.schema import find_lesson
from stepper.lessons.workspace import Workspace

LOOPS = "import numpy as np\n\n\ndef softmax(x, axis=-1):\n    while True:\n        x = x + 0\n"
SWALLOWS = ("import numpy as np\n\n\ndef softmax(x, axis=-1):\n    while True:\n        try:\n            x = x + 0\n"
            "        except Exception:\n            pass\n")
LOADS_FOREVER = "import numpy as np\n\nwhile True:\n    pass\n"


@pytest.fixture(autouse=True)
def quick(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPPER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(check, "TIME_LIMIT", 0.5, raising=False)
    stuck = threading.Timer(60, _thread.interrupt_main)  # without a limit the command would never end
    stuck.start()
    yield
    stuck.cancel()


def stepper(*args: str, stdin: str = ""):
    return CliRunner().invoke(app, list(args), input=stdin)


@pytest.mark.parametrize("code, lines, what", [(LOOPS, "56", "in softmax"), (SWALLOWS, "56789", "in softmax"),
                                               (LOADS_FOREVER, "34", "loading it")], ids=["loops", "swallows", "loads"])
def test_check_stops_a_loop_that_never_ends_at_its_line(tmp_path, code, lines, what):
    (tmp_path / "mine.py").write_text(code)
    done = stepper("lesson", "check", "tour", "--file", "mine.py", "--plain")
    out = " ".join(done.stdout.split())
    assert done.exit_code == 1, out
    said = f"mine.py line [{lines}], {what}: still running after 0.5 s, stopped there \\(a loop that never ends\\?\\)"
    assert re.search(said, out), out  # the line the loop was on when it was stopped
    assert "not yet: fix it and check again" in out


def test_watch_goes_on_after_a_loop_that_never_ends(tmp_path):
    path, _ = Workspace().ensure(find_lesson("tour"))
    path.write_text(LOOPS)
    done = stepper("lesson", "watch", "tour", "--plain", stdin="q\n")  # q is read once the check has given up
    assert done.exit_code == 0, done.stdout
    assert "still running after 0.5 s" in done.stdout and "stopped watching" in done.stdout
