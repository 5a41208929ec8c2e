"""A checkpoint holding only some layers (what `stepper synth --layers A:B` writes): inspect and
run say once which layers it holds and which options look at them, instead of one line per
tensor of every absent layer."""

import pytest
from helpers.cli import stepper

from stepper.weights.partial import partial_text

LAYER_1 = "holds only layer 1 of 0..2, no embedding, norm or lm_head: inspect with --layers 1:2, run with --layer 1"


@pytest.fixture(scope="module")
def layer_1(tmp_path_factory):
    out = tmp_path_factory.mktemp("partial") / "t12"
    done = stepper("synth", "--model", "tiny", "--layers", "1:2", "--out", out)
    assert done.returncode == 0, done.stderr
    return out


def test_inspect_names_the_layers_held_in_one_problem(layer_1):
    done = stepper("inspect", "--plain", layer_1)
    assert done.returncode == 1 and done.stderr == ""
    lines = done.stdout.splitlines()
    assert lines[-2:] == ["1 problem:", f"  ! {LAYER_1}"]
    assert lines[-3].endswith(" · 1 problem (listed below)")
    assert not [line for line in lines if "is missing" in line]  # not one line per absent tensor
    assert [line.split(" ──")[0] for line in lines if "──" in line] == ["layer 1 (MoE)"]


def test_inspect_of_the_layers_held_is_clean(layer_1):
    done = stepper("inspect", "--plain", "--layers", "1:2", layer_1)
    assert done.returncode == 0 and done.stderr == ""
    assert "problem" not in done.stdout


def test_run_refuses_in_one_line_and_runs_the_layer_held(layer_1):
    done = stepper("run", "--plain", "--model", layer_1)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"stepper: error: {layer_1}: {LAYER_1}\n"
    alone = stepper("run", "--plain", "--model", layer_1, "--layer", "1", "--only", "layers.1.output")
    assert alone.returncode == 0, alone.stderr
    assert "layers.1.output" in alone.stdout


def test_a_layer_outside_the_checkpoint_is_refused_in_one_line(layer_1):
    done = stepper("run", "--plain", "--model", layer_1, "--layer", "0")
    assert done.returncode == 2 and done.stderr == f"stepper: error: {layer_1}: {LAYER_1}\n"
    inspected = stepper("inspect", "--plain", "--layers", "0:1", layer_1)
    assert inspected.returncode == 1 and inspected.stdout.splitlines()[-1] == f"  ! {LAYER_1}"


def test_layers_from_the_start_with_the_globals_run_as_a_model():
    assert partial_text([0, 1], 61, has_globals=True) == (
        "holds only layers 0..1 of 0..60: inspect with --layers 0:2, run with --layers 0:2")
    assert partial_text([0, 1], 61, has_globals=False) == (  # a model run needs the embedding
        "holds only layers 0..1 of 0..60, no embedding, norm or lm_head: inspect with --layers 0:2, run with --layer 0")
    assert partial_text([3, 4, 9], 61, has_globals=False) == (
        "holds only layers 3..4, 9 of 0..60, no embedding, norm or lm_head: inspect with --layers 3:5, run with "
        "--layer 3")
    assert partial_text([0, 1, 2], 3, has_globals=False) == (
        "holds layers 0..2, no embedding, norm or lm_head: inspect with --layers 0:3, run with --layer 0")
    assert partial_text([], 3, has_globals=False) == (
        "holds no tensor of layers 0..2 nor the embedding, norm or lm_head "
        "(names look like 'model.layers.0.input_layernorm.weight')")


def test_layers_from_the_start_without_the_embedding_are_refused_before_anything_is_shown(tmp_path):
    """--layers 0:1 of a checkpoint holding layer 0 alone reads the embedding it lacks: one line, no
    header first (it was refused only once the run began, naming model.embed_tokens.weight)."""
    out = tmp_path / "t0"
    assert stepper("synth", "--model", "tiny", "--layers", "0:1", "--out", out).returncode == 0
    done = stepper("run", "--plain", "--model", out, "--layers", "0:1")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (f"stepper: error: {out}: holds only layer 0 of 0..2, no embedding, norm or lm_head: "
                           "inspect with --layers 0:1, run with --layer 0\n")


def test_ids_for_a_layer_without_the_embedding_are_said_to_count_positions_only(layer_1):
    done = stepper("run", "--plain", "--model", layer_1, "--layer", "1", "--ids", "5,6", "--only", "layers.1.output")
    assert done.returncode == 0, done.stderr
    assert ("note: this checkpoint has no embedding table, so layer 1 runs on seeded random vectors and --ids only "
            "sets their number; give --input FILE (the hidden states of the layer before, dumped from a run) for real "
            "ones") in done.stdout.splitlines()
    seeded = stepper("run", "--plain", "--model", layer_1, "--layer", "1", "--only", "layers.1.output")
    assert "no embedding table, so" not in seeded.stdout  # no ids given: nothing to warn of
