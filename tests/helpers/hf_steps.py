"""A transformers model run over a prompt and then each token stepper generated, one at a time on
its cache, as `stepper run` runs them; and the pair of runs a crosscheck compares (the Hy4 and
Mistral Large 4 tracers' and tests')."""

from __future__ import annotations

from collections.abc import Callable

import torch

from stepper.seams.trace import Recorder
from stepper.session import RunSpec, run


def prefill_then_decode(model, prompt: list[int], generated: list[int], start: int, keep: Callable, step: list[str],
                        hooks: list) -> None:
    """The prompt at positions start.., then each generated token but the last at the next position on
    the cache, `step[0]` naming each ("prefill", "decode0", ...) for the hooks' `keep`, which gets each
    step's logits too; the hooks removed after (transformers 5.24 names the cache `cache`)."""
    try:
        with torch.no_grad():
            positions = torch.arange(start, start + len(prompt))[None]
            out = model(torch.tensor([prompt]), position_ids=positions, use_cache=True)
            keep("logits", out.logits)
            for n, token in enumerate(generated[:-1]):
                step[0] = f"decode{n}"
                out = model(torch.tensor([[token]]), position_ids=torch.tensor([[start + len(prompt) + n]]),
                            cache=out.cache, use_cache=True)
                keep("logits", out.logits)
    finally:
        for hook in hooks:
            hook.remove()


def paired_runs(folder, reference, ids: tuple[int, ...], decode: int, trace: Callable,
                **spec) -> tuple[dict, dict, list[int]]:
    """stepper's tensors of a run of the folder over ids and `decode` generated tokens, and what
    trace(reference, prompt, generated, start) records of transformers' model over the same."""
    recorder = Recorder()
    result = run(RunSpec(model=str(folder), ids=ids, decode=decode, **spec), [recorder])
    return recorder.tensors(), trace(reference, list(ids), result.generated, spec.get("start_pos", 0)), result.generated
