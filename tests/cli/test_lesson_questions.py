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


def test_the_routers_last_question_is_worked_out_from_the_groups_and_experts_shown(tmp_path):
    """Lesson 10's last step asked for how many of the 7 tokens V2 and V3 pick different experts,
    with V2's choices shown for token 2 alone: a guess. It now asks which of token 2's V3 experts
    (shown) lie in the groups V2 keeps (shown, with the rule that puts an expert in its group)."""
    lines = right_answers(find_lesson("three-routers"))
    at = lines.index("{0, 4}")
    out = walked("three-routers", tmp_path, [*lines[:at], "0, 4, 10, 15", *lines[at:]])
    question = "V2's rule keeps groups [0, 2] for token 2. Which of V3's experts [0, 4, 10, 15] could V2 pick too?"
    assert question in out and "expert e is in group e // 8" in " ".join(out.partition(question)[0].split())
    why = "✗ V2 picks only from its kept groups [0, 2]: of V3's experts, those whose group e // 8 is one of them"
    assert why in " ".join(out.split())
    assert "Over all 7 tokens, V2 picks a different set from V3's for 5" in " ".join(out.split())
