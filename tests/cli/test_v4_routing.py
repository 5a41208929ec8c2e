"""DeepSeek-V4's routing picture: each layer's chosen experts shaded by weight, with each expert's
load, under a line saying whether a hash of the token id chose them (layers 0 and 1 of tiny-v4)
or the top k of the scores plus the bias (layers 2 and 3), drawn by `stepper run --show routing`,
the debugger's `s routing` and the API's `picture("routing", ...)`. The cells are read off the
screen and compared with the run's own ffn.gate tensors."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from helpers.terminal import on_terminal

import stepper as api
from stepper.errors import StepperError

ROW = re.compile(r"^\s*(\d+) ([·░▒▓█]{16})(.*)$")  # a token's row: its label, a cell per expert, its picks
HASHED = ("hash-routed: each token's 4 experts are tid2eid's row for its token id, a fixed table, so a token gets the "
          "same experts in any context, whatever its hidden state; the gate's scores only weigh them")
SCORED = ("score-routed: each token's top 4 of sqrt(softplus(logits)) + bias, so its hidden state chooses; the weights "
          "are the chosen scores without the bias")


@pytest.fixture(scope="module")
def run():
    return api.run(model="tiny-v4", keep="*ffn.gate.*")


def picture_at(lines: list[str], title: str) -> tuple[str, list[tuple[str, list[tuple[int, str]]]], str]:
    """The picture under the line beginning `title`: its caption (wrapped lines joined), each
    token's cells and listed picks (expert, weight to 2 places), and its `load #` digits."""
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    grid = next(i for i in range(start, len(lines)) if lines[i].lstrip().startswith("tok\\e"))
    rows, load = [], None
    for line in lines[grid + 1:]:
        if line.lstrip().startswith("load #"):
            load = line.split("load # ", 1)[1]
            break
        if m := ROW.match(line):
            rows.append((m[2], [(int(e), w) for e, w in re.findall(r"e(\d+) (\d\.\d\d)", m[3])]))
    return " ".join(" ".join(lines[start:grid]).split()), rows, load


def expected(chosen: np.ndarray, weights: np.ndarray) -> tuple[list, str]:
    """The rows and load a routing map of these [N, k] experts and weights shows: a chosen expert
    shaded by its weight's fraction of the largest (░ to ¼, ▒ to ½, ▓ to ¾, █ above), the rest ·."""
    top, rows = float(weights.max()), []
    for experts, ws in zip(chosen, weights.astype(np.float64)):
        cells = ["·"] * 16
        for e, w in zip(experts, ws):
            cells[e] = "░▒▓█"[math.ceil(w / top * 4) - 1]
        rows.append(("".join(cells), [(int(e), f"{w:.2f}") for e, w in zip(experts, ws)]))
    load = "".join(str(n) if n else "·" for n in np.bincount(chosen.ravel(), minlength=16))
    return rows, load


@pytest.mark.parametrize(("layer", "choice", "how"), [(0, "hash_idx", HASHED), (2, "topk_idx", SCORED)])
def test_show_routing_draws_a_v4_layers_choice_with_its_weights_and_says_how_it_chose(run, layer, choice, how):
    screen = on_terminal("run", "--model", "tiny-v4", "--show", "routing", "--only", "*ffn.gate.weights")
    assert screen.code == 0, screen.text
    name = f"layers.{layer}.ffn.gate.{choice}"
    caption, rows, load = picture_at(screen.lines, f"{name} · weights")
    assert caption == f"{name} · weights: {how}"
    assert (rows, load) == expected(run[name], run[f"layers.{layer}.ffn.gate.weights"])
    after = " ".join(" ".join(screen.lines[[line.startswith(name) for line in screen.lines].index(True):]).split())
    legend = after[:after.index("experts used")]  # the picks' order: a hash's table's, or by score + bias
    assert legend.endswith("picks in the router's order, " + ("as tid2eid lists them (no score chose them) "
                           if choice == "hash_idx" else "by score + bias (the bias can put a smaller weight first) "))
    assert max(map(len, screen.lines)) <= 80


def test_s_routing_at_a_v4_router_draws_its_layers_choice_and_waits_for_its_weights(run):
    typed = ["u layers.0.ffn.gate.weights", "s routing", "u layers.2.ffn.gate.logits", "s routing",
             "u ffn.gate.weights", "s routing", "s routing layers.0.ffn.gate.hash_idx", "q"]
    screen = on_terminal("step", "--model", "tiny-v4", typed=typed)
    assert screen.code == 0, screen.text
    asked = [i for i, line in enumerate(screen.lines) if line.startswith("(stepper) s routing")]
    assert len(asked) == 4
    assert "s routing draws layers.2.ffn.gate.weights with the experts they weigh, not seen yet: u ffn.gate.weights, " \
           "then s routing" in " ".join(" ".join(screen.lines[asked[1]:asked[2]]).split())
    for at, layer, choice, how in ((asked[0], 0, "hash_idx", HASHED), (asked[2], 2, "topk_idx", SCORED),
                                   (asked[3], 0, "hash_idx", HASHED)):
        name = f"layers.{layer}.ffn.gate.{choice}"
        caption, rows, load = picture_at(screen.lines[at:], f"{name} · weights")
        assert caption == f"{name} · weights: {how}"
        assert (rows, load) == expected(run[name], run[f"layers.{layer}.ffn.gate.weights"])


def test_the_api_draws_a_v4_routing_picture_from_either_tensor_and_a_hash_ignores_the_context():
    run = api.run(model="tiny-v4", ids=[7, 3, 7, 7], decode=1, keep="*ffn.gate.*")
    assert "routing" in run.pictures()
    for scope, layer, choice in (("prefill.", 0, "hash_idx"), ("prefill.", 3, "topk_idx"), ("decode0.", 1, "hash_idx")):
        name, weights = f"{scope}layers.{layer}.ffn.gate.{choice}", f"{scope}layers.{layer}.ffn.gate.weights"
        picture = repr(run.picture("routing", weights))
        assert repr(run.picture("routing", name)) == picture
        _, rows, load = picture_at(picture.splitlines(), f"{name} · weights")
        assert (rows, load) == expected(run[name], run[weights])
    def experts_of_7(layer: int) -> set[frozenset[int]]:  # the experts drawn for token 7 at positions 0, 2 and 3
        _, rows, _ = picture_at(repr(run.picture("routing", f"prefill.layers.{layer}.ffn.gate.weights")).splitlines(),
                                "prefill.")
        return {frozenset(e for e, _ in rows[t][1]) for t in (0, 2, 3)}

    assert len(experts_of_7(0)) == 1 and len(experts_of_7(3)) > 1  # a hash: the same; scores: as the context goes
    with pytest.raises(StepperError, match="picture: routing draws a ffn.gate.weights or a ffn.gate.hash_idx or a "
                                           "ffn.gate.topk_idx, and prefill.layers.0.ffn.gate.logits is not one"):
        run.picture("routing", "prefill.layers.0.ffn.gate.logits")


def test_show_routing_on_a_v4_run_that_shows_no_router_names_v4s_router():
    screen = on_terminal("run", "--model", "tiny-v4", "--show", "routing", "--only", "*attn.kv")
    assert screen.code == 2
    assert " ".join(screen.text.split()) == (
        "stepper: error: --show routing: it is drawn from ffn.gate.weights or ffn.gate.hash_idx or ffn.gate.topk_idx, "
        "and this run shows none (choose layers or an --only that include ffn.gate.weights)")
