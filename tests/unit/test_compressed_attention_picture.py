"""DeepSeek-V4's per-query picture: which positions a query reaches through its window, the
entries its indexer kept, and those it dropped; how many keys it sees; a head's mass split."""

import io

import numpy as np
import pytest
from rich.console import Console

from stepper.views.compressed_attention_picture import compressed_attention_map, reach


def render(renderable, width: int = 100) -> str:
    console = Console(record=True, width=width, no_color=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def strip_of(text: str, label: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(label))[10:].rstrip()


def test_csa_query_by_hand():
    # p = 13, m = 4: (13+1)//4 = 3 entries visible (tokens 0..11); the indexer kept 0 and 2; window 4: 10..13.
    # A CSA entry w reads windows w - 1 and w: dropped entry 1's tokens 4..7 are read by kept entry 2
    text = render(compressed_attention_map(13, 4, 4, np.array([2, 0, -1]), indexer=True))
    assert strip_of(text, "positions") == "██████████WWWW"
    assert strip_of(text, "entries") == "█×█"
    assert "read by a kept entry (a CSA entry reads its window and the one before)" in " ".join(text.split())
    flat = " ".join(text.split())
    assert ("6 keys: the window's 4 tokens (positions 10..13) + 2 of the 3 visible entries ((p+1)//m = (13+1)//4)"
            in flat)
    text = render(compressed_attention_map(13, 4, 4, np.array([1, -1]), indexer=True))  # kept 1: reads 0..7
    assert strip_of(text, "positions") == "████████××WWWW" and strip_of(text, "entries") == "×█×"
    tokens, _ = reach(13, 4, 4, np.array([1, -1]))  # without overlap (HCA's way) only entry 1's own window
    assert "".join(map(str, tokens[:10])) == "1111222211"


def test_hca_pending_tokens_and_sliding_layers():
    tokens, entries = reach(300, 8, 128, np.array([0, 1]))  # 2 entries (0..255); 256..292 not pooled yet
    assert entries.tolist() == [2, 2]
    assert (tokens[:256] == 2).all() and (tokens[256:293] == 0).all() and (tokens[293:] == 3).all()
    tokens, entries = reach(20, 8, 0, np.zeros(0, np.int64))
    assert entries.size == 0 and (tokens[:13] == 0).all() and (tokens[13:] == 3).all()
    assert "8 keys: the window's 8 tokens (positions 13..20)" in " ".join(render(
        compressed_attention_map(20, 8, 0, np.zeros(0))).split())


def test_a_long_context_is_pooled_to_the_width():
    p = (1 << 20) - 1
    chosen = np.arange(0, 262144, 512)  # 512 kept entries spread over the context
    text = render(compressed_attention_map(p, 128, 4, chosen, indexer=True), width=80)
    cells = strip_of(text, "positions")
    assert len(cells) <= 60 and "positions a cell" in text
    assert set(cells[:-1]) == {"░"} and cells[-1] == "W"  # 512 of 262,144 kept: each block's share is small
    assert "640 keys: the window's 128 tokens" in " ".join(text.split())


def test_a_bad_position_is_refused():
    with pytest.raises(ValueError, match="need a position"):
        compressed_attention_map(-1, 4, 4, np.zeros(0))


def test_a_layer_without_an_indexer_is_named_hca_and_has_no_dropped_entries():
    text = " ".join(render(compressed_attention_map(40, 8, 16, np.array([0, 1]))).split())
    assert "query at position 40 · HCA (m = 16)" in text and "dropped" not in text
    text = " ".join(render(compressed_attention_map(40, 8, 16, np.array([0, -1]), indexer=True)).split())
    assert "CSA (m = 16, indexer)" in text and "× read only by entries the indexer dropped" in text
