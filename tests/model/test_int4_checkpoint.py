"""INT4 checkpoints as `stepper synth --quant int4` writes them (Kimi-K2-Thinking's layout): their
files, a run from the directory bit for bit the synthetic run, and each way the three tensors of
an INT4 weight can be wrong refused in one line naming the file and the tensor."""

import dataclasses
import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from helpers.cli import stepper
from helpers.files import linked, reference_write
from safetensors.numpy import load_file

from stepper import int4
from stepper.errors import StepperError
from stepper.kernels.weight_cache import CachedWeights
from stepper.presets import preset
from stepper.seams.trace import Recorder
from stepper.session import RunSpec, run
from stepper.weights.checkpoint import Checkpoint
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.stored import Int4Matrix
from stepper.weights.synth_checkpoint import requantized, synth_checkpoint

EXPERT = "model.layers.1.mlp.experts.3.up_proj.weight"


@pytest.fixture(scope="module")
def int4_dir(tmp_path_factory) -> Path:
    source = SyntheticWeights(requantized(preset("tiny"), "int4"), seed=5)
    return synth_checkpoint(source, tmp_path_factory.mktemp("int4") / "ckpt")


def test_synth_int4_writes_kimi_k2_thinkings_layout(int4_dir):
    config = json.loads((int4_dir / "config.json").read_text())
    quant = config["quantization_config"]
    assert quant["quant_method"] == "compressed-tensors" and quant["format"] == "pack-quantized"
    assert quant["config_groups"]["group_0"]["weights"]["group_size"] == 32
    index = json.loads((int4_dir / "model.safetensors.index.json").read_text())["weight_map"]
    tensors = load_file(int4_dir / index[EXPERT + "_packed"])
    assert tensors[EXPERT + "_packed"].dtype == np.int32 and tensors[EXPERT + "_packed"].shape == (96, 40)
    assert tensors[EXPERT + "_scale"].shape == (96, 10)  # BF16 (loaded as its bytes)
    assert tensors[EXPERT + "_shape"].tolist() == [96, 320]
    assert EXPERT not in index and "model.layers.1.mlp.shared_experts.up_proj.weight" in index
    assert not any(n.endswith("_scale_inv") for n in index)


def test_a_run_from_the_directory_is_the_synthetic_run_bit_for_bit(int4_dir):
    spec = RunSpec(model=str(int4_dir), ids=(5, 17, 400), decode=1, seed=5)
    from_files, made = Recorder(), Recorder()
    run(spec, [from_files])
    run(spec, [made], SyntheticWeights(requantized(preset("tiny"), "int4"), seed=5))
    assert from_files.tensors().keys() == made.tensors().keys()
    for name, value in made.tensors().items():
        np.testing.assert_array_equal(from_files.tensors()[name], value, err_msg=name)


def test_the_weight_cache_keeps_int4_experts_decoded(int4_dir):
    cached = CachedWeights(Checkpoint(int4_dir), 1 << 24)
    first, second = cached.matrix(EXPERT), cached.matrix(EXPERT)
    assert isinstance(first, Int4Matrix) and isinstance(second, np.ndarray)
    np.testing.assert_array_equal(second, first.dequantize())


def rewritten(int4_dir: Path, folder: Path, change) -> Path:
    """A copy of the checkpoint with the expert's shard's tensors passed through change(dict)."""
    index = json.loads((int4_dir / "model.safetensors.index.json").read_text())
    shard = index["weight_map"][EXPERT + "_packed"]
    linked(int4_dir, folder, but={shard})
    tensors = dict(load_file(int4_dir / shard))
    for name, value in list(tensors.items()):
        if name.endswith(("_scale", ".weight")):  # BF16, which safetensors.numpy gives as its bytes
            tensors[name] = value.view(ml_dtypes.bfloat16)
    changed = change(tensors)
    reference_write(folder / shard, changed)
    index["weight_map"] = {n: s for n, s in index["weight_map"].items() if s != shard or n in changed}
    index["weight_map"].update(dict.fromkeys(changed, shard))
    (folder / "model.safetensors.index.json").unlink()
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def without(name):
    return lambda t: {k: v for k, v in t.items() if k != name}


def replaced(name, value):
    return lambda t: {**t, name: value}


@pytest.mark.parametrize("change, says", [
    (without(EXPERT + "_scale"), f"'{EXPERT}_scale' is missing: the INT4 weight '{EXPERT}' [96, 320] needs it"),
    (replaced(EXPERT + "_scale", np.ones((96, 5), ml_dtypes.bfloat16)),
     f"'{EXPERT}_scale' is BF16 [96, 5], expected BF16 or F16 or F32 [96, 10]"),
    (replaced(EXPERT + "_packed", np.zeros((96, 40), np.int64)),
     f"'{EXPERT}_packed' is I64 [96, 40], expected I32 [96, 40]"),
    (replaced(EXPERT + "_shape", np.array([96, 321], np.int64)),
     f"'{EXPERT}_shape' holds [96, 321], expected [96, 320]"),
    (lambda t: {**without(EXPERT + "_packed")(t), EXPERT: np.ones((96, 320), ml_dtypes.bfloat16)},
     f"'{EXPERT}' is stored unquantized, but config.json's quantization_config quantizes this module"),
    (lambda t: {**{k: v for k, v in t.items() if not k.startswith(EXPERT + "_")},  # none of its three parts:
                EXPERT: np.ones((96, 320), ml_dtypes.bfloat16)},                    # one line, not three alike
     f"'{EXPERT}' is stored unquantized, but config.json's quantization_config quantizes this module"),
])
def test_a_wrong_int4_weight_is_one_line_naming_the_file_and_tensor(int4_dir, tmp_path, change, says):
    folder = rewritten(int4_dir, tmp_path / "bad", change)
    with pytest.raises(StepperError) as refused:
        Checkpoint(folder).check(range(3), with_globals=True)
    lines = str(refused.value).splitlines()  # one problem: one line
    assert len(lines) == 1 and lines[0].startswith(f"{folder}: ") and says in lines[0], lines


