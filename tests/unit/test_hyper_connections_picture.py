"""The hyper-connections picture: a hand-written comb matrix read back cell by cell, its sums, the
pre and post bars and the streams' sizes."""

import io

import numpy as np
import pytest
from rich.console import Console

from stepper.views.hyper_connections import hyper_connection_map


def render(renderable, width: int = 100) -> str:
    console = Console(record=True, width=width, no_color=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def test_the_comb_matrix_at_a_position_with_its_sums_and_the_weights():
    comb = np.zeros((1, 2, 2, 2), np.float32)
    comb[0, 1] = [[0.75, 0.25], [0.25, 0.75]]  # position 1: each stream keeps three quarters
    pre = np.array([[[0.1, 0.2], [0.5, 1.0]]], np.float32)
    post = np.array([[[1.0, 1.0], [2.0, 0.5]]], np.float32)
    streams = np.zeros((1, 2, 2, 4), np.float32)
    streams[0, :, 0] = 1.0  # stream 0 has RMS 1 at both positions, stream 1 is 0 then 2
    streams[0, 1, 1] = 2.0
    text = render(hyper_connection_map(comb, pre, post, streams, position=1, title="layers.0.attn_hc.comb"))
    rows = text.splitlines()
    assert rows[0] == "layers.0.attn_hc.comb" and "position 1 of 0..1" in rows[1]
    assert [r for r in rows if r.startswith("from")] == [
        "from 0    █ 0.750 ▒ 0.250  1.0000", "from 1    ▒ 0.250 █ 0.750  1.0000"]  # 0.25 is a third of the largest: ▒
    assert next(r for r in rows if r.startswith("col sum")).split() == ["col", "sum", "1.0000", "1.0000"]
    assert "pre  stream 1  ████████████ 1.000" in text  # pre of 1.0: a full bar of 12
    assert "post stream 0  ████████████ 2.000" in text  # post of 2.0: full (its scale is 2)
    assert "post stream 1  ███          0.500" in text  # a quarter of the bar
    # the two scales said on screen: a shorter post bar is not a smaller weight than a longer pre one
    assert "pre: a full bar is 1 (" in text and "post: a full bar is 2 (" in text
    assert [r.split()[-1] for r in rows if r.startswith("stream ")] == ["▄▄", "█"]
    later = render(hyper_connection_map(comb, streams=streams, position=1, first=40))  # a step from position 40 on
    assert "position 41 of 40..41" in later and "RMS of each stream at positions 40..41" in later


def test_a_wrong_shape_is_refused():
    with pytest.raises(ValueError, match="need a comb matrix"):
        hyper_connection_map(np.zeros((1, 2, 3, 4)))


def test_nan_and_infinities_are_drawn_apart_from_the_scale():
    """A stream a patch or `set` made NaN or infinite: its cells and bars are '!', said once under
    the picture, and the finite ones keep the largest finite value as their scale."""
    comb = np.zeros((1, 1, 2, 2), np.float32)
    comb[0, 0] = [[0.5, np.nan], [np.inf, 0.25]]
    pre = np.array([[[np.nan, 0.5]]], np.float32)
    streams = np.ones((1, 2, 2, 4), np.float32)
    streams[0, 0, 1] = np.inf  # stream 1's RMS is infinite at position 0, 1 at position 1
    text = render(hyper_connection_map(comb, pre, streams=streams, position=0))
    rows = text.splitlines()
    assert [r for r in rows if r.startswith("from")] == ["from 0    █ 0.500 !   nan  nan",
                                                         "from 1    !   inf ▒ 0.250  inf"]
    assert "shades: a quarter of the largest entry (0.500) each" in text
    assert "pre  stream 0  !            nan" in text and "pre  stream 1  ██████       0.500" in text
    assert [r.split()[-1] for r in rows if r.startswith("stream ")] == ["██", "!█"]
    assert rows.count("! NaN or infinite") == 1 and rows[-1] == "! NaN or infinite"
    finite = render(hyper_connection_map(np.abs(comb[..., :1, :1]), position=0))
    assert "NaN" not in finite
