"""The emit seam: it returns what the model goes on with, a sink's replacement if it gives one."""

import numpy as np
import pytest

from stepper.seams.trace import Emitter, Recorder


def test_emit_returns_the_array_it_was_given_with_or_without_sinks():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert Emitter()("k_pe", x) is x
    rec = Recorder()
    assert Emitter([rec]).layer(1)("self_attn.k_pe", x) is x
    assert rec.events[0].name == "layers.1.self_attn.k_pe" and rec.events[0].array is x


def test_a_sinks_replacement_goes_to_the_later_sinks_and_back_to_the_model():
    x = np.zeros((2, 3), np.float32)
    patched = np.ones_like(x)
    before, after = Recorder(), Recorder()
    out = Emitter([before, lambda event: patched, after])("self_attn.k_pe", x)
    assert out is patched
    assert before.events[0].array is x and after.events[0].array is patched


@pytest.mark.parametrize("bad", [np.ones((3, 2), np.float32), np.ones((2, 3), np.float64), [[1.0] * 3] * 2])
def test_a_replacement_of_another_shape_or_dtype_is_refused(bad):
    with pytest.raises(ValueError, match=r"layers\.0\.self_attn\.k_pe: a sink returned .* in place of float32\[2, 3\]"):
        Emitter([lambda event: bad]).layer(0)("self_attn.k_pe", np.zeros((2, 3), np.float32))
