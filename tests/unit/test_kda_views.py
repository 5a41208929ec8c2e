"""Showing a KDA state: the per-head statistics, one head's heat map, each token's write, the decay
per channel, and the debugger's `p` and `s state` on a slice of S at a chosen token."""

import io

import numpy as np
import pytest
from rich.console import Console

from stepper.families.kimi_linear import FAMILY
from stepper.model.cache import KVCache
from stepper.model.options import LayerOptions
from stepper.model.transformer import Transformer
from stepper.seams.trace import Emitter
from stepper.views import kda_state
from stepper.views.debugger import CommandSource, Debugger, Quit
from stepper.weights.seeded import SyntheticWeights
from tests.helpers.kimi_linear import config


def drawn(renderable, width: int = 80) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


def test_statistics_per_head_by_hand():
    # head 0: rank one, sigma_1 = 5 (3, 4 along one direction); head 1: diag(2, 1): energy 5, sigma_1^2 share 4/5
    state = np.zeros((1, 2, 2, 2))
    state[0, 0] = [[3, 0], [4, 0]]
    state[0, 1] = [[2, 0], [0, -1]]
    rows = [line.split() for line in drawn(kda_state.state_statistics(state)).splitlines()[1:] if line.strip()]
    assert rows[0] == ["0", "5", "4", "1.00", "1"]
    assert rows[1] == ["1", "2.236", "2", "0.80", "2"]


def test_heat_map_shades_the_largest_entry_full_and_counts_negatives():
    S = np.array([[0.0, -1.0], [0.2, 0.6]])
    text = drawn(kda_state.state_heatmap(S, "one head"))
    grid = [line for line in text.splitlines() if line.startswith(("   0", "   1"))]
    assert grid[0].split()[1] == "░░██"  # |0| -> lowest shade, |-1| = max -> full
    assert grid[1].split()[1] == "░░▓▓"  # 0.2 -> ≤¼, 0.6 -> ≤¾
    assert "1 of 4 negative" in text and "max |S| 1" in text


def test_write_norms_and_decay_by_hand():
    delta = np.zeros((1, 1, 3, 2))
    delta[0, 0, 1] = [3, 4]  # ||delta_1|| = 5, the others 0
    text = drawn(kda_state.write_norms(delta))
    assert "head  0   █   max 5" in text
    g = np.full((1, 1, 4, 2), np.log(0.5))  # every channel halves each token: half-life 1 token
    g[..., 1] = 0.0  # channel 1 never forgets
    text = drawn(kda_state.decay_per_channel(g))
    assert "half-life 1..∞ tokens" in text


@pytest.fixture(scope="module")
def model():
    transformer = Transformer(SyntheticWeights(config(), 0), layer=FAMILY.decoder_layer)
    transformer.options = LayerOptions(delta_rule="recurrent")  # every token's state is there to look at
    return transformer


def debug(model, script: list[str]) -> tuple[str, Debugger]:
    out = io.StringIO()
    console = Console(width=100, file=out, color_system=None)
    debugger = Debugger(console, model.config, CommandSource(console, io.StringIO(""), False, script=script))
    ids = np.arange(1, 9)[None]  # 8 tokens
    with pytest.raises(Quit):
        model.forward(ids, np.arange(8), Emitter([debugger]), KVCache(model.config.num_hidden_layers))
    return out.getvalue(), debugger


def test_debugger_prints_and_draws_a_slice_of_the_state_at_a_chosen_token(model):
    out, debugger = debug(model, ["u layers.0.self_attn.state", "p self_attn.state_per_token[0, 1, 5, :2, :3] 4",
                                  "s state self_attn.state_per_token[0, 1, 5]", "s state", "q"])
    states = debugger.history["layers.0.self_attn.state_per_token"].array  # [B, Hk, T, K, Kv]
    expected = np.array2string(states[0, 1, 5, :2, :3], precision=4, floatmode="fixed")
    assert "layers.0.self_attn.state_per_token[0, 1, 5, :2, :3]  [2x3]  float32" in out
    assert expected in out
    assert "self_attn.state_per_token[0, 1, 5]" in out
    assert "max |S| " + kda_state.number(float(np.abs(states[0, 1, 5]).max())) in out
    # s state alone: the heads' table, head 0's map, the writes and the decays of layer 0
    assert "σ₁² share" in out and "what each token wrote" in out and "how fast each key channel forgets" in out
    final = debugger.history["layers.0.self_attn.state"].array
    assert np.array_equal(final, states[:, :, -1])


def test_s_state_on_something_that_is_not_a_state_is_one_line(model):
    out, _ = debug(model, ["u layers.0.self_attn.state", "s state self_attn.beta", "q"])
    assert "a state is [B, Hk, K, Kv] or one head's [K, Kv], got shape [1, 2, 8]" in out


def test_a_state_holding_nan_or_infinities_is_drawn_with_them_counted():
    """No singular values for a head holding NaN or Inf (an overflowing patch): the table counts them,
    the heat map marks them '!', the other heads keep their figures."""
    state = np.zeros((1, 2, 2, 2))
    state[0, 0] = [[3, 0], [4, 0]]
    state[0, 1] = [[np.inf, 0], [np.nan, -1]]
    rows = [line.split() for line in drawn(kda_state.state_statistics(state)).splitlines()[1:] if line.strip()]
    assert rows[0] == ["0", "5", "4", "1.00", "1"]
    assert rows[1] == ["1", "nan", "nan", "2", "NaN/Inf", "—"]  # a NaN makes the norm and max NaN
    text = drawn(kda_state.state_heatmap(state[0, 1], "one head"))
    grid = [line for line in text.splitlines() if line.startswith(("   0", "   1"))]
    assert grid[0].split()[1] == "!!░░" and grid[1].split()[1] == "!!██"  # |-1| the largest finite: full
    assert "! NaN or infinite" in text
    delta = np.ones((1, 1, 2, 3))
    delta[0, 0, 1, 0] = np.nan
    bars = drawn(kda_state.write_norms(delta))
    assert bars.splitlines()[0].split()[:3] == ["head", "0", "█!"] and "! NaN or infinite" in bars
