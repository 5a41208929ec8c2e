"""Planning a run with many decode steps: the memory estimate looks at the prefill and the last
decode step, and the steps where a family's own dims peak (memory.widest_steps: DeepSeek-V4's last
step closing a compressor window), whose tensors are at least every other step's, and the names of
a layer's step are derived once, not once per step. Counted, not timed: the estimate sizes as many
tensors for 1,000 decode steps as for 10 (it sized 365,000 for tiny's 1,000: 10 s before the run)."""

import pytest
from helpers.configs import TINY

from stepper import catalog
from stepper.planning import memory, plan_run
from stepper.session import RunSpec, step_attn


def every_step(plan, layers):
    """A layer's tensors in each step, one by one: (the sum of what the run holds of each, the largest
    held or the logits), at most."""
    sums, largest = [], []
    for layer in layers:
        for k, (t, s) in enumerate(memory.worked_shapes(plan)):
            sizes = [(memory.tensor_bytes(e["name"], t, s, plan, held=True, layer=layer), e["dims"])
                     for e in catalog.load().layer_sequence(plan.config, layer, step_attn(plan.spec, k))]
            sums.append(sum(held for held, dims in sizes if not {"T", "S"} <= set(dims)))
            logits = [memory.tensor_bytes("logits", t, s, plan, held=True)] if plan.needs_logits else []
            largest.append(max([held for held, _ in sizes] + logits))
    return max(sums), max(largest)


@pytest.mark.parametrize("prompt_len", [1, 6])
@pytest.mark.parametrize("model", TINY)
def test_the_widest_steps_bound_every_step(model, prompt_len):
    """Over 40 decode steps (past DeepSeek-V4's tiny windows and compression ratios, and an
    indexer's top-k), the estimate from the widest steps is the most of every step's. After one
    prompt position, tiny-v4's largest tensors are a decode step's that closes a compressor window
    (its pooled windows [1, 1, D]), not the last step's (S 41 closes none: [1, 0, D])."""
    plan = plan_run(RunSpec(model=model, prompt_len=prompt_len, decode=40)).plan
    layers = list(plan.computed)
    assert (memory.layer_bytes(plan, layers), memory.largest_held(plan, layers)) == every_step(plan, layers)


def test_planning_sizes_as_many_tensors_for_a_thousand_decode_steps_as_for_ten(monkeypatch):
    counted = []
    sized, sequences = memory.tensor_bytes, catalog.Catalog.layer_sequence
    monkeypatch.setattr(memory, "tensor_bytes", lambda *a, **k: counted.append("size") or sized(*a, **k))
    monkeypatch.setattr(catalog.Catalog, "layer_sequence", lambda *a, **k: counted.append("seq") or sequences(*a, **k))

    def work(decode: int) -> tuple[int, int]:
        counted.clear()
        names = plan_run(RunSpec(model="tiny", prompt_len=4, decode=decode)).names
        return counted.count("size"), counted.count("seq"), len(names)

    few, many = work(10), work(1000)
    assert many[2] == 95_104 and few[:2] == many[:2]
