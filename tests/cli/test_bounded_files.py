"""What a checkpoint's files say is bounded before it runs: an INT4 config's regular expressions
(only a subset whose work is bounded is run), a group scale of zero or below, a weight_shape that
is no number, F8 tensors of a file that is not a checkpoint. Each bad input is one line, exit 2."""

import json
from pathlib import Path

import numpy as np
import pytest
from helpers.cli import one_line, stepper
from helpers.files import linked
from helpers.malformed import read_shard, write_shard

from stepper.presets import preset
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.synth_checkpoint import requantized, synth_checkpoint

EXPERT = "model.layers.1.mlp.experts.3.up_proj.weight"


@pytest.fixture(scope="module")
def int4_dir(tmp_path_factory) -> Path:
    return synth_checkpoint(SyntheticWeights(requantized(preset("tiny"), "int4"), 1),
                            tmp_path_factory.mktemp("b") / "c")


def with_ignore(int4_dir: Path, folder: Path, entry: str) -> Path:
    copy = linked(int4_dir, folder, but={"config.json"}, copied=True)
    raw = json.loads((copy / "config.json").read_text())
    raw["quantization_config"]["ignore"].append(entry)
    (copy / "config.json").write_text(json.dumps(raw))
    return copy


COMMANDS = [("run", "--plain", "--only", "logits"), ("inspect", "--plain"), ("fp8", "--weight", EXPERT, "--plain")]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: a[0])
@pytest.mark.parametrize(("pattern", "says"), [
    ("re:(.*.*)*!", "uses a repeated group, outside the subset stepper runs"),
    ("re:(a|aa)*b", "uses a repeated group"),
    ("re:.*.*.*.*!", "could try 2.8e+08 ways of matching a name of 128 characters (at most 1e+07)"),
    ("re:(x)\\1", "uses a backreference"),
    ("re:" + "(" * 20 + ")" * 20, "nests groups more than 16 deep"),
    ("re:" + "a" * 5000, "...', which is longer than 256 characters"),
], ids=["nested-star", "overlapping-alternatives", "four-stars", "backreference", "deep", "long"])
def test_a_pattern_whose_work_is_not_bounded_is_refused_before_it_runs(int4_dir, tmp_path, args, pattern, says):
    folder = with_ignore(int4_dir, tmp_path / "c", pattern)
    command, *rest = args
    where = [str(folder)] if command == "inspect" else ["--model", str(folder)]
    line = one_line(stepper(command, *where, *rest))
    assert line.startswith(f"stepper: error: {folder / 'config.json'}: field 'quantization_config.ignore' holds "), line
    assert says in line



def with_tensor(int4_dir: Path, folder: Path, name: str, dtype: str, shape: list[int], data: bytes) -> Path:
    """The INT4 checkpoint with one tensor replaced (its shard copied, the rest linked)."""
    shard = json.loads((int4_dir / "model.safetensors.index.json").read_text())["weight_map"][name]
    copy = linked(int4_dir, folder, but={shard}, copied=True)
    tensors = read_shard(copy / shard)
    tensors[name] = (dtype, shape, data)
    write_shard(copy / shard, tensors)
    return copy


def scales_of(int4_dir: Path, name: str) -> np.ndarray:
    shard = json.loads((int4_dir / "model.safetensors.index.json").read_text())["weight_map"][name]
    _, shape, data = read_shard(int4_dir / shard)[name]
    return np.frombuffer(data, "<u2").reshape(shape).copy()  # BF16 bits


@pytest.mark.parametrize("args", [("fp8", "--weight", EXPERT, "--plain"), ("run", "--plain", "--only", "logits")],
                         ids=["fp8", "run"])
def test_a_weight_shape_of_floats_is_one_line(int4_dir, tmp_path, args):
    folder = with_tensor(int4_dir, tmp_path / "c", EXPERT + "_shape", "F32", [2],
                         np.array([np.nan, 320], "<f4").tobytes())
    command, *rest = args
    shard = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"][EXPERT + "_shape"]
    line = one_line(stepper(command, "--model", str(folder), *rest))
    assert f"{shard}: '{EXPERT}_shape' is F32 [2], expected I64 or I32 [2]" in line


