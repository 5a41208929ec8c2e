"""`--plain` and NO_COLOR mean text alone: not one escape sequence, bold, dim and italic included
(Rich's no_color alone keeps those), even where colour is forced or the output is a terminal."""

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import cli as command_line
from helpers.terminal import on_terminal
from safetensors.numpy import load_file, save_file

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "fixtures" / "tiny-prefill-decode"
ESCAPE = re.compile("\x1b")
FORCED = {"FORCE_COLOR": "1", "TERM": "xterm-256color", "NO_COLOR": None, "COLUMNS": "120"}
COMMANDS = [
    ("run", "--layer", "0"),
    ("explain", "self_attn.q_a"),
    ("tree",),
    ("lesson", "list"),
    ("fixtures", "verify", "fx", "cand.safetensors"),
    ("fixtures", "names"),
    ("diff", "fx/tensors.safetensors", "cand.safetensors"),
]


@pytest.fixture(scope="module")
def place(tmp_path_factory) -> Path:
    """A fixture and a candidate one of whose tensors differs (a verdict with its styled marks)."""
    root = tmp_path_factory.mktemp("plain")
    shutil.copytree(FIXTURE, root / "fx")
    tensors = load_file(str(FIXTURE / "tensors.safetensors"))
    first = sorted(tensors)[3]
    tensors[first] = tensors[first] + np.float32(0.5)
    save_file(tensors, str(root / "cand.safetensors"))
    return root


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_colour_forced_writes_styles_and_plain_none(place, args):
    styled = command_line.stepper(*args, cwd=place, env=FORCED)
    assert styled.returncode in (0, 1), styled.stderr
    assert "\x1b[1m" in styled.stdout or "\x1b[2m" in styled.stdout, "the control: forced colour styles its output"
    plain = command_line.stepper(*args, "--plain", cwd=place, env=FORCED)
    assert plain.returncode == styled.returncode
    assert ESCAPE.findall(plain.stdout + plain.stderr) == []
    assert ESCAPE.sub("", plain.stdout).strip()
    unset = command_line.stepper(*args, cwd=place, env={**FORCED, "NO_COLOR": "1"})
    assert ESCAPE.findall(unset.stdout + unset.stderr) == []


def test_verify_problems_plain_on_a_terminal(place):
    """The case a porter met: a wide terminal, `verify --problems --plain`."""
    screen = on_terminal("fixtures", "verify", "fx", "cand.safetensors", "--problems", "--plain",
                         columns=120, cwd=place)
    assert screen.code == 1
    assert b"\x1b[" not in screen.raw
    assert "differ" in screen.text or "MISMATCH" in screen.text.upper()
