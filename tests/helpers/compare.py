"""One tensor of stepper's against the reference's: the tolerance and the comparison the
cross-checks share."""

import numpy as np

from stepper.kernels import attention, parallel
from stepper.seams.trace import unphased

RTOL = 1e-5


def rel_err(mine: np.ndarray, ref: np.ndarray) -> float:
    scale = float(np.max(np.abs(ref))) or 1.0
    return float(np.max(np.abs(mine.astype(np.float64) - ref.astype(np.float64)))) / scale


def compare(name: str, mine: dict, ref: dict) -> str | None:
    """None if the tensor matches, else what differs."""
    a, b = mine[name], ref[name]
    if a.shape != b.shape:
        return f"shape {a.shape} vs {b.shape}"
    key = unphased(name).rpartition("layers.")[2].partition(".")[2] or unphased(name)
    if key == "self_attn.indexer.topk_idx":  # the same positions, in the same order (best first; -1 pads)
        return None if np.array_equal(a, b) else "different positions chosen"
    if key == "self_attn.indexer.reused_topk_idx":  # the same positions (transformers keeps torch.topk's order)
        return None if np.array_equal(np.sort(a, -1), np.sort(b, -1)) else "different positions reused"
    if key == "mlp.gate.topk_idx":
        return None if np.array_equal(np.sort(a, 1), np.sort(b, 1)) else "different experts chosen"
    if key == "mlp.gate.topk_weight":
        idx_name = name.replace("topk_weight", "topk_idx")
        a = np.take_along_axis(a, np.argsort(mine[idx_name], 1), 1)
        b = np.take_along_axis(b, np.argsort(ref[idx_name], 1), 1)
    finite = np.isfinite(b)
    if not np.array_equal(np.isfinite(a), finite):
        return "non-finite entries differ"
    err = rel_err(a[finite], b[finite]) if finite.any() else 0.0
    return None if err <= RTOL else f"relative error {err:.2e}"


ABSORBED_ONLY = {"self_attn.q_nope_absorbed", "self_attn.attn_output_latent"}  # what the absorbed path makes alone


def absorbed_against_naive(mine: dict, ref: dict) -> tuple[dict, dict]:
    """stepper's absorbed-path tensors and transformers' (naive-path) ones, each cut to the names
    both make: transformers has no absorbed path. The tensors stepper makes alone must be the
    absorbed path's own intermediates, and what both make must reach past the attention (its
    scores, weights, output, every layer after it, the logits), so the cut leaves the comparison whole."""
    only_mine = {n for n in mine if n not in ref}
    assert {unphased(n).split(".", 2)[-1] for n in only_mine} == ABSORBED_ONLY, only_mine
    shared = {n for n in mine if n in ref}
    layers = {unphased(n).split(".", 2)[1] for n in shared if unphased(n).startswith("layers.")}
    for key in ("self_attn.attn_scores", "self_attn.attn_weights", "self_attn.o_proj", "mlp_output"):
        assert {unphased(n).split(".", 2)[1] for n in shared if n.endswith(key)} == layers, key
    assert any(unphased(n) == "logits" for n in shared)
    return {n: mine[n] for n in shared}, {n: ref[n] for n in shared}


def small_tiles(monkeypatch) -> None:
    """Scores too many to hold (kernels.attention's WHOLE_SCORES cut to 64) and tiles of 2 heads x 4
    queries x 7 keys on two threads: the online softmax rescales across key tiles."""
    monkeypatch.setattr(attention, "WHOLE_SCORES", 64)
    monkeypatch.setattr(parallel, "cores", lambda: 2)
    monkeypatch.setattr(attention, "TILE_SCORES", 2 * 4 * 7)
    monkeypatch.setattr(attention, "KEY_TILE", 7)
    monkeypatch.setattr(attention, "QUERY_TILE", 4)


def same_experts(mine: dict, ref: dict, key: str) -> bool:
    """The same experts chosen for each token, with the same weights, in any order (`key`: a layer's
    `....mlp.gate.`; its topk_idx and topk_weight [N, k] in both)."""
    order, want = np.argsort(mine[key + "topk_idx"]), np.argsort(ref[key + "topk_idx"])
    return np.array_equal(np.take_along_axis(mine[key + "topk_idx"], order, 1),
                          np.take_along_axis(ref[key + "topk_idx"], want, 1)) and \
        np.allclose(np.take_along_axis(mine[key + "topk_weight"], order, 1),
                    np.take_along_axis(ref[key + "topk_weight"], want, 1), atol=1e-6)


def index_rows_apart(chosen: np.ndarray, theirs: np.ndarray, last: np.ndarray) -> list[int]:
    """The rows whose kept positions differ: stepper's [T, Ki] (-1 none) against transformers' [T, Ki]
    (positions past each row's own, `last` [T], padding torch.topk's masked picks)."""
    return [t for t in range(chosen.shape[0])
            if {int(p) for p in chosen[t] if p >= 0} != {int(p) for p in theirs[t] if p <= last[t]}]


def untied(scores: np.ndarray, kept: int) -> bool:
    """Whether no row's kept-th and next best index scores [T, S] tie, among the rows with more positions
    than that: the choice is then no seed's luck."""
    ranked = np.sort(scores, axis=-1)[:, ::-1]
    rows = ranked[np.isfinite(ranked[:, kept])]
    return bool(np.all(rows[:, kept - 1] > rows[:, kept]))
