"""Structure-aware fuzzing of a DeepSeek-V4 checkpoint in the published layout (hypothesis): the
sound tiny V4 checkpoint changed in a few places that know its structure (a config.json field, a
shard header's dtype or shape, a tensor dropped or renamed, bytes of a shard: its last ones are
scales), then everything a user can ask of it: `stepper inspect`'s checks with --stats, listed and
written as JSON, a run's check of every layer, every tensor read and made a matrix, and an FP4 or
FP8 product with each weight. Nothing may raise but StepperError. Derandomized."""

from __future__ import annotations

import io
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from helpers.malformed import config_edit, read_shard, write_shard
from helpers.v4_published import CONFIG, write_tiny_v4
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from stepper.errors import StepperError
from stepper.kernels.linear import linear
from stepper.views import inspect, inspect_stats
from stepper.weights.published import PublishedCheckpoint

SETTINGS = settings(max_examples=40, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
SHARDS = 3
values = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.text(max_size=6),
                   st.lists(st.integers(-1, 200), max_size=5), st.sampled_from([0, 1, 4, 128, -1, 2**31]))
dtypes = st.sampled_from(["F32", "BF16", "F8_E4M3", "F8_E8M0", "I8", "I64", "U8", "F16"])
dims = st.lists(st.integers(0, 70) | st.sampled_from([1, 16, 32, 64]), max_size=3)


@pytest.fixture(scope="module")
def sound(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("v4fuzz") / "v4"
    write_tiny_v4(folder, shards=SHARDS)
    return folder


@st.composite
def config_change(draw):
    key, value = draw(st.sampled_from(sorted(CONFIG))), draw(values | st.just(...))
    return config_edit(key, value)


@st.composite
def header_change(draw):
    shard, pick = draw(st.integers(1, SHARDS)), draw(st.integers(0, 10**6))
    field = draw(st.sampled_from(["dtype", "shape", "drop", "rename"]))
    value = draw({"dtype": dtypes, "shape": dims, "drop": st.none(),
                  "rename": st.sampled_from(["layers.1.ffn.experts.0.w1.scale", "layers.9.attn.wq_a.weight",
                                             "mtp.0.x", "layers.1.attn.wkv.scale", "x.scale"])}[field])

    def change(folder: Path) -> None:
        path = folder / f"model-{shard:05d}-of-{SHARDS:05d}.safetensors"
        try:
            tensors = read_shard(path)
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            return  # broken past reading by an earlier change
        name = sorted(tensors)[pick % len(tensors)]
        dtype, shape, data = tensors.pop(name)
        if field == "rename":
            tensors[value] = (dtype, shape, data)
        elif field == "dtype":
            tensors[name] = (value, shape, data)
        elif field == "shape":
            tensors[name] = (dtype, value, data)
        write_shard(path, tensors)  # a size that no longer fits its bytes is the reader's to refuse

    return change


@st.composite
def bytes_change(draw):
    shard, noise = draw(st.integers(1, SHARDS)), draw(st.binary(min_size=1, max_size=16))

    def change(folder: Path) -> None:
        path = folder / f"model-{shard:05d}-of-{SHARDS:05d}.safetensors"
        raw = bytearray(path.read_bytes())
        raw[-len(noise):] = noise  # 0xFF among them: a NaN E8M0 scale, if a scale ends the shard
        path.write_bytes(bytes(raw))

    return change


def exercise(folder: Path) -> None:
    try:
        source = inspect.open_source(folder)
        problems = inspect.find_problems(source, None)
        tensors = inspect_stats.with_stats(source, inspect.collect(source, None, problems), progress=False)
        groups = inspect.group(tensors, source.config, fold_experts=True, unused=source.unused,
                               published=source.published)
        inspect.render(Console(file=io.StringIO(), width=80), source, groups, tensors, inspect.total_tensors(source),
                       True, problems)
        inspect.write_json(io.StringIO(), groups, problems)
        ckpt = PublishedCheckpoint(folder)
        try:
            ckpt.check(range(ckpt.layers), with_globals=True)
        except StepperError:
            pass
        for name in ckpt.weight_map:
            try:
                ckpt.get(name)
                weight = ckpt.matrix(name)
                if np.ndim(weight) == 2:
                    linear(np.ones((2, weight.shape[1]), np.float32), weight)
            except StepperError:
                pass
    except StepperError:
        pass


@SETTINGS
@given(changes=st.lists(st.one_of(config_change(), header_change(), bytes_change()), min_size=1, max_size=3))
def test_a_changed_v4_checkpoint_raises_only_stepper_errors(sound, changes):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "v4"
        shutil.copytree(sound, folder)
        for change in changes:
            change(folder)
        exercise(folder)


def test_the_sound_checkpoint_is_exercised_whole(sound):
    exercise(sound)  # and it has no problem to find
    assert inspect.find_problems(inspect.open_source(sound), None) == []
