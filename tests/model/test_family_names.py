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


MLA_FAMILY_PRESETS = ("tiny-sarvam", "tiny-youtu", "tiny-glm4-flash", "tiny-axk1", "tiny-mistral4", "tiny-minicpm3",
                      "tiny-glm5", "tiny-axk2", "tiny-longcat")


@pytest.mark.parametrize("model", MLA_FAMILY_PRESETS)
def test_the_catalogue_gives_each_dimension_the_size_the_run_gave_it(model):
    """tree and explain size a tensor's dims from the catalogue: LongCat's router scores its zero
    experts beside the real ones, [N, 12] in tiny-longcat, where they said 8."""
    from stepper.session import preset_config

    recorder = Recorder()
    run(RunSpec(model=model, decode=1), [recorder])
    cat, cfg = catalog.load(), preset_config(model)
    for event in recorder.events:
        for dim, size in zip(cat.entry(event.key)["dims"], event.array.shape, strict=True):
            assert cat.expected_size(dim, cfg, event.layer) in (None, size), (event.name, dim)
