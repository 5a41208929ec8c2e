"""What the catalogue plans a run of each new MLA family to emit (its names, in order: GLM-5's
shared layer without an indexer, A.X-K2's gates, MiniCPM3's scalings, LongCat's sublayers and
MoE beside them) is what the run emits, prefill (naive) and decode (absorbed)."""

import pytest
from helpers.configs import family_preset

from stepper import catalog
from stepper.seams.trace import Recorder
from stepper.session import RunSpec, run


@pytest.mark.parametrize("model", ["tiny-minicpm3", "tiny-glm5", "tiny-axk2", "tiny-longcat"])
def test_the_planned_names_are_the_emitted_ones(model):
    cfg, rec = family_preset(model), Recorder()
    run(RunSpec(model=model, prompt_len=7, decode=1), [rec])
    steps = [("prefill", "naive"), ("decode0", "absorb")]
    planned = catalog.load().run_names(cfg, steps, range(cfg.num_hidden_layers), ("embed", "rope_cos", "rope_sin"),
                                       ("norm", "logits"))
    assert [e.name for e in rec.events] == planned
    assert all(catalog.load().entry(catalog.key_of(name)) for name in planned)  # every one catalogued
