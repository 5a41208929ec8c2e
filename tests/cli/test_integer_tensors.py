"""Integer tensors as a user reads them: the router's chosen experts and the indexer's chosen
positions have bins of whole integers (a bin per value where the range fits) whose edges are
written as integers, and their min, max, sum and corners are integers, on the terminal (the row
and the hist picture, in `run` and in the debugger), in `run --json`, and for a chunked prefill
as for a whole one."""

import itertools
import json

import numpy as np
import pytest
from helpers.cli import stepper
from helpers.terminal import on_terminal

import stepper as api

TOPK = "layers.1.mlp.gate.topk_idx"
INDEXER = "layers.0.self_attn.indexer.topk_idx"


@pytest.fixture(scope="module")
def chosen() -> np.ndarray:
    """tiny's layer-1 experts chosen by hand from the run's own router scores: the top 4 of each
    token's scores_for_choice, best first (tiny has one expert group, so none is masked)."""
    run = api.run("tiny", keep=[TOPK, "layers.1.mlp.gate.scores_for_choice"])
    by_hand = np.argsort(-run["layers.1.mlp.gate.scores_for_choice"], axis=-1, kind="stable")[:, :4]
    np.testing.assert_array_equal(run[TOPK], by_hand)
    return by_hand


def runs_of(values: np.ndarray, bins: int) -> tuple[list[int], list[int]]:
    """The bins a user expects of integers: from the min, ceil(values in range / bins) values each,
    as few bins as reach the max. -> (counts, edges)"""
    lo, n = int(values.min()), int(values.max() - values.min()) + 1  # n values in range
    run = -(-n // bins)
    edges = [lo + i * run for i in range(-(-n // run) + 1)]
    return [int(((values >= a) & (values < b)).sum()) for a, b in itertools.pairwise(edges)], edges


def test_run_json_gives_the_chosen_experts_bins_and_figures_as_integers(chosen):
    record = json.loads(stepper("run", "--json", "--only", TOPK).stdout)
    counts, edges = runs_of(chosen, 16)
    assert record["histogram"] == {"counts": counts, "lo": edges[0], "hi": edges[-1]}
    assert counts == [5, 2, 0, 3, 1, 0, 2, 0, 1, 0, 2, 0, 4, 2, 5, 1] and (edges[0], edges[-1]) == (0, 32)
    figures = record["stats"]
    assert [figures[k] for k in ("min", "max", "absmax", "sum")] == [int(chosen.min()), int(chosen.max()),
                                                                     int(chosen.max()), int(chosen.sum())]
    assert all(type(figures[k]) is int for k in ("min", "max", "absmax", "sum"))
    assert figures["mean"] == pytest.approx(chosen.mean())
    assert record["corners"] == {"first": chosen[0, :3].tolist(), "last": chosen[-1, -3:].tolist()}


def test_a_chunked_prefill_gives_the_integer_bins_of_the_whole_prompt():
    run = ("run", "--model", "tiny-v32", "--prompt-len", "9", "--json", "--only", "*topk_idx")
    whole, chunked = stepper(*run), stepper(*run, "--chunk", "3")
    assert whole.returncode == chunked.returncode == 0, chunked.stderr
    records = [json.loads(line) for line in whole.stdout.splitlines()]
    assert [json.loads(line) for line in chunked.stdout.splitlines()] == records
    indexer = next(r for r in records if r["name"] == INDEXER)  # -1: no position kept there
    kept = api.run("tiny-v32", prompt_len=9, keep=[INDEXER])[INDEXER]
    assert indexer["histogram"] == {"counts": np.bincount(kept.ravel() + 1).tolist(), "lo": -1, "hi": 8}
    assert indexer["corners"]["first"] == kept[0, 0, :3].tolist() and -1 in indexer["corners"]["first"]


def test_the_terminal_shows_the_chosen_experts_as_integers_in_their_row_and_hist(chosen):
    screen = on_terminal("run", "--only", TOPK, "--show", "hist", columns=100)
    assert screen.code == 0, screen.text
    lines = screen.lines
    at = lines.index(TOPK)  # the picture's title
    counts, edges = runs_of(chosen, 24)  # 31 values: runs of 2
    width = max(len(str(e - 1)) for e in edges[1:])
    for i, n in enumerate(counts):
        label = f"[{str(edges[i]).rjust(width)}, {str(edges[i + 1] - 1).rjust(width)}]"
        assert lines[at + 1 + i].startswith(label + " ") and lines[at + 1 + i].split()[-1 if i else -3] == str(n)
    assert lines[at + 1 + len(counts)].endswith(f"{len(counts)} bins of 2 values each")
    row = next(line for line in lines if line.lstrip().startswith("min "))
    assert row.split()[:4] == ["min", str(chosen.min()), "max", str(chosen.max())]
    assert f"sum {chosen.sum()}" in row
    first, last = chosen[0, :3], chosen[-1, -3:]
    assert f"corners {' '.join(map(str, first))} … {' '.join(map(str, last))}" in screen.text


def test_the_debuggers_hist_gives_a_bin_per_chosen_position():
    kept = api.run("tiny-v32", prompt_len=7, keep=[INDEXER])[INDEXER]
    screen = on_terminal("step", "--model", "tiny-v32", "--break", INDEXER, columns=100, typed=["s hist", "q"])
    assert screen.code == 0, screen.text
    at = screen.lines.index(INDEXER)
    values = range(int(kept.min()), int(kept.max()) + 1)
    shown = screen.lines[at + 1: at + 1 + len(values)]
    assert [line.split()[0] for line in shown] == [str(v) for v in values]  # -1, 0, 1, ...: a bin per value
    assert [int(line.split()[-3 if v == 0 else -1]) for v, line in zip(values, shown)] == \
        [int((kept == v).sum()) for v in values]
    assert screen.lines[at + 1 + len(values)].endswith(f"{len(values)} bins of 1 value each")
