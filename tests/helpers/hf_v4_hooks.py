"""transformers' DeepseekV4ForCausalLM with a forward hook and a forward pre-hook on every module, as a
port's dump under transformers' names: `{phase}.{module path}` for an output, `[k]` for the k-th
tensor of a tuple output, `:input` for the first positional argument. Steps share one cache, so the
decode steps continue the prompt."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def hooked_dump(model, steps: Sequence[tuple[str, Sequence[int], Sequence[int]]]) -> dict[str, np.ndarray]:
    """steps: (phase, token ids, positions) in order; the dump of every module's output and input."""
    import torch
    from transformers import DynamicCache

    dump: dict[str, np.ndarray] = {}
    phase = [""]

    def save(name: str, value) -> None:
        values = value if isinstance(value, tuple) else (value,)
        for k, v in enumerate(values):
            if torch.is_tensor(v):
                key = phase[0] + name + (f"[{k}]" if len(values) > 1 else "")
                dump[key] = v.detach().cpu().numpy().copy() if not v.is_floating_point() else \
                    v.detach().float().cpu().numpy().copy()

    handles = []
    for name, module in model.named_modules():
        if not name:
            continue
        handles.append(module.register_forward_hook(lambda m, args, out, name=name: save(name, out)))
        handles.append(module.register_forward_pre_hook(
            lambda m, args, name=name: save(name + ":input", args[0]) if args else None))
    cache = DynamicCache(config=model.config)
    try:
        for step, ids, positions in steps:
            phase[0] = f"{step}."
            with torch.no_grad():
                model(input_ids=torch.tensor([list(ids)]), position_ids=torch.tensor([list(positions)]),
                      cache=cache, use_cache=True)
    finally:
        for h in handles:
            h.remove()
    return dump
