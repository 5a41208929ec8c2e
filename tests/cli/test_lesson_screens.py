"""Every lesson walked to its end at 80 columns on a terminal, its right answers typed at the
prompts and its stops' commands run: no line break falls inside a formula that fits on a line,
and the pictures' legends keep each item whole.

The rule (`broken_formulas`): a formula is a bracket group attached to the character before it
(relu(q . k), x[i], f(g(x))), any [...] (a list, a shape), or arithmetic on numbers in brackets or
with its result ((128 + 16) * 4 = 576); any other "(" after a space opens a remark in prose, which
may wrap. A screen line that ends inside a formula, followed by a line that goes on at the same
indent or less (plain wrapping, not an indented layout such as a shape label's named dims), breaks
that formula, unless the formula is longer than the line (nothing could keep it whole).
"""

from __future__ import annotations

import pytest

from stepper.lessons.prose import formula_spans, wrapped
from stepper.lessons.schema import all_lessons
from stepper.lessons.walk import right_answers
from tests.helpers.terminal import on_terminal

COLUMNS = 80
LESSONS = all_lessons()

# Legends of the pictures the lessons' stops draw: each item whole on its own line at 80 columns
LEGEND_LINES = {
    "compressed-attention": ["W window", "█ read by a kept entry (a CSA entry reads its window and the one before)",
                             "× read only by entries the indexer dropped", "· not pooled yet"],
    # the note under s state's table wraps at the terminal's width, not at the table's (about 50 columns)
    "delta-state": ["σ₁² share: how much of S's energy (the sum of its squared singular values) its"],
}


def indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def broken_formulas(lines: list[str], width: int = COLUMNS) -> list[str]:
    """The lines that break a formula which would fit on one line (the module's rule)."""
    broken = []
    for n, line in enumerate(lines[:-1]):
        following = lines[n + 1]
        if not following.strip() or indent(following) > indent(line):
            continue
        joined = line + " " + following.strip()  # the two lines as they would read whole
        if any(start < len(line) < end and end - start <= width - indent(line) for start, end in formula_spans(joined)):
            broken.append(f"{line!r} / {following!r}")
    return broken


def test_the_rule_finds_the_breaks_it_names():
    assert broken_formulas(["the head-weighted sum of relu(q", ". k), as in V3.2"])
    assert broken_formulas(["Position 9 keeps [0,", "1, -1, -1]: -1 where it has fewer"])
    assert broken_formulas(["which now holds 7 + 1 positions: (128 +", "16) * 4 = 576 bytes each in float32."])
    assert broken_formulas(["which now holds 7 + 1 positions: (128 + 16) *", "4 = 576 bytes each in float32."])
    assert not broken_formulas(["a remark (which may wrap", "like prose) goes on"])
    assert not broken_formulas(["a shape label [B=1 batch,", "    T=7 positions]"]), "an indented layout"
    assert not broken_formulas(["[" + ", ".join(["10"] * 30), "10]"]), "too long for any line"
    assert not broken_formulas(["    0   9 10 27 28     1  9 21 28 *", "    1   9 10 16 23     9 12 16 23"]), "a table"


def test_lesson_prose_wraps_around_formulas():
    text = "Each query scores every entry: the head-weighted sum of relu(q . k), as in DeepSeek-V3.2"
    assert wrapped(text, 64) == ["Each query scores every entry: the head-weighted sum of",
                                 "relu(q . k), as in DeepSeek-V3.2"]
    assert wrapped("a remark (which may wrap like prose) here", 20) == ["a remark (which may", "wrap like prose)",
                                                                         "here"]
    assert wrapped("it holds 7 + 1 positions: (128 + 16) * 4 = 576 bytes each", 40) == [
        "it holds 7 + 1 positions:", "(128 + 16) * 4 = 576 bytes each"], "arithmetic is a formula"
    assert wrapped("keys [1, 2, 3, 4, 5, 6]", 10) == ["keys [1,", "2, 3, 4,", "5, 6]"], "longer than the line: split"


@pytest.mark.parametrize("lesson", LESSONS, ids=[lesson.name for lesson in LESSONS])
def test_a_lessons_screens_at_80_columns_keep_formulas_and_legends_whole(tmp_path, lesson):
    screen = on_terminal("lesson", "start", lesson.name, "--workspace", tmp_path / "ws", columns=COLUMNS,
                         typed=right_answers(lesson), env={"STEPPER_DATA_DIR": str(tmp_path / "data")},
                         timeout=300, settle=0.1)
    assert screen.code == 0, screen.text[-3000:]
    assert "end of the run" in screen.text and "Traceback" not in screen.text
    assert broken_formulas(screen.lines) == []
    for legend in LEGEND_LINES.get(lesson.name, []):
        assert legend in screen.lines, screen.text
