"""The fast attention kernels against the readable lines they stand for (model.attention)."""

import numpy as np
import pytest

from stepper.kernels import attention, parallel
from stepper.model.attention import attention_weights
from stepper.trace import Emitter


def readable_weights(scale):
    return lambda scores: attention_weights(scores, scale, Emitter())


def random(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


@pytest.fixture
def two_heads_per_group(monkeypatch):
    monkeypatch.setattr(parallel, "cores", lambda: 2)  # groups run on two threads even on one core
    monkeypatch.setattr(attention, "GROUP_SCORES", 2 * 10 * 10)


def test_shared_matmul_is_every_head_times_the_shared_matrix():
    rng = np.random.default_rng(1)
    for B, H, T, S in ((1, 64, 1, 37), (2, 5, 3, 9)):
        x, shared = random(rng, B, H, T, 24), random(rng, B, 24, S)  # [B, H, T, kv_lora], [B, kv_lora, S]
        fast = attention.shared_matmul(x, shared)
        assert fast.shape == (B, H, T, S)
        np.testing.assert_allclose(fast, np.matmul(x, shared[:, None]), rtol=1e-5, atol=1e-5)


def test_head_groups_cover_the_heads_once_and_one_core_runs_one_group(monkeypatch):
    monkeypatch.setattr(parallel, "cores", lambda: 2)
    monkeypatch.setattr(attention, "GROUP_SCORES", 3 * 10 * 10)
    groups = attention.head_groups(1, 8, 10)
    assert [(g.start, g.stop) for g in groups] == [(0, 3), (3, 6), (6, 8)]
    assert attention.worth_grouping(np.empty((1, 8, 10, 4))) and not attention.worth_grouping(np.empty((1, 3, 10, 4)))
    monkeypatch.setattr(parallel, "cores", lambda: 1)
    assert attention.head_groups(1, 8, 10) == [slice(0, 8)]


@pytest.mark.parametrize("B, H, T, S", [(1, 6, 10, 10), (2, 5, 10, 13)])
def test_naive_in_head_groups_equals_the_whole_arrays(B, H, T, S, two_heads_per_group):
    rng = np.random.default_rng(2)
    query, keys, values = random(rng, B, H, T, 8), random(rng, B, H, S, 8), random(rng, B, H, S, 4)
    whole = np.matmul(attention_weights(np.matmul(query, keys.swapaxes(-1, -2)), 0.3, Emitter()), values)
    grouped = attention.naive_in_head_groups(query, keys, values, readable_weights(0.3))
    assert len(attention.head_groups(B, H, T)) > 1
    assert np.array_equal(grouped, whole)  # each head's products are the same calls, only shared out


@pytest.mark.parametrize("B, H, T, S", [(1, 6, 10, 10), (2, 5, 10, 13)])
def test_absorbed_in_head_groups_equals_the_whole_arrays(B, H, T, S, two_heads_per_group):
    rng = np.random.default_rng(3)
    q_latent, q_pe = random(rng, B, H, T, 16), random(rng, B, H, T, 4)
    latents, k_pe = random(rng, B, S, 16), random(rng, B, 1, S, 4)
    scores = np.matmul(q_latent, latents[:, None].swapaxes(-1, -2)) + np.matmul(q_pe, k_pe.swapaxes(-1, -2))
    readable = np.matmul(attention_weights(scores, 0.3, Emitter()), latents[:, None])  # [B, H, T, kv_lora]
    grouped = attention.absorbed_in_head_groups(q_latent, q_pe, latents, k_pe, readable_weights(0.3))
    np.testing.assert_allclose(grouped, readable, rtol=1e-5, atol=1e-6)
    # the model's whole-array lines (all heads' rows in one product) equal the groups bit for bit here
    all_rows = attention.shared_matmul(q_latent, latents.swapaxes(-1, -2)) + attention.shared_matmul(
        q_pe, k_pe[:, 0].swapaxes(-1, -2))
    whole = attention.shared_matmul(attention_weights(all_rows, 0.3, Emitter()), latents)
    assert np.array_equal(grouped, whole)
