"""A run that makes a NaN says where the first one is, once, on stderr; NumPy's own warnings
(with their source lines) never reach the terminal; a fixture of NaN is not written."""

import json
import struct

from helpers.cli import refused, stepper

Q_A = "model.layers.1.self_attn.q_a_proj.weight"


def test_the_first_nan_is_named_once_and_numpy_says_nothing():
    out = stepper("run", "--layers", "0:2", "--only", "*output", "--patch", "layers.0.input_layernorm=x*inf",
                  "--plain")
    assert out.returncode == 0
    assert out.stderr == ("stepper: warning: the first tensor shown with a NaN is layers.0.self_attn.attn_output "
                          "(896 of 896 values): `stepper step` with this run's options and --until "
                          "layers.0.self_attn.attn_output shows what it was made from\n")
    every = stepper("run", "--layers", "0:2", "--patch", "layers.0.input_layernorm=x*inf", "--plain")
    assert every.stderr.startswith("stepper: warning: the first tensor shown with a NaN is layers.0.self_attn.q_a "
                                   "(1,344 of 1,344 values)") and every.stderr.count("\n") == 1
    clean = stepper("run", "--layers", "0:2", "--plain")
    assert clean.returncode == 0 and clean.stderr == ""


def test_a_fixture_of_a_checkpoint_whose_weight_holds_a_nan_code_is_refused(tmp_path):
    folder = tmp_path / "ck"
    assert stepper("synth", "--model", "tiny", "--out", folder).returncode == 0
    shard = folder / json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"][Q_A]
    data = bytearray(shard.read_bytes())
    length = struct.unpack("<Q", data[:8])[0]
    first = json.loads(data[8:8 + length])[Q_A]["data_offsets"][0]
    data[8 + length + first] = 0x7F  # an e4m3fn NaN code
    shard.write_bytes(bytes(data))
    line = refused(stepper("fixtures", "export", tmp_path / "fx", "--model", folder, "--layer", "1"))
    assert line.startswith("no fixture written: the first tensor shown with a NaN is layers.1.self_attn.q_a (")
    assert not (tmp_path / "fx").exists()
