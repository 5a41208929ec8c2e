"""A table fitted to the terminal: each header over its values at every width, nothing cut or dropped."""

import io
import re

import pytest
from helpers.terminal import on_terminal
from rich.console import Console
from rich.text import Text

from stepper.views.fitted_table import fitted

COLUMNS = (("#", "right"), ("tensor", "left"), ("status", "left"), ("max|err|", "right"), ("note", "left"))
ROWS = [
    {"#": "0", "tensor": "embed", "status": Text("match", style="green"), "max|err|": "0.00e+00", "note": ""},
    {"#": "27", "tensor": "layers.0.mlp.gate_proj", "status": Text("mismatch", style="red"), "max|err|": "2.56e-02",
     "note": "3808 of 3808 entries outside tolerance (worst at [0,1,531])"},
]


def shown(width: int) -> list[str]:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(fitted("a vs b", COLUMNS, ROWS, "tensor", ("note",), width))
    return [line.rstrip() for line in console.file.getvalue().splitlines()]


def ends(line: str, text: str) -> int:
    return line.index(text) + len(text)


def test_wide_one_line_a_row():
    lines = shown(120)
    assert lines[0] == "a vs b"
    assert lines[3].split() == ["27", "layers.0.mlp.gate_proj", "mismatch", "2.56e-02", "3808", "of", "3808", "entries",
                                "outside", "tolerance", "(worst", "at", "[0,1,531])"]


def test_the_note_goes_under_its_row_and_the_figures_stay_under_their_headers():
    lines = shown(60)
    assert lines[1:3] == [" #  tensor                  status    max|err|", "    note"]
    assert lines[3] == " 0  embed                   match     0.00e+00"
    assert ends(lines[1], "max|err|") == ends(lines[3], "0.00e+00") == ends(lines[4], "2.56e-02")
    assert lines[1].index("status") == lines[4].index("mismatch")
    assert lines[5:7] == ["    3808 of 3808 entries outside tolerance (worst at", "    [0,1,531])"]  # an index, whole


def test_a_styled_note_under_its_row_keeps_its_style_and_a_plain_one_is_dim():
    rows = [{**ROWS[1], "note": Text("read as q_proj", style="yellow")}, {**ROWS[0], "note": "plain"}]
    console = Console(file=io.StringIO(), width=60, force_terminal=True, color_system="standard")
    console.print(fitted("", COLUMNS, rows, "tensor", ("note",), 60))
    out = console.file.getvalue()
    assert "\x1b[33mread as q_proj" in out and "\x1b[2mplain" in out  # yellow as given; dim


def test_narrower_the_name_takes_a_line_of_its_own():
    lines = shown(30)
    assert lines[1:4] == [" #  tensor", "    status    max|err|", "    note"]
    assert lines[4:6] == [" 0  embed", "    match     0.00e+00"]
    assert lines[6:9] == ["27  layers.0.mlp.gate_proj", "    mismatch  2.56e-02", "    3808 of 3808 entries"]
    assert all(len(line) <= 30 for line in lines)


def test_a_second_line_of_empty_cells_is_a_dash_not_a_blank_line():
    rows = [{"#": "5", "tensor": "layers.0.self_attn:input", "status": "", "max|err|": "", "note": "no hook"}]
    console = Console(file=io.StringIO(), width=30, color_system=None)
    console.print(fitted("", COLUMNS, rows, "tensor", ("note",), 30))
    lines = [line.rstrip() for line in console.file.getvalue().splitlines()]
    assert lines[3:6] == ["5  layers.0.self_attn:input", "   -", "   no hook"]


def test_a_name_wider_than_the_terminal_with_its_number_goes_labelled_not_cut_from_its_number():
    rows = [{**ROWS[1], "tensor": "layers.10.self_attn.kv_b_proj"}]
    console = Console(file=io.StringIO(), width=32, color_system=None)
    console.print(fitted("", COLUMNS, rows, "tensor", ("note",), 32))
    lines = [line.rstrip() for line in console.file.getvalue().splitlines()]
    assert lines[0].startswith("tensor and then its") and lines[2] == "layers.10.self_attn.kv_b_proj"


def test_too_narrow_for_that_each_cell_is_labelled():
    lines = shown(18)
    assert lines[1:4] == ["tensor and then", "its #, status,", "max|err|, note"]
    assert lines[4:8] == ["embed", "  # 0  status", "  match  max|err|", "  0.00e+00"]
    assert " ".join(lines[8:]).split() == ["layers.0.mlp.gate_", "proj", "#", "27", "status", "mismatch", "max|err|",
                                           "2.56e-02", "note", "3808", "of", "3808", "entries", "outside",
                                           "tolerance", "(worst", "at", "[0,1,531])"]


@pytest.mark.parametrize("command", ["verify", "diff"])
def test_verify_and_diff_on_an_80_column_terminal(tmp_path, command):
    """What a porter saw: at 80 to 120 columns the headers sat over the wrong values."""
    import shutil
    from pathlib import Path

    import numpy as np
    from safetensors.numpy import load_file, save_file

    fixture = Path(__file__).resolve().parents[2] / "fixtures" / "tiny-prefill-decode"
    tensors = load_file(str(fixture / "tensors.safetensors"))
    name = "decode0.layers.1.self_attn.k_pe"
    tensors[name] = tensors[name] + np.float32(1.0)
    save_file(tensors, str(tmp_path / "cand.safetensors"))
    shutil.copytree(fixture, tmp_path / "fx")
    args = ("fixtures", "verify", "fx") if command == "verify" else ("diff", "fx/tensors.safetensors")
    for columns in (80, 100):
        screen = on_terminal(*args, "cand.safetensors", columns=columns, cwd=tmp_path)
        assert screen.code == 1
        lines = screen.lines
        row = next(i for i, line in enumerate(lines) if line.endswith(name) or f"{name} " in line)
        header = next(line for line in lines if "status" in line)
        figures = lines[row] if "mismatch" in lines[row] or "differs" in lines[row] else lines[row + 1]
        status = "mismatch" if command == "verify" else "differs"
        assert header.index("status") == figures.index(status), (columns, header, figures)
        cosine = next(line for line in lines if "cosine" in line)
        figure = re.search(r"\d\.\d{8}", figures)
        assert figure and ends(cosine, "cosine") == figure.end(), (columns, cosine, figures)
        assert "entries outside tolerance" in " ".join(lines[row:row + 4])
        assert max(len(line) for line in lines) <= columns
