"""The Python API on the newer families (DeepSeek-V4, Kimi Linear, LongCat-Flash, GLM-5), as a
notebook user meets it: a mistake is one StepperError said from the call, naming what was wrong
and what was expected."""

import traceback

import numpy as np
import pytest

import stepper
from stepper.errors import StepperError

IDS = [17, 42, 99, 3, 55, 66]


def frames_below_the_call(error: BaseException) -> list[str]:
    """The files of the traceback's frames after this test's own: what a notebook prints above the message."""
    return [frame.filename for frame in traceback.extract_tb(error.__traceback__)[1:]]


@pytest.mark.parametrize("model, patch, message", [
    ("tiny-v4", {"layers.1.hc_attn.comb": lambda a, name: a[..., :2]},
     (r"^patch layers\.1\.hc_attn\.comb on layers\.1\.hc_attn\.comb returned float32\[1, 6, 4, 2\]; expected an "
      r"array of the tensor's shape and dtype, float32\[1, 6, 4, 4\]$")),
    ("tiny-kimi-linear", {"layers.1.self_attn.state": lambda a, name: a.astype(np.float16)},
     r"returned float16\[1, 4, 32, 32\]; expected an array of the tensor's shape and dtype, float32\[1, 4, 32, 32\]$"),
    ("tiny-kimi-linear", {"layers.0.self_attn.delta": "x*0"}, r"is shown only; the model does not read it back"),
    ("tiny-longcat", stepper.zero_head(1, 9), r"^zero_head: head 9 out of range: layer 1 has heads 0\.\.3$"),
])
def test_a_patch_refused_inside_the_run_is_raised_from_the_call_not_from_the_model(model, patch, message):
    """A patch's result is checked where the model reads it, 16-19 frames deep (seams.patching under
    the model's layers): a notebook printed all of them above the one line that says what was wrong."""
    with pytest.raises(StepperError, match=message) as caught:
        stepper.run(model, ids=IDS, patch=patch)
    assert [f.rsplit("/", 2)[-2:] for f in frames_below_the_call(caught.value)] == [["stepper", "api.py"]]
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_a_diff_of_two_models_runs_says_in_its_repr_how_many_tensors_only_one_side_has():
    """tiny-v4 and tiny-kimi-linear share one name, logits: the repr said '1 tensors: ... 1 differ;
    first difference logits', as if the runs had been compared, and not the 228 and 132 left out."""
    d = stepper.diff(stepper.run("tiny-v4", ids=[1, 2, 3]), stepper.run("tiny-kimi-linear", ids=[1, 2, 3]))
    assert [row.name for row in d.rows] == ["logits"] and len(d.only_a) > 200 and len(d.only_b) > 100
    assert repr(d) == (f"<stepper.Diff 1 tensors: 0 same, 0 close, 1 differ; {len(d.only_a)} only in A, "
                       f"{len(d.only_b)} only in B; first difference logits>")
    same = stepper.run("tiny-longcat", ids=[1, 2, 3])
    n = len(same)
    assert repr(stepper.diff(same, same)) == f"<stepper.Diff {n} tensors: {n} same, 0 close, 0 differ; no tensor " \
                                             "differs beyond round-off>"


def test_a_patch_of_a_long_attention_made_in_tiles_says_what_to_patch_instead():
    """LongCat's second sublayer at 1,100 positions: its weights [1, 4, 1100, 1100] are never held;
    the refusal said so, and not what could be patched."""
    with pytest.raises(StepperError) as caught:
        stepper.run("tiny-longcat", prompt_len=1100, keep="layers.0.sub1.*",
                    patch={"layers.0.sub1.self_attn.attn_weights": "x*0.5"})
    assert str(caught.value) == (
        "patch layers.0.sub1.self_attn.attn_weights: layers.0.sub1.self_attn.attn_weights [1, 4, 1100, 1100] is made "
        "a tile at a time (a long attention) and never held, so it cannot be patched: patch the queries or keys it is "
        "made from, or run a shorter prompt, whose attention is held whole")


def test_run_explain_gives_the_entry_in_the_familys_own_words_as_stepper_explain_does():
    """run.explain gave the catalogue's DeepSeek texts: LongCat's layer output as attn_residual +
    mlp_output (it adds the MoE's output beside the sublayers) and DeepSeek-V3's transformers line,
    while `stepper explain` gives LongCat's formula and its own file's line."""
    longcat = stepper.run("tiny-longcat", ids=[1, 2, 3], keep="logits")
    output = longcat.explain("layers.1.output")
    assert output["formula"] == "output = sub1.attn_residual + sub1.mlp_output + mlp.routed_output"
    assert output["description"].startswith("Layer output: the last sublayer's attn_residual + mlp_output")
    assert output["reference"]["transformers"]["path"] == "models/longcat_flash/modeling_longcat_flash.py"
    assert output["reference"]["transformers"]["lines"] == [522, 522] and "modeling_deepseek.py" not in \
        output["reference"]
    sub0 = longcat.explain("layers.1.sub0.output")
    assert sub0["name"] == "sub0.output" and sub0["reference"]["transformers"]["lines"] == [501, 501]
    assert sub0["formula"] == "sub0.output = sub0.attn_residual + sub0.mlp_output"
    kimi = stepper.run("tiny", ids=[1, 2, 3], keep="logits").explain("layers.1.output")  # DeepSeek's own: as catalogued
    assert kimi["formula"] == "output = attn_residual + mlp_output" and "modeling_deepseek.py" in kimi["reference"]
