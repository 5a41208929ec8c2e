"""What a reviewer trying DeepSeek-V4 met on its surfaces (issue #32): the API's refusals in the API's
words, the debugger's help in the running model's names, counts with their noun's number, and --dump's
name as its help says."""

from __future__ import annotations

import pytest
from helpers.cli import refused, stepper

import stepper as api
from stepper.errors import StepperError


@pytest.mark.parametrize(("kwargs", "args", "in_api", "on_command_line"), [
    ({"chunk": 4}, ("--chunk", "4"), "chunk=4: DeepSeek-V4's prefill runs the whole prompt at once (chunk 0)",
     "--chunk 4: DeepSeek-V4's prefill runs the whole prompt at once (chunk 0)"),
    ({"cache_len": 8}, ("--cache-len", "8"), "cache_len=8 fills one layer's cache: use it with layer=N",
     "--cache-len 8 fills one layer's cache: use it with --layer N"),
])
def test_a_v4_refusal_spells_the_option_as_the_caller_wrote_it(kwargs, args, in_api, on_command_line):
    with pytest.raises(StepperError) as e:
        api.run(model="tiny-v4", **kwargs)
    assert str(e.value) == in_api
    assert refused(stepper("run", "--model", "tiny-v4", *args)) == on_command_line
