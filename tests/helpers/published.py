"""A tiny checkpoint in a family's published layout, written without stepper's writer.

The config.json is the family's published form (the preset's dict as given, not stepper's
translation); the tensors are drawn with torch, rounded to the published dtype (BF16 unless
`dtypes` says otherwise for a name), and written with safetensors' torch writer in two shards
with an index, as the Hub's checkpoints are. `write_published` returns the float32 values a
reader must see (the stored ones, widened exactly).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

torch.set_num_threads(1)


def write_published(folder: Path, config: dict, shapes: dict[str, tuple[int, ...]], seed: int = 0,
                    dtypes: dict[str, torch.dtype] | None = None) -> dict[str, np.ndarray]:
    """Write config.json and the tensors `shapes` names to `folder`; -> {name: float32 array}."""
    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    tensors, values = {}, {}
    for name, shape in shapes.items():
        fan_in = shape[-1] if len(shape) > 1 else 1
        w = torch.randn(shape, generator=generator) / fan_in**0.5
        if len(shape) == 1:  # norm weights near 1, biases near 0
            w = (0.0 if name.endswith("bias") else 1.0) + 0.1 * torch.randn(shape, generator=generator)
        stored = w.to((dtypes or {}).get(name, torch.bfloat16))
        tensors[name] = stored.contiguous()
        values[name] = stored.float().numpy()
    names = list(tensors)
    halves = [names[: len(names) // 2], names[len(names) // 2 :]]
    weight_map = {}
    for k, part in enumerate(halves, start=1):
        shard = f"model-{k:05d}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, str(folder / shard), metadata={"format": "pt"})
        weight_map.update({n: shard for n in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(config))
    return values
