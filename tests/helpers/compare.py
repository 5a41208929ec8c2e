"""One tensor of stepper's against the reference's: the tolerance and the comparison the
cross-checks share."""

import numpy as np

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
