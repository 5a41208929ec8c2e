"""`--show scales` draws each FP8 weight's block-scale grid where its layer uses the weight: the
attention weights at the first shown attention tensor, a dense MLP's or the shared experts' at
the first shown MLP tensor, and the routed experts the tokens chose most once the router has
chosen, with a line saying how many were chosen."""

import re
from collections import Counter

import numpy as np
import pytest
from helpers.cli import stepper

from stepper.seams.trace import Recorder
from stepper.session import RunSpec, run

ATTENTION = ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]
ROW = re.compile(r"^(\S*layers\.\d+\.\S+)  \[")  # a tensor's row: its name, then its named shape


def sequence(out: str) -> list[str]:
    """The tensors' rows (by name), the grids (by weight) and the chosen-experts lines, in order."""
    found = []
    for line in out.splitlines():
        row = ROW.match(line)
        if row:
            found.append(row[1])
        elif line.startswith("model.layers.") or re.match(r"layer \d+: ", line):
            found.append(line)
    return found


def grids(layer: int, part: str, names: list[str]) -> list[str]:
    return [f"model.layers.{layer}.{part}.{name}.weight" for name in names]


def chosen_most(spec: RunSpec, name: str) -> tuple[list[int], int]:
    """The two experts the most tokens chose (ties: the lower first), and how many were chosen."""
    recorder = Recorder()
    run(spec, [recorder])
    counts = Counter(int(e) for e in np.asarray(recorder.tensors()[name]).reshape(-1))
    return sorted(counts, key=lambda e: (-counts[e], e))[:2], len(counts)


def test_a_moe_layer_draws_attention_shared_and_chosen_experts_where_they_are_used():
    out = stepper("run", "--plain", "--layers", "1:2", "--show", "scales")
    assert out.returncode == 0, out.stderr
    seen = sequence(out.stdout)
    (top, other), chosen = chosen_most(RunSpec(layers=(1, 2)), "layers.1.mlp.gate.topk_idx")
    experts = [f"model.layers.1.mlp.experts.{e}.{p}_proj.weight" for e in (top, other) for p in ("gate", "up", "down")]
    at = seen.index
    assert seen[at("layers.1.self_attn.q_a") + 1: at("layers.1.self_attn.q_a_norm")] == grids(1, "self_attn", ATTENTION)
    assert seen[at("layers.1.mlp.gate.logits") + 1: at("layers.1.mlp.gate.scores")] == grids(
        1, "mlp.shared_experts", ["gate_proj", "up_proj", "down_proj"])
    assert seen[at("layers.1.mlp.gate.topk_idx") + 1: at("layers.1.mlp.gate.topk_weight")] == [
        f"layer 1: {chosen} of 32 routed experts chosen; grids of the 2 chosen most: {top}, {other}", *experts]
    assert len([s for s in seen if s.startswith("model.")]) == 5 + 3 + 6  # nothing else, nothing twice


def test_a_dense_layer_draws_its_mlp_at_the_mlp_and_each_grid_once_per_run():
    out = stepper("run", "--plain", "--layers", "0:1", "--decode", "1", "--show", "scales")
    assert out.returncode == 0, out.stderr
    seen = sequence(out.stdout)
    at = seen.index
    assert seen[at("prefill.layers.0.self_attn.q_a") + 1: at("prefill.layers.0.self_attn.q_a_norm")] == grids(
        0, "self_attn", ATTENTION)
    assert seen[at("prefill.layers.0.mlp.gate_proj") + 1: at("prefill.layers.0.mlp.up_proj")] == grids(
        0, "mlp", ["gate_proj", "up_proj", "down_proj"])
    assert len([s for s in seen if s.startswith("model.")]) == 8  # the decode step's weights are the same ones


def test_each_decode_step_draws_the_experts_it_chose():
    out = stepper("run", "--plain", "--layers", "1:2", "--decode", "1", "--only", "*mlp_output", "--show", "scales")
    assert out.returncode == 0, out.stderr
    seen = sequence(out.stdout)
    (top, other), chosen = chosen_most(RunSpec(layers=(1, 2), decode=1), "decode0.layers.1.mlp.gate.topk_idx")
    step = seen[seen.index("decode0.layers.1.mlp_output") + 1:]
    assert (chosen == 4
            and step[0] == f"layer 1: 4 of 32 routed experts chosen; grids of the 2 chosen most: {top}, {other}")
    assert step[1:] == [f"model.layers.1.mlp.experts.{e}.{p}_proj.weight"
                        for e in (top, other) for p in ("gate", "up", "down")]
    prefill = seen[seen.index("prefill.layers.1.mlp_output") + 1: seen.index("decode0.layers.1.mlp_output")]
    assert prefill[0].startswith("layer 1: ") and len(prefill) == 1 + 6 + 3  # the routed experts, then the shared
    assert prefill[-3:] == grids(1, "mlp.shared_experts", ["gate_proj", "up_proj", "down_proj"])


def test_scales_with_no_attention_or_mlp_tensor_shown_is_refused():
    out = stepper("run", "--plain", "--only", "*hidden_states", "--show", "scales")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == ("stepper: error: --show scales: a weight's grid is drawn at its layer's attention or MLP "
                          "tensors, and this run shows none (choose layers or an --only that include one, e.g. "
                          "'*self_attn.q_a')\n")


@pytest.mark.parametrize("model", ["tiny-kimi-linear", "tiny-minicpm3", "tiny-int4"])
def test_a_model_without_fp8_weights_has_no_grid_to_draw_and_says_so(model):
    out = stepper("run", "--model", model, "--plain", "--show", "scales")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == f"stepper: error: --show scales: model {model} stores no FP8 weights, so there is no " \
                         "block-scale grid to draw\n"
