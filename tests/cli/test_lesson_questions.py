"""What a prediction asks can be worked out from what the walk showed before it, and a likely
slip gets a reason that names it (lessons delta-state and compressed-attention)."""

from __future__ import annotations

import pytest
from helpers.cli import stepper

from stepper.lessons.schema import find_lesson
from stepper.lessons.walk import right_answers


def walked(name: str, workspace, lines: list[str]) -> str:
    out = stepper("lesson", "start", name, "--plain", "--workspace", workspace / "lessons",
                  stdin="\n".join(lines) + "\n", env={"STEPPER_DATA_DIR": str(workspace / "data")})
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("name, question, stated", [
    ("compressed-attention", "What is the shape of `layers.1.attn.compressor.slot_weights`?", "head_dim = 32"),
    ("delta-state", "What is the shape of `decode1.layers.3.self_attn.key_states`?", "MLA with 4 heads"),
])
def test_a_size_asked_for_is_stated_before_the_question(tmp_path, name, question, stated):
    """The compressor's channels (head_dim) and the MLA layer's heads were nowhere before their
    shape questions: a learner could only guess them."""
    out = walked(name, tmp_path, right_answers(find_lesson(name)))
    before = out.partition(question)[0]
    assert question in out and stated in " ".join(before.split()), before[-1500:]


def test_a_state_counted_in_numbers_is_told_they_take_4_bytes(tmp_path):
    lines = right_answers(find_lesson("delta-state"))
    at = lines.index("16384.0")
    out = walked("delta-state", tmp_path, [*lines[:at], "4096", *lines[at:]])
    assert "✗ that is how many numbers it holds: a float32 takes 4 bytes" in out, out[-3000:]
