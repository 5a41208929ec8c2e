"""What a checkpoint's files say is bounded before it runs: an INT4 config's regular expressions
(only a subset whose work is bounded is run), a group scale of zero or below, a weight_shape that
is no number, F8 tensors of a file that is not a checkpoint. Each bad input is one line, exit 2."""

import json
from pathlib import Path

import pytest
from helpers.cli import stepper

from stepper.presets import preset
from stepper.weights.synth import requantized, synth_checkpoint
from stepper.weights.synthetic import SyntheticWeights

EXPERT = "model.layers.1.mlp.experts.3.up_proj.weight"


def one_line(out, code: int = 2) -> str:
    assert out.returncode == code, out.stdout[-2000:] + out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    return lines[0]


@pytest.fixture(scope="module")
def int4_dir(tmp_path_factory) -> Path:
    return synth_checkpoint(SyntheticWeights(requantized(preset("tiny"), "int4"), 1), tmp_path_factory.mktemp("b") / "c")


def linked_copy(source: Path, folder: Path, *, but: str) -> Path:
    """folder with links to every file of source but `but`, which is copied (to be changed)."""
    folder.mkdir()
    for file in source.iterdir():
        if file.name == but:
            (folder / but).write_bytes(file.read_bytes())
        else:
            (folder / file.name).symlink_to(file)
    return folder


def with_ignore(int4_dir: Path, folder: Path, entry: str) -> Path:
    copy = linked_copy(int4_dir, folder, but="config.json")
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

