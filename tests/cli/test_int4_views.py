"""The INT4 views: `stepper fp8 --int4` (the codes, one word), `stepper fp8 --weight` on an INT4
weight (one group nibble by nibble), and `stepper inspect` of an INT4 checkpoint (one row per
weight with its group grid, its problems in its row)."""

import json
from pathlib import Path

import numpy as np
import pytest
from helpers.cli import stepper
from helpers.files import linked

from stepper.presets import preset
from stepper.weights.checkpoint import Checkpoint
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.synth_checkpoint import requantized, synth_checkpoint

EXPERT = "model.layers.1.mlp.experts.3.up_proj.weight"


@pytest.fixture(scope="module")
def int4_dir(tmp_path_factory) -> Path:
    return synth_checkpoint(SyntheticWeights(requantized(preset("tiny"), "int4"), 1),
                            tmp_path_factory.mktemp("v") / "c")


def test_one_word_nibble_by_nibble():
    shown = stepper("fp8", "--int4", "0x89ABCDEF", "--plain")
    assert shown.returncode == 0, shown.stderr
    assert "1000 1001 1010 1011 1100 1101 1110 1111" in shown.stdout
    assert "nibble 0 (bits  0.. 3, input 8w+0): 1111 = 15 -> 15 - 8 = +7" in shown.stdout
    assert "nibble 7 (bits 28..31, input 8w+7): 1000 =  8 -> 8 - 8 = +0" in shown.stdout
    record = json.loads(stepper("fp8", "--int4", "0xFFFFFFFF", "--json").stdout)
    assert record["hex"] == "0xFFFFFFFF" and [n["value"] for n in record["nibbles"]] == [7] * 8
    codes = json.loads(stepper("fp8", "--int4", "--json").stdout)
    assert [(c["bits"], c["value"]) for c in codes[::5]] == [("0000", -8), ("0101", -3), ("1010", 2), ("1111", 7)]
    bad = stepper("fp8", "--int4", "0x1FFFFFFFF")
    assert bad.returncode == 2 and "does not fit in 32 bits" in bad.stderr


def test_one_group_of_an_int4_weight_beside_its_values(int4_dir):
    shown = stepper("fp8", "--weight", EXPERT, "--model", str(int4_dir), "--block", "5,2", "--json")
    assert shown.returncode == 0, shown.stderr
    group = json.loads(shown.stdout)
    weight = Checkpoint(int4_dir).matrix(EXPERT).dequantize()
    assert group["inputs"] == [64, 96] and group["shape"] == [96, 320]
    np.testing.assert_array_equal(np.array(group["values"], np.float32), weight[5, 64:96])
    nibbles = [n["value"] for w in group["words"] for n in w["nibbles"]]
    np.testing.assert_array_equal(np.float32(group["scale"]) * np.array(nibbles, np.float32), weight[5, 64:96])
    text = stepper("fp8", "--weight", EXPERT, "--model", str(int4_dir), "--block", "5,2", "--plain").stdout
    assert "row 5, group 2 (inputs 64..95)" in text and text.count("  nibble ") == 32
    outside = stepper("fp8", "--weight", EXPERT, "--model", str(int4_dir), "--block", "0,10")
    assert outside.returncode == 2 and "has rows 0..95 and groups 0..9 of 32 inputs" in outside.stderr


def test_inspect_shows_each_int4_weight_with_its_group_grid(int4_dir):
    listed = stepper("inspect", str(int4_dir), "--plain", "--layers", "1:2")
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if "experts.{0..31}.up_proj" in line)
    assert row.split()[:5] == ["mlp.experts.{0..31}.up_proj.weight_packed", "INT4", "[96,", "320]", "x32"]
    assert "groups [96, 10] BF16" in row
    names = [line.split()[0] for line in listed.stdout.splitlines() if line.startswith("  ")]
    assert not [n for n in names if n.endswith(("weight_scale", "weight_shape"))]  # shown in their weight's row
    stats = stepper("inspect", str(int4_dir), "--json", "--stats", "--only", f"{EXPERT}*")
    first = json.loads(stats.stdout.splitlines()[0])
    weight = Checkpoint(int4_dir).matrix(EXPERT).dequantize()
    assert first["stats_of"] == "dequantized" and first["int4"]["weight_shape"] == [96, 320]
    assert first["stats"]["absmax"] == pytest.approx(float(np.abs(weight).max()), rel=1e-6)


def test_inspect_reports_a_nan_group_scale_in_its_weights_row(int4_dir, tmp_path):
    import ml_dtypes
    from helpers.files import reference_write
    from safetensors.numpy import load_file

    index = json.loads((int4_dir / "model.safetensors.index.json").read_text())["weight_map"]
    shard = index[EXPERT + "_scale"]
    folder = linked(int4_dir, tmp_path / "nan", but={shard})
    tensors = {n: (v.view(ml_dtypes.bfloat16) if n.endswith(("_scale", ".weight")) else v)
               for n, v in load_file(int4_dir / shard).items()}
    tensors[EXPERT + "_scale"] = tensors[EXPERT + "_scale"].copy()
    tensors[EXPERT + "_scale"][3, 1] = np.nan
    reference_write(folder / shard, tensors)
    listed = stepper("inspect", str(folder), "--plain", "--experts", "--only", "*layers.1.mlp.experts.3.*")
    assert listed.returncode == 1, listed.stderr
    why = f"'{EXPERT}_scale' holds 1 group scale(s) that are not finite, first nan at [3, 1]"
    lines = listed.stdout.splitlines()
    row = next(i for i, line in enumerate(lines) if "experts.3.up_proj.weight_packed" in line)
    assert why in lines[row + 1] and why in lines[-1]
