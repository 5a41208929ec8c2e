"""The pictures, rendered to plain text and read back cell by cell against hand-derived values."""

import io
import re

import numpy as np
import pytest
from rich.cells import cell_len
from rich.console import Console

from stepper.views import attention_map, histogram_picture, pictures, routing_map, scale_grids, summary


def render(renderable, width: int = 100) -> str:
    console = Console(record=True, width=width, no_color=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def row_line(text: str, label: str) -> str:
    """The grid line whose row label is `label`."""
    return next(line for line in text.splitlines() if re.match(rf"^\s*{re.escape(label)} ", line))


def axis_columns(text: str, corner: str, labels: list[str]) -> list[int]:
    """The text column of each tick label on the axis line that starts with `corner`."""
    axis = next(line for line in text.splitlines() if line.lstrip().startswith(corner))
    found, start = [], len(axis) - len(axis.lstrip()) + len(corner)
    for label in labels:
        start = axis.index(label, start)
        found.append(start)
        start += len(label)
    return found


def causal_uniform(t_len: int) -> np.ndarray:
    """Row t attends uniformly to keys 0..t: [t_len, t_len]."""
    w = np.tril(np.ones((t_len, t_len), np.float32))
    return w / w.sum(axis=1, keepdims=True)


def assert_fits(text: str, width: int) -> None:
    wide = [line for line in text.splitlines() if cell_len(line) > width]
    assert not wide, wide


# ---------------------------------------------------------------------------------------------
# attention_heatmap


def test_causal_3x3_shades_and_masked_cells():
    w = np.array([[[[1.0, 0.0, 0.0], [0.6, 0.4, 0.0], [0.2, 0.3, 0.5]]]], np.float32)  # [1, 1, 3, 3]
    text = render(attention_map.attention_heatmap(w))
    cols = axis_columns(text, "t\\s", ["0", "1", "2"])
    expected = {"0": "█··", "1": "▓▒·", "2": "░▒▒"}  # ░ ≤¼ < ▒ ≤½ < ▓ ≤¾ < █, · exactly 0
    for t, cells in expected.items():
        row = row_line(text, t)
        assert "".join(row[c] for c in cols) == cells, (t, row)
    assert row_line(text, "0")[cols[0] + 1] == "█"  # a cell is two characters wide here
    assert "head 0" in text
    assert "· exactly 0 (masked)" in text
    assert "[B=1, H=1, T=3, S=3]" in text
    assert "pooled" not in text


def test_small_weight_is_not_drawn_like_a_masked_one():
    w = np.array([[[[1.0, 0.0], [0.999, 0.001]]]], np.float32)
    text = render(attention_map.attention_heatmap(w))
    cols = axis_columns(text, "t\\s", ["0", "1"])
    row = row_line(text, "1")
    assert (row[cols[0]], row[cols[1]]) == ("█", "░")
    assert row_line(text, "0")[cols[1]] == "·"


def test_heads_side_by_side_and_chosen_heads():
    w = np.broadcast_to(causal_uniform(5), (1, 8, 5, 5))
    text = render(attention_map.attention_heatmap(w))
    first = next(line for line in text.splitlines() if "head 0" in line)
    assert all(f"head {h}" in first for h in range(4))  # four small maps fit on one line
    assert "head 4" not in text
    assert "max_heads=4" in text
    text = render(attention_map.attention_heatmap(w, heads=[6, 2]))
    assert "head 6" in text and "head 2" in text and "head 0" not in text


def test_big_attention_is_max_pooled_within_the_width():
    w = np.broadcast_to(causal_uniform(600), (1, 64, 600, 600))
    text = render(attention_map.attention_heatmap(w))
    assert_fits(text, 100)
    assert "max-pooled" in text and "600×600" in text
    assert all(f"head {h}" in text for h in range(4))
    assert len(text.splitlines()) < 40
    grid_rows = [line for line in text.splitlines() if re.match(r"^\s*\d* [░▒▓█·]{10,}", line)]
    assert 0 < len(grid_rows) <= 4 * pictures.MAX_ROWS
    assert max(len(re.sub(r"^\s*\d* ", "", r).split()[0]) for r in grid_rows) <= pictures.MAX_COLS
    row0 = row_line(text, "0")
    assert "█" in row0 and row0.rstrip().endswith("·")  # key 0 carries all of query 0; the future is masked


def test_decode_step_is_a_bar_per_head():
    w = np.array([[[[0.1, 0.6, 0.3, 0.0]], [[0.25, 0.25, 0.25, 0.25]]]], np.float32)  # [1, 2, 1, 4]
    text = render(attention_map.attention_heatmap(w))
    cols = axis_columns(text, "", ["0", "1", "2", "3"])
    head0, head1 = row_line(text, "head 0"), row_line(text, "head 1")
    assert "".join(head0[c] for c in cols) == "░▓▒·"
    assert "".join(head1[c] for c in cols) == "░░░░"
    assert "max 0.6 at s=1" in head0
    assert "decode step" in text


def test_bad_heads_are_refused():
    with pytest.raises(ValueError):
        attention_map.attention_heatmap(np.ones((1, 2, 3, 3)), heads=[2])
    with pytest.raises(ValueError):
        attention_map.attention_heatmap(np.ones((3, 3)))


# ---------------------------------------------------------------------------------------------
# routing_map

IDX = np.array([[2, 5], [0, 5], [7, 3]], np.int64)
WEIGHT = np.array([[0.7, 0.3], [0.6, 0.4], [0.9, 0.1]], np.float32)


def test_routing_cells_load_and_summary():
    text = render(routing_map.routing_map(IDX, WEIGHT, 8))
    cols = axis_columns(text, "tok\\e", ["0"])
    first = cols[0]
    cells = {t: row_line(text, str(t))[first:first + 8] for t in range(3)}
    assert {e for e, ch in enumerate(cells[0]) if ch != "·"} == {2, 5}
    assert {e for e, ch in enumerate(cells[1]) if ch != "·"} == {0, 5}
    assert cells[0][2] == "█" and cells[0][5] == "▒"  # 0.7 / 0.9 > 3/4; 0.3 / 0.9 in (1/4, 1/2]
    assert "e2 0.70  e5 0.30" in row_line(text, "0")  # the picks, in rank order
    load = row_line(text, "load #")[first:first + 8]
    assert load == "1·11·2·1"
    assert load[2] == "1"
    assert "experts used 5/8" in text and "max load 2 (expert 5)" in text and "3 tokens × top-2" in text


def test_routing_labels():
    text = render(routing_map.routing_map(IDX, WEIGHT, 8, token_labels=["The", "cat", "sat"]))
    assert row_line(text, "cat")


def test_many_experts_are_binned_and_many_tokens_cut():
    rng = np.random.default_rng(0)
    n_tokens = 50
    idx = np.stack([rng.choice(384, 8, replace=False) for _ in range(n_tokens)])
    weight = rng.random((n_tokens, 8)).astype(np.float32)
    text = render(routing_map.routing_map(idx, weight, 384))
    assert_fits(text, 100)
    assert "48 bins of 8" in text
    assert f"{n_tokens - pictures.TOKEN_ROWS} more tokens not shown" in text
    assert f"experts used {len(np.unique(idx))}/384" in text  # the hidden tokens count in the load
    row0 = row_line(text, "0")
    counts = np.bincount(idx[0] // 8, minlength=48)
    cells = re.sub(r"^\s*0 ", "", row0)[:48]
    assert [0 if ch == "·" else int(ch) for ch in cells] == counts.tolist()


def test_bad_routing_is_refused():
    with pytest.raises(ValueError):
        routing_map.routing_map(np.array([[8]]), np.array([[1.0]]), 8)
    with pytest.raises(ValueError):
        routing_map.routing_map(IDX, WEIGHT[:, :1], 8)


# ---------------------------------------------------------------------------------------------
# histogram


def histogram_rows(text: str) -> list[tuple[float, float, int, bool]]:
    rows = []
    for line in text.splitlines():
        m = re.match(r"^\[\s*(\S+),\s*(\S+)[)\]].*?(\d+)(\s+← 0)?$", line)
        if m:
            rows.append((float(m[1]), float(m[2]), int(m[3]), bool(m[4])))
    return rows


def test_histogram_counts_match_numpy():
    rng = np.random.default_rng(1)
    values = rng.normal(size=500)
    array = np.concatenate([values, [np.nan, np.nan, np.inf, -np.inf]])
    text = render(histogram_picture.histogram(array, bins=10, title="h"))
    rows = histogram_rows(text)
    counts, edges = summary.look(array)[1].view(10)  # the views' bins: runs of the exact lattice bins
    assert [r[2] for r in rows] == counts.tolist() == np.histogram(values, bins=edges)[0].tolist()
    assert [r[0] for r in rows] == [float(f"{e:.4g}") for e in edges[:-1]] and rows[-1][1] == float(f"{edges[-1]:.4g}")
    assert rows[0][0] <= values.min() and values.max() < edges[-1]
    assert "500 finite values of 504" in text
    assert "NaN 2" in text and "+Inf 1" in text and "-Inf 1" in text
    marked = [r for r in rows if r[3]]
    assert len(marked) == 1 and marked[0][0] <= 0 < marked[0][1]


def test_histogram_without_zero_or_finite_values():
    text = render(histogram_picture.histogram(np.arange(1.0, 11.0), bins=5))
    assert [r[2] for r in histogram_rows(text)] == [2, 2, 2, 2, 2]
    assert "← 0" not in text
    assert "no finite values among 2" in render(histogram_picture.histogram(np.array([np.nan, np.inf])))


def test_an_integer_tensors_histogram_names_its_bins_by_their_integers():
    """A bin per value where the range fits (labelled by the value), else runs of whole integers
    labelled by their first and last value; the caption counts values, not a width."""
    text = render(histogram_picture.histogram(np.array([[7, 5], [5, 7], [7, 9]], np.int64), bins=24))
    lines = text.splitlines()
    assert [line.split()[0] for line in lines[:5]] == ["5", "6", "7", "8", "9"]
    assert [int(line.split()[-1]) for line in lines[:5]] == [2, 0, 3, 0, 1]
    assert lines[5].endswith("5 bins of 1 value each")
    text = render(histogram_picture.histogram(np.arange(-2, 48, dtype=np.int32), bins=24))  # 50 values: runs of 3
    labels = [line[: line.index("]") + 1] for line in text.splitlines()[:-1]]
    assert labels == [f"[{a:2}, {a + 2:2}]" for a in range(-2, 48, 3)]
    assert text.splitlines()[-1].endswith("17 bins of 3 values each")
    assert render(histogram_picture.histogram(np.zeros(4, np.int8))).splitlines()[-1].endswith("1 bin of 1 value")


def test_an_integer_tensor_below_zero_marks_no_bin_as_zeros():
    """An integer tensor's last edge is past its last bin (values -3..-1: edges up to 0): the bin
    of -1 was marked as holding 0 (V4's attn.chosen of a short prompt is -1 throughout)."""
    for values in ([-3, -2, -1, -1], [-1, -1]):
        assert "← 0" not in render(histogram_picture.histogram(np.array(values, np.int64)))
    marked = [line for line in render(histogram_picture.histogram(np.array([-1, 0, 2]))).splitlines() if "← 0" in line]
    assert [line.split()[0] for line in marked] == ["0"]


# ---------------------------------------------------------------------------------------------
# scale_grid


def test_scale_grid_shades_and_caption():
    scales = np.full((5, 56), 1e-4, np.float32)
    scales[2, 10] = 1e-3
    text = render(scale_grids.scale_grid(scales, title="q_a_proj"))
    assert "scale_inv [5, 56]" in text
    assert "max 1.00e-03 at block [2, 10]" in text
    first = axis_columns(text, "r\\c", ["0"])[0]
    grid = {r: row_line(text, str(r))[first:first + 56] for r in range(5)}
    assert grid[2][10] == "█"
    assert set(grid[2][:10] + grid[2][11:]) == {"░"} and all(set(grid[r]) == {"░"} for r in (0, 1, 3, 4))
    assert "pooled" not in text


def test_big_scale_grid_is_pooled():
    scales = np.exp(np.random.default_rng(2).normal(size=(96, 12))) * 1e-4
    text = render(scale_grids.scale_grid(scales))
    assert_fits(text, 100)
    assert "scale_inv [96, 12]" in text
    assert "block of 4 rows × 1 cols" in text
    rows = [line for line in text.splitlines() if re.match(r"^\s*\d* [░▒▓█]+$", line)]
    assert len(rows) == 24


def test_scale_grid_marks_bad_scales():
    text = render(scale_grids.scale_grid(np.array([[1.0, 0.0], [2.0, np.nan]])))
    assert "2 scales are not positive finite numbers" in text
    assert "!" in row_line(text, "0")


# ---------------------------------------------------------------------------------------------
# every picture: narrow consoles, colour


def every_picture():
    rng = np.random.default_rng(3)
    idx = np.stack([rng.choice(384, 8, replace=False) for _ in range(30)])
    return [
        attention_map.attention_heatmap(np.broadcast_to(causal_uniform(300), (1, 4, 300, 300)), title="attn"),
        attention_map.attention_heatmap(np.full((1, 4, 1, 200), 1 / 200, np.float32)),
        routing_map.routing_map(IDX, WEIGHT, 8, token_labels=["a-very-long-token-label", "b", "c"]),
        routing_map.routing_map(idx, rng.random((30, 8)), 384),
        histogram_picture.histogram(rng.normal(size=1000), width=80),
        scale_grids.scale_grid(np.exp(rng.normal(size=(16, 56))) * 1e-4),
    ]


@pytest.mark.parametrize("width", [40, 60, 100])
def test_pictures_fit_the_console(width):
    for picture in every_picture():
        assert_fits(render(picture, width), width)


def test_colour_render():
    console = Console(width=100, force_terminal=True, color_system="truecolor", file=io.StringIO())
    for picture in every_picture():
        console.print(picture)
    out = console.file.getvalue()
    assert "\x1b[38;2;" in out and "█" in out
