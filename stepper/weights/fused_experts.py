"""Routed experts stored fused, as transformers 5 saves an MoE (Mistral 4's checkpoint): per layer
`mlp.experts.gate_up_proj` [E, 2 * moe_inter, d], each expert's gate rows then its up rows, and
`mlp.experts.down_proj` [E, d, moe_inter]. The model asks for one expert's matrix by its
per-expert name (`mlp.experts.5.up_proj.weight`); it is a view of the fused tensor (BF16, F32, or
FP8 with one scale per expert: one expert's rows lie together, so nothing is copied).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts\.)(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
FUSED = {"gate_proj": "gate_up_proj", "up_proj": "gate_up_proj", "down_proj": "down_proj"}


def fused_name(name: str, only: str | None = None) -> str | None:
    """The fused tensor holding a per-expert weight (`only`: if it is that one), None for any other name."""
    m = EXPERT.match(name)
    return None if m is None or only not in (None, FUSED[m[3]]) else m[1] + FUSED[m[3]]


def expert_view(fused: np.ndarray, name: str) -> np.ndarray:
    """One expert's matrix out of its fused tensor: gate [inter, d], up [inter, d] or down [d, inter]."""
    m = EXPERT.match(name)
    e, proj = int(m[2]), m[3]
    if proj == "down_proj":
        return fused[e]
    inter = fused.shape[1] // 2
    return fused[e, :inter] if proj == "gate_proj" else fused[e, inter:]


def expert_of(name: str) -> int:
    """The expert a per-expert name stands for."""
    return int(EXPERT.match(name)[2])


def expert_start(shape: tuple[int, ...], name: str) -> int:
    """Where one expert's matrix starts in its fused tensor of `shape`, in values (row-major)."""
    m = EXPERT.match(name)
    e, proj = int(m[2]), m[3]
    rows, cols = shape[1], shape[2]
    return (e * rows + (rows // 2 if proj == "up_proj" else 0)) * cols


def stored_shapes(shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """A layer's tensors as stored: the per-expert weights replaced, where the first of them stood,
    by the fused tensors [E, 2 * inter, d] and [E, d, inter]."""
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in shapes.items():
        fused = fused_name(name)
        if fused is None:
            out[name] = shape
        elif fused not in out:
            experts = sum(fused_name(n) == fused for n in shapes) // (2 if fused.endswith("gate_up_proj") else 1)
            out[fused] = (experts, 2 * shape[0], shape[1]) if fused.endswith("gate_up_proj") else (experts, *shape)
    return out


def fused_data(fused: str, experts: int, data_of: Callable[[str], np.ndarray]) -> np.ndarray:
    """The fused tensor made of each expert's stored data (`data_of(per-expert name)`)."""
    prefix = fused.removesuffix("gate_up_proj").removesuffix("down_proj")
    if fused.endswith("down_proj"):
        return np.stack([data_of(f"{prefix}{e}.down_proj.weight") for e in range(experts)])
    return np.stack([np.concatenate([data_of(f"{prefix}{e}.gate_proj.weight"), data_of(f"{prefix}{e}.up_proj.weight")])
                     for e in range(experts)])


def fused_scales(fused: str, experts: int, scale_of: Callable[[str], np.ndarray]) -> np.ndarray:
    """A fused FP8 tensor's scales, one per expert [E, 1, 1], out of each expert's one scale
    (`scale_of(per-expert name)`: that scale over a block grid; an expert's gate and up share it)."""
    prefix = fused.removesuffix("gate_up_proj").removesuffix("down_proj")
    proj = "down_proj" if fused.endswith("down_proj") else "gate_proj"
    return np.stack([np.asarray(scale_of(f"{prefix}{e}.{proj}.weight"), np.float32)[:1, :1]  # the one value
                     for e in range(experts)])
