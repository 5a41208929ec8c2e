"""How attention runs fast: every head's rows in one product, and heads in groups on the cores.

The math is model.attention's; these are the same products arranged for speed, each tested equal
to the readable lines it stands for (tests/unit/test_attention_kernels.py).

- `shared_matmul`: a product with a matrix every head shares (the absorbed path's latents and
  rotary key) as one product of all heads' rows, not one small product per head.
- `naive_in_head_groups`, `absorbed_in_head_groups`: a large attention (a prefill) in groups of
  heads, side by side on the cores, each group's scores and weights made and dropped in turn, so
  the whole [B, H, T, S] scores never exist. BLAS and NumPy's loops over megabytes let go of the
  GIL, so threads share the work. The model uses them only when no sink would see those scores.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from stepper.kernels import parallel

GROUP_SCORES = 1 << 20  # attention scores per group of heads run side by side (4 MB in float32)

Weights = Callable[[np.ndarray], np.ndarray]  # scores [B, H, T, S] -> attention weights, same shape


def shared_matmul(x: np.ndarray, shared: np.ndarray) -> np.ndarray:
    """np.matmul(x, shared[:, None]), every head times the same matrix, as one product of all
    heads' rows (a decode step: one 64-row product instead of 64 one-row ones).
    x [B, H, T, kv_lora], shared [B, kv_lora, S] -> [B, H, T, S] (any last two sizes)"""
    B, H, T, _ = x.shape
    rows = np.matmul(x.reshape(B, H * T, x.shape[-1]), shared)  # [B, H*T, S]
    return rows.reshape(B, H, T, rows.shape[-1])


def head_groups(batch: int, heads: int, positions: int) -> list[slice]:
    """The groups of heads whose scores fit GROUP_SCORES each (S >= T); one group on one core."""
    per_group = max(1, GROUP_SCORES // max(1, batch * positions * positions))
    if parallel.cores() == 1:
        return [slice(0, heads)]
    return [slice(h, min(h + per_group, heads)) for h in range(0, heads, per_group)]


def worth_grouping(query: np.ndarray) -> bool:
    """Whether attention with this query [B, H, T, qk_head] would run in more than one group."""
    B, H, T, _ = query.shape
    return len(head_groups(B, H, T)) > 1


def naive_in_head_groups(query_states: np.ndarray, key_states: np.ndarray, value_states: np.ndarray,
                         weights_of: Weights) -> np.ndarray:
    """weights_of(query_states @ key_states^T) @ value_states, heads in groups on the cores.
    query_states [B, H, T, qk_head], key_states [B, H, S, qk_head], value_states [B, H, S, v_head]
    -> [B, H, T, v_head]"""

    def attend(h: slice) -> np.ndarray:  # [B, H, T, v_head], the heads h only
        scores = np.matmul(query_states[:, h], key_states[:, h].swapaxes(-1, -2))  # [B, H, T, S], heads h
        return np.matmul(weights_of(scores), value_states[:, h])

    return in_head_groups(attend, query_states.shape)


def absorbed_in_head_groups(q_latent: np.ndarray, q_pe: np.ndarray, latents: np.ndarray, k_pe: np.ndarray,
                            weights_of: Weights) -> np.ndarray:
    """weights_of(q_latent @ latents^T + q_pe @ k_pe^T) @ latents, heads in groups on the cores.
    q_latent [B, H, T, kv_lora], q_pe [B, H, T, rope], latents [B, S, kv_lora], k_pe [B, one, S, rope]
    -> [B, H, T, kv_lora]"""
    keys, rope_keys = latents.swapaxes(-1, -2), k_pe[:, 0].swapaxes(-1, -2)  # [B, kv_lora, S], [B, rope, S]

    def attend(h: slice) -> np.ndarray:  # [B, H, T, kv_lora], the heads h only
        scores = shared_matmul(q_latent[:, h], keys) + shared_matmul(q_pe[:, h], rope_keys)  # [B, H, T, S], heads h
        return shared_matmul(weights_of(scores), latents)

    return in_head_groups(attend, q_latent.shape)


def in_head_groups(attend: Callable[[slice], np.ndarray], query_shape: tuple[int, ...]) -> np.ndarray:
    """attend(heads) for each group of heads (the H axis of [B, H, T, v_head] or [B, H, T, kv_lora]
    cut to the group), shared out across the cores and written into one array: fresh large
    arrays fault their pages in slowly while the page cache is full of a checkpoint, so nothing
    is concatenated afterwards."""
    B, H, T, _ = query_shape
    groups = head_groups(B, H, T)
    first = attend(groups[0])
    out = np.empty((B, H, *first.shape[2:]), first.dtype)
    out[:, groups[0]] = first

    def run(share: list[slice]) -> None:
        for h in share:
            out[:, h] = attend(h)

    parallel.split(groups[1:], run)
    return out
