"""DeepSeek-V4 attention parts by hand: the interleaved tail RoPE, the compressor's pooling (HCA
windows and CSA's overlapping ones), which entries a position sees, the indexer's picks, and the
cache's cost per position against V3's MLA."""

from dataclasses import replace

import numpy as np
import pytest

from stepper.config import Yarn
from stepper.families.deepseek_v4_config import cost_line
from stepper.model.compressed_attention import AttentionDims
from stepper.model.compressor import Compressor, Pending, compress, visible_entries
from stepper.model.layer_weights import LayerWeights
from stepper.model.sparse_indexer import picks
from stepper.model.tail_rope import Turn, rotate_tail
from stepper.model.v4_attention_cache import mla_values_per_position, values_per_position
from stepper.seams.trace import Emitter, Recorder


class Arrays:
    config = None  # the attention takes its sizes as AttentionDims

    def __init__(self, arrays):
        self.arrays = arrays

    def get(self, name):
        return self.arrays[name]

    matrix = get


def test_rotate_tail_turns_the_last_pairs_in_place():
    quarter = Turn(np.array([[0.0, 1.0]], np.float32), np.array([[1.0, 0.0]], np.float32))  # pair 0 by 90°, pair 1 by 0
    x = np.array([[7.0, 8.0, 1.0, 0.0, 2.0, 3.0]], np.float32)  # [T=1, D=6]: 2 left alone, rope 4
    assert rotate_tail(x, quarter).tolist() == [[7.0, 8.0, 0.0, 1.0, 2.0, 3.0]]
    angle = Turn(np.cos([[0.3, 1.1]]).astype(np.float32), np.sin([[0.3, 1.1]]).astype(np.float32))
    np.testing.assert_allclose(rotate_tail(rotate_tail(x, angle), angle.inverse()), x, atol=1e-6)


def test_which_entries_a_position_sees():
    assert visible_entries(np.arange(9), 4).tolist() == [0, 0, 0, 1, 1, 1, 1, 2, 2]
    assert visible_entries(np.array([126, 127, 255, 256]), 128).tolist() == [0, 1, 2, 2]


def no_turn(starts):
    return Turn(np.ones((len(starts), 1), np.float32), np.zeros((len(starts), 1), np.float32))


def pooled(ratio: int, kv_proj: np.ndarray, x: np.ndarray, width: int, state=None):
    """Gate 0 and no position bias: every slot weighs the same, the pool is the slots' mean."""
    c = kv_proj.shape[0]
    arrays = {"model.layers.0.c.kv_proj.weight": kv_proj, "model.layers.0.c.gate_proj.weight": np.zeros_like(kv_proj),
              "model.layers.0.c.position_bias": np.zeros((ratio, c), np.float32),
              "model.layers.0.c.kv_norm.weight": np.ones(width, np.float32)}
    rec = Recorder()
    comp = Compressor("c", "shown", ratio, width, 1e-6)
    state = compress(x, LayerWeights(Arrays(arrays), 0), comp, state or Pending.empty(1, c, width), no_turn,
                     Emitter([rec]))
    return rec.tensors(), state


def test_replaced_slot_weights_pool_the_window():
    """A patch of slot_weights (a sink's replacement) is what the window is pooled with."""
    x = np.arange(1, 25, dtype=np.float32).reshape(1, 12, 2)
    arrays = {"model.layers.0.c.kv_proj.weight": np.eye(2, dtype=np.float32),
              "model.layers.0.c.gate_proj.weight": np.zeros((2, 2), np.float32),
              "model.layers.0.c.position_bias": np.zeros((5, 2), np.float32),
              "model.layers.0.c.kv_norm.weight": np.ones(2, np.float32)}
    first_slot = np.zeros((1, 2, 5, 2), np.float32)
    first_slot[:, :, 0] = 1  # all the weight on each window's first token
    rec = Recorder()
    sinks = [lambda e: first_slot if e.key == "shown.slot_weights" else None, rec]
    compress(x, LayerWeights(Arrays(arrays), 0), Compressor("c", "shown", 5, 2, 1e-6), Pending.empty(1, 2, 2),
             no_turn, Emitter(sinks))
    np.testing.assert_array_equal(rec.tensors()["shown.pooled"], [[[1.0, 2.0], [11.0, 12.0]]])  # tokens 0 and 5


