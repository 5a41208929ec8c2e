"""The Lightning Indexer's picture: for each query, the positions it kept, beside the attention weights."""

import io

import numpy as np
import pytest
from rich.console import Console

from stepper.tensors.tiled import Tiled
from stepper.views import attention_map


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
    text = render(attention_map.indexer_map(mask, weights, head=1, title="t"))
    rows = [line for line in text.splitlines() if line.startswith(("  0 ", "  1 ", "  2 "))]
    kept = [line[4:9] for line in rows]  # the indexer's map: cells two characters wide
    assert kept == ["█ · ·", "█ █ ·", "█ × █"]
    # beside it head 1's weights: query 2 gives 0.1 to position 0, exactly 0 to the dropped 1, 0.9 to 2
    assert [line[-6:].strip() for line in rows] == ["██· ·", "▒▒▒▒·", "░░· ██"]
    assert ("head 1" in text
            and "2 of up to 3 positions kept per query (the last, at position 2: 2), 5 of the 6 in the queries' "
                "past" in " ".join(text.split()))


def test_a_wrong_shape_is_refused():
    with pytest.raises(ValueError, match="need a mask"):
        attention_map.indexer_map(np.zeros((1, 2, 3)), np.zeros((1, 4, 2, 4)))


def test_a_decode_steps_query_is_labelled_by_its_position():
    """One new query after 4 cached positions: its row is position 4 in both maps, not 0."""
    mask = np.array([[[0, -np.inf, 0, 0, 0]]], np.float32)  # [1, T=1, S=5]: position 1 dropped
    weights = np.zeros((1, 1, 1, 5), np.float32)
    weights[0, 0, 0, [0, 2, 3, 4]] = 0.25
    rows = [line for line in render(attention_map.indexer_map(mask, weights)).splitlines() if line.startswith("  4 ")]
    assert len(rows) == 1 and rows[0].split()[:6] == ["4", "█", "×", "█", "█", "█"], rows
    assert rows[0].count(" 4 ") == 2, "the head's map labels the row by its position too"
    drawn = " ".join(render(attention_map.indexer_map(mask, weights)).split())
    assert "(the last, at position 4: 4), 4 of the 5 in the queries' past" in drawn


def test_tiled_weights_draw_the_same_picture_a_block_of_rows_at_a_time():
    """A long prompt's weights are a Tiled, never made whole: the picture asks for blocks of one
    head and is the same as the held array's, pooled."""
    rng = np.random.default_rng(0)
    t_len = 300
    scores = np.where(np.tril(np.ones((t_len, t_len), bool)) & (rng.random((t_len, t_len)) < 0.3), 0.0, -np.inf)
    np.fill_diagonal(scores, 0.0)
    mask = scores[None].astype(np.float32)  # [1, T, S]
    held = np.where(np.isfinite(mask), rng.random((1, t_len, t_len)), 0).astype(np.float32)[:, None].repeat(2, axis=1)
    asked = []

    def tile(heads, queries):
        asked.append((heads.stop - heads.start, queries.stop - queries.start))
        return held[:, heads, queries]

    tiled = Tiled(held.shape, tile)
    drawn = render(attention_map.indexer_map(mask, tiled, head=1))
    assert drawn == render(attention_map.indexer_map(mask, held, head=1))
    assert asked and all(h == 1 and t < t_len for h, t in asked), asked[:3]
    assert "max-pooled" in render(attention_map.indexer_map(mask, held, head=1))
