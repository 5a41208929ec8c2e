"""The memory estimate sizes each named tensor from its catalogue dims (planning.memory.sizes, also
what a --dump's sizes are checked with): every tensor of every tiny preset, in a prefill past a
delta rule's first chunk and in a decode step, has the shape the run then makes."""

import numpy as np
import pytest
from helpers.configs import TINY

from stepper.planning import memory, plan_run
from stepper.session import RunSpec


@pytest.mark.parametrize("model", TINY)
def test_the_estimate_sizes_every_tensor_as_the_run_makes_it(model):
    planned = plan_run(RunSpec(model=model, prompt_len=70, decode=1))
    made: dict[str, tuple[int, ...]] = {}

    def shape_of(event) -> None:
        made[event.name] = np.shape(event.array)

    planned.execute([shape_of])
    estimated = {name: shape for name, shape, _ in memory.sizes(planned.plan, planned.names)}
    assert list(made) == planned.names
    assert {n: estimated[n] for n in made} == {n: str(list(shape)) for n, shape in made.items()}