def test_hca_pools_each_closed_window_and_keeps_the_rest():
    x = np.arange(1, 25, dtype=np.float32).reshape(1, 12, 2)  # tokens (1,2), (3,4), ...; m = 5 (only 4 overlaps)
    shown, state = pooled(5, np.eye(2, dtype=np.float32), x, 2)
    np.testing.assert_allclose(shown["shown.pooled"], [[[5.0, 6.0], [15.0, 16.0]]], rtol=1e-6)  # means of 0..4, 5..9
    assert state.kv.shape == (1, 2, 2) and state.windows_closed == 2  # tokens 10, 11 wait


def test_csa_windows_overlap_and_the_first_has_no_predecessor():
    x = np.arange(1, 25, dtype=np.float32).reshape(1, 12, 2)
    both_halves = np.concatenate([np.eye(2), np.eye(2)]).astype(np.float32)  # c = 4: each half is x
    shown, state = pooled(4, both_halves, x, 2)
    token_means = x[0].reshape(3, 4, 2).mean(axis=1)  # [3 windows, 2]
    expected = [token_means[0], (token_means[0] + token_means[1]) / 2, (token_means[1] + token_means[2]) / 2]
    np.testing.assert_allclose(shown["shown.pooled"][0], expected, rtol=1e-6)
    assert (shown["shown.slot_weights"][0, 0, :4] == 0).all()  # window 0's missing predecessor
    # one more call: its first window's predecessor is the state's overlap (window 2's first halves)
    more = np.arange(25, 33, dtype=np.float32).reshape(1, 4, 2)
    shown, _ = pooled(4, both_halves, more, 2, state)
    np.testing.assert_allclose(shown["shown.pooled"][0, 0], (token_means[2] + more[0].mean(axis=0)) / 2, rtol=1e-6)


def test_picks_best_first_lower_index_on_ties_and_none_past_the_visible():
    scores = np.array([[[0.5, 2.0, 0.5, -np.inf], [1.0, -np.inf, -np.inf, -np.inf]]], np.float32)
    assert picks(scores, 3, np.array([3, 1])).tolist() == [[[1, 0, 2], [0, -1, -1]]]


def flash(ratio: int) -> AttentionDims:
    return AttentionDims(4096, 64, 512, 64, 1024, 8, 1024, 128, ratio, 64, 128, 512, 1e-6, 160000.0, Yarn(16, 65536))


def test_cost_per_position_beside_mla():
    assert values_per_position(flash(4)) == 512 / 4 + 128 / 4  # 160 numbers: entries and the indexer's keys
    assert values_per_position(flash(128)) == 4
    assert values_per_position(flash(0)) == 0
    assert mla_values_per_position(512, 64) == 576
    line = cost_line(flash(4))  # float32, as stepper holds them
    assert "640 B (CSA" in line and "2,304 B for V3's MLA" in line
    assert "16 B (HCA" in cost_line(flash(128))
    assert "320 B (CSA" in cost_line(flash(4), bytes_per_value=2) and "1,152 B for V3's MLA" in cost_line(
        flash(4), bytes_per_value=2)


@pytest.mark.parametrize("ratio", [4, 128])
def test_compressor_emits_nothing_until_a_window_closes(ratio):
    x = np.ones((1, 3, 2), np.float32)
    kv_proj = np.eye(2, dtype=np.float32) if ratio != 4 else np.concatenate([np.eye(2), np.eye(2)]).astype(np.float32)
    shown, state = pooled(ratio, kv_proj, x, 2)
    assert shown["shown.entries"].shape == (1, 0, 2) and state.kv.shape[1] == 3


def test_unusable_sizes_are_named_by_their_config_field():
    assert flash(4).problems() == []
    assert replace(flash(4), o_groups=7).problems() == ["o_groups (7) must divide num_attention_heads (64)"]
    assert replace(flash(4), rope_dim=63).problems()[0] == (
        "qk_rope_head_dim (63) must be even and at most head_dim (512)")
    assert replace(flash(4), index_head_dim=32).problems() == [
        "qk_rope_head_dim (64) must be even and at most index_head_dim (32)"]
    assert replace(flash(128), sliding_window=0).problems() == ["sliding_window (0) must be at least 1"]
