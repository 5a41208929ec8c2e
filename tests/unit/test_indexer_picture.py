"""The Lightning Indexer's picture: for each query, the positions it kept, beside the attention weights."""

import io

import numpy as np
import pytest
from rich.console import Console

from stepper.views import pictures


def render(renderable, width: int = 100) -> str:
    console = Console(record=True, width=width, no_color=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def test_kept_dropped_and_future_positions_beside_the_weights():
    inf = -np.inf
    mask = np.array([[[0, inf, inf], [0, 0, inf], [0, inf, 0]]], np.float32)  # query 2 dropped position 1
    weights = np.zeros((1, 2, 3, 3), np.float32)
    weights[0, :, 0, 0] = 1
    weights[0, :, 1, :2] = 0.5
    weights[0, 1, 2, [0, 2]] = [0.1, 0.9]
    weights[0, 0, 2, [0, 2]] = [0.9, 0.1]
    text = render(pictures.indexer_map(mask, weights, head=1, title="t"))
    rows = [line for line in text.splitlines() if line.startswith(("  0 ", "  1 ", "  2 "))]
    kept = [line[4:9] for line in rows]  # the indexer's map: cells two characters wide
    assert kept == ["█ · ·", "█ █ ·", "█ × █"]
    # beside it head 1's weights: query 2 gives 0.1 to position 0, exactly 0 to the dropped 1, 0.9 to 2
    assert [line[-6:].strip() for line in rows] == ["██· ·", "▒▒▒▒·", "░░· ██"]
    assert "head 1" in text and "2 of up to 3 positions kept per query (query 2: 2)" in text


def test_a_wrong_shape_is_refused():
    with pytest.raises(ValueError, match="need a mask"):
        pictures.indexer_map(np.zeros((1, 2, 3)), np.zeros((1, 4, 2, 4)))
