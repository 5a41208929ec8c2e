"""A run on a checkpoint holding tensors of its layers that config.json gives no use (shared experts
where `n_shared_experts` is 0) goes on as the config says, and says so in one note under the
header; a checkpoint whose every tensor is read gets no note."""

from __future__ import annotations

import json

from helpers.cli import stepper

from stepper.planning import plan_run, unread_line
from stepper.session import RunSpec

NOTE = ("note: model-00003-of-00005.safetensors: 'model.layers.1.mlp.shared_experts.gate_proj.weight' and 5 more "
        "tensor(s) are in layer 1 but no tensor of that layer as config.json describes it{more}: this run goes on "
        "without them, as config.json says (stepper inspect lists them)")


def test_shared_experts_the_config_leaves_out_are_named_once(tmp_path):
    out = tmp_path / "ck"
    assert stepper("synth", "--model", "tiny", "--out", out).returncode == 0
    plain = stepper("run", "--model", out, "--layer", "1", "--prompt-len", "3", "--plain")
    assert plain.returncode == 0 and "note:" not in plain.stdout
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "n_shared_experts": 0}))
    lone = stepper("run", "--model", out, "--layer", "1", "--prompt-len", "3", "--plain")
    assert lone.returncode == 0 and lone.stdout.splitlines()[3] == NOTE.format(more="")
    assert not [line for line in lone.stdout.splitlines() if line.startswith("layers.1.mlp.shared")]  # none ran
    whole = stepper("run", "--model", out, "--prompt-len", "3", "--plain")
    assert NOTE.format(more=", and in 1 more layer(s)") in whole.stdout.splitlines()


def test_a_deepseek_v4_layers_unknown_tensor_is_named(tmp_path):
    out = tmp_path / "v4"
    assert stepper("synth", "--model", "tiny-v4", "--out", out).returncode == 0
    planned = plan_run(RunSpec(model=str(out), layer=2, prompt_len=3))
    assert unread_line(planned.plan) is None
    weight_map = planned.plan.weights.published.weight_map
    weight_map["layers.2.ffn.shared_experts.w4.weight"] = weight_map["layers.2.ffn.shared_experts.w1.weight"]
    assert unread_line(planned.plan) == (
        "note: model-00004-of-00007.safetensors: 'layers.2.ffn.shared_experts.w4.weight' is in layer 2 but no tensor "
        "of that layer as config.json describes it: this run goes on without it, as config.json says (stepper inspect "
        "lists it)")