@pytest.mark.parametrize("damage, why", [
    (lambda path: path.unlink(), "no such file"),
    (lambda path: path.write_bytes(path.read_bytes()[:5000]), "past the end of the file"),
])
def test_an_unreadable_int4_shard_is_one_line_as_any_shard_is(int4_dir, tmp_path, damage, why):
    shard = json.loads((int4_dir / "model.safetensors.index.json").read_text())["weight_map"][EXPERT + "_packed"]
    folder = tmp_path / "ck"
    linked(int4_dir, folder, but={shard}, copied=True)
    damage(folder / shard)
    with pytest.raises(StepperError) as refused:  # not one line per INT4 part it holds (289 of them)
        Checkpoint(folder).check([1], with_globals=False)
    lines = str(refused.value).splitlines()
    assert len(lines) == 1 and f"{shard} cannot be read (" in lines[0] and why in lines[0], lines
    assert "it holds 110 tensors of the layers checked, first 'model.layers.1.input_layernorm.weight'" in lines[0]


def test_a_nan_group_scale_stops_the_run_in_one_line(int4_dir, tmp_path):
    scales = np.ones((96, 10), ml_dtypes.bfloat16)
    scales[7, 2] = np.nan
    folder = rewritten(int4_dir, tmp_path / "nan", replaced(EXPERT + "_scale", scales))
    with pytest.raises(StepperError, match=rf"'{EXPERT}_scale' holds 1 group scale\(s\) that are not finite, "
                                           r"first nan at \[7, 2\]"):
        Checkpoint(folder).matrix(EXPERT)


def test_bf16_group_scales_are_checked_once_per_checkpoint(int4_dir, monkeypatch):
    from stepper.weights import checkpoint as reader

    calls, kept = [], []
    check, keep = reader.check_int4_scales, int4.kept_scales
    monkeypatch.setattr(reader, "check_int4_scales", lambda *a: calls.append(a[1]) or check(*a))
    monkeypatch.setattr(int4, "kept_scales", lambda *a: kept.append(a[1]) or keep(*a))
    opened = Checkpoint(int4_dir)
    first, again = opened.matrix(EXPERT), opened.matrix(EXPERT)
    assert calls == [EXPERT + "_scale"] and not kept  # Int4Matrix.of does not look at them again
    assert first.scales.dtype == ml_dtypes.bfloat16 and opened.stored(EXPERT).rows(32, 64).checked
    np.testing.assert_array_equal(again.dequantize(), first.dequantize())
    Checkpoint(int4_dir).matrix(EXPERT)  # another reader of the folder checks them itself
    assert calls == [EXPERT + "_scale"] * 2


def test_synth_and_run_on_the_command_line(tmp_path):
    made = stepper("synth", "--out", str(tmp_path / "k"), "--quant", "int4")
    assert made.returncode == 0 and "wrote" in made.stdout, made.stderr
    ran = stepper("run", "--model", str(tmp_path / "k"), "--ids", "1,2,3", "--plain")
    assert ran.returncode == 0 and "logits" in ran.stdout, ran.stderr
    wrong = stepper("synth", "--out", str(tmp_path / "x"), "--quant", "int3")
    assert wrong.returncode == 2 and wrong.stderr.strip().endswith("--quant int3: expected one of fp8, int4, bf16")


def test_an_int4_lm_head_is_read_block_by_block(tmp_path):
    """With lm_head left out of `ignore`, lm_head is INT4 too: the logits come from its packed words."""
    cfg = requantized(preset("tiny"), "int4")
    cfg = dataclasses.replace(cfg, int4=dataclasses.replace(cfg.int4, ignore=cfg.int4.ignore[1:]))
    folder = synth_checkpoint(SyntheticWeights(cfg, seed=2), tmp_path / "ckpt")
    assert isinstance(Checkpoint(folder).matrix("lm_head.weight"), Int4Matrix)
    spec = RunSpec(model=str(folder), ids=(3, 4), seed=2)
    from_files, made = Recorder(), Recorder()
    run(spec, [from_files])
    run(spec, [made], SyntheticWeights(cfg, seed=2))
    np.testing.assert_array_equal(from_files.tensors()["logits"], made.tensors()["logits"])


def test_inspect_finds_a_sound_int4_checkpoint_sound(int4_dir):
    """Every INT4 weight's three tensors are tensors of its layer: nothing unknown, no problem, exit 0."""
    from stepper.weights.audit import audit

    ckpt = Checkpoint(int4_dir)
    assert audit(ckpt, range(ckpt.config.num_hidden_layers), with_globals=True) == []