@pytest.mark.parametrize(("bits", "value"), [(0x0000, "0.0"), (0xBF80, "-1.0")], ids=["zero", "negative"])
def test_a_group_scale_of_zero_or_below_is_refused_as_fp8s_are(int4_dir, tmp_path, bits, value):
    import stepper as api

    chosen = int(api.run(str(int4_dir), keep="topk_idx")["layers.1.mlp.gate.topk_idx"][0, 0])  # read by every run
    expert = f"model.layers.1.mlp.experts.{chosen}.up_proj.weight"
    scales = scales_of(int4_dir, expert + "_scale")
    scales[2, 1] = bits
    folder = with_tensor(int4_dir, tmp_path / "c", expert + "_scale", "BF16", list(scales.shape), scales.tobytes())
    shard = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"][expert + "_scale"]
    why = (f"{shard}: '{expert}_scale' holds 1 group scale(s) of zero or below, first {value} at [2, 1]: a symmetric "
           "quantizer writes max|w| / 7.5 > 0; zero loses the group's weights, a negative scale flips their signs")
    assert one_line(stepper("run", "--model", str(folder), "--plain", "--only", "logits")) == f"stepper: error: {why}"
    listed = stepper("inspect", str(folder), "--plain", "--experts", "--only", f"*layers.1.mlp.experts.{chosen}.*")
    assert listed.returncode == 1, listed.stderr
    assert why in listed.stdout.splitlines()[-1]


def test_a_lone_file_of_activations_has_no_scales_to_miss(tmp_path):
    codes = np.arange(16, dtype=np.uint8).reshape(4, 4).tobytes()
    tensors = {"t_f8": ("F8_E4M3", [4, 4], codes), "q": ("F8_E4M3", [2, 8], codes), "x": ("F32", [1], bytes(4)),
               "model.layers.0.self_attn.q_a_proj.weight": ("F8_E4M3", [4, 4], codes)}
    without_q_a = {k: v for k, v in tensors.items() if k != "model.layers.0.self_attn.q_a_proj.weight"}
    write_shard(tmp_path / "acts.safetensors", without_q_a)
    out = stepper("inspect", str(tmp_path / "acts.safetensors"), "--plain")
    assert out.returncode == 0, out.stdout
    assert "3 tensors, 36 B" in out.stdout and "problem" not in out.stdout
    write_shard(tmp_path / "weights.safetensors", tensors)  # a weight's name: its scales are demanded
    out = stepper("inspect", str(tmp_path / "weights.safetensors"), "--plain")
    assert out.returncode == 1
    assert out.stdout.splitlines()[-1].strip() == (
        "! 'model.layers.0.self_attn.q_a_proj.weight_scale_inv' is missing: the F8_E4M3 weight "
        "'model.layers.0.self_attn.q_a_proj.weight' needs its block scales")


ESCAPES = "k2\x1b]0;pwned\x07\x1b[2J\r\x9b1m"


def test_a_config_name_with_escape_sequences_reaches_no_repr_or_screen_raw(tmp_path):
    import stepper as api

    folder = synth_checkpoint(SyntheticWeights(preset("tiny"), 0), tmp_path / "c")
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, "_name_or_path": ESCAPES}))
    run = api.run(str(folder), prompt_len=2, keep="logits")
    assert repr(run).startswith("<stepper.Run k2\\x1b]0;pwned\\x07\\x1b[2J\\r\\u009b1m: 3 tensors kept")
    out = stepper("run", "--model", str(folder), "--plain", "--only", "logits")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("model k2\\x1b]0;pwned\\x07\\x1b[2J\\r\\u009b1m (kimi_k2)")
    assert not any(c in out.stdout + repr(run) + run._repr_html_() for c in "\x1b\x07\r\x9b")


def test_a_diffs_repr_escapes_the_tensor_names_from_files():
    import stepper as api

    name = "x\x1b[2J"
    shown_diff = repr(api.diff({name: np.zeros(2, np.float32)}, {name: np.ones(2, np.float32)}))
    assert shown_diff.endswith("first difference x\\x1b[2J>") and "\x1b" not in shown_diff
