"""Structure-aware fuzzing of whole checkpoint directories and fixture folders (hypothesis).

Each example is the sound `mini` checkpoint (tests/helpers/malformed.py) or a fixture folder
exported from it, changed in a few places that know the structure: a config.json field, an
index entry, a shard header's dtype, shape or offsets, bytes of a shard or of a tensor, a
manifest field. Then everything a user can ask of it runs: the checks of `stepper inspect`
(with --stats), `check` for a run of every layer, reading every tensor, loading the fixture and
verifying a candidate against it. Nothing may raise but StepperError, and what is allocated,
read and decoded stays within bounds set by the files' sizes (work, not seconds: a bound in
seconds fails on a busy machine).
Derandomized: CI sees the same examples every time.
"""

from __future__ import annotations

import io
import json
import shutil
import tempfile
from pathlib import Path

import pytest
from helpers.files import size_of
from helpers.malformed import INDEX_FILE, MINI_CONFIG, config_edit, read_shard, write_shard
from helpers.work import counted
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from stepper.config import Config
from stepper.errors import StepperError
from stepper.fixtures import aliases, verify
from stepper.fixtures.export import export
from stepper.fixtures.fixture import load
from stepper.fixtures.spec import ExportSpec
from stepper.views import inspect, inspect_stats
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.synth_checkpoint import synth_checkpoint

SETTINGS = settings(max_examples=60, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
TENSOR_READS = 2  # the sound checkpoint's exercise hands out 0.9 times its bytes
ALLOCATED = 32 * 2**20  # the files are about 130 KB: a reader that trusts a size it read would go far past this

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                      st.text(max_size=12), st.sampled_from([0, -1, 1, 2**31, 2**63, 1e308, "", "\x1b[2J"]))
json_value = st.recursive(
    json_leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)
dtypes = st.sampled_from(["F32", "BF16", "F16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "I8", "I64", "BOOL", "U8", "bf16",
                          "Q4"])
dims = st.lists(st.integers(-2, 2**40) | st.sampled_from([0, 1, 16, 32, 48, 64]), max_size=4)


@pytest.fixture(scope="module")
def sound(tmp_path_factory) -> tuple[Path, Path]:
    """The mini checkpoint, and a fixture folder exported from it. stepper's own naming tables (read
    once a process, by the first verify) are read here, before any bound is measured: the bounds are
    on the files a user gives, which the tables' bytes would otherwise hide in the first example."""
    root = tmp_path_factory.mktemp("fuzz")
    ckpt = synth_checkpoint(SyntheticWeights(Config.from_hf(MINI_CONFIG, "mini"), seed=0), root / "ck")
    export(ExportSpec(model=str(ckpt), prompt_len=2), root / "fixture")
    aliases.tables()
    return ckpt, root / "fixture"


# -- changes to a checkpoint, each knowing one piece of its structure


@st.composite
def config_change(draw):
    key = draw(st.sampled_from(sorted(MINI_CONFIG)))
    value = draw(json_value | st.just(...))
    return config_edit(key, value)


@st.composite
def index_change(draw):
    pick = draw(st.integers(0, 10**6))
    shard = draw(st.text(max_size=20) | st.sampled_from(["model-00001-of-00004.safetensors",
                                                         "model-00003-of-00004.safetensors"]))
    whole = draw(st.none() | json_value)

    def change(folder: Path) -> None:
        index = json.loads((folder / INDEX_FILE).read_text())
        if whole is not None or not isinstance(index, dict) or not index.get("weight_map"):
            index = whole  # (an index already replaced stays something else)
        else:
            names = sorted(index["weight_map"])
            index["weight_map"][names[pick % len(names)]] = shard
        (folder / INDEX_FILE).write_text(json.dumps(index))

    return change


@st.composite
def header_change(draw):
    shard, pick = draw(st.integers(1, 4)), draw(st.integers(0, 10**6))
    field = draw(st.sampled_from(["dtype", "shape", "data_offsets", "drop", "rename"]))
    value = draw({"dtype": dtypes, "shape": dims, "data_offsets": st.lists(st.integers(-1, 2**64), max_size=3),
                  "drop": st.none(), "rename": st.text(max_size=20)}[field])

    def change(folder: Path) -> None:
        path = folder / f"model-0000{shard}-of-00004.safetensors"
        try:
            tensors = read_shard(path)
        except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
            return  # already broken past reading by an earlier change
        if not tensors:
            return
        name = sorted(tensors)[pick % len(tensors)]
        dtype, shape, data = tensors.pop(name)
        if field == "rename":
            tensors[value] = (dtype, shape, data)
        elif field == "dtype":
            tensors[name] = (value, shape, data)
        elif field == "shape":
            tensors[name] = (dtype, value, data)
        if field == "data_offsets":
            raw = path.read_bytes()
            n = int.from_bytes(raw[:8], "little")
            header = json.loads(raw[8:8 + n])
            header[name]["data_offsets"] = value
            text = json.dumps(header).encode()
            path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])
        else:
            write_shard(path, tensors)

    return change


@st.composite
def bytes_change(draw):
    shard, where = draw(st.integers(1, 4)), draw(st.integers(0, 10**6))
    kind = draw(st.sampled_from(["flip", "cut", "append", "scale"]))
    noise = draw(st.binary(min_size=1, max_size=16))

    def change(folder: Path) -> None:
        path = folder / f"model-0000{shard}-of-00004.safetensors"
        raw = bytearray(path.read_bytes())
        if not raw:
            return
        at = where % len(raw)
        if kind == "flip":
            raw[at] ^= noise[0] or 0xFF
        elif kind == "cut":
            del raw[at:]
        elif kind == "append":
            raw += noise
        else:  # the last bytes of the file: in these shards, block scales
            raw[-len(noise):] = noise
        path.write_bytes(bytes(raw))

    return change


checkpoint_changes = st.lists(st.one_of(config_change(), index_change(), header_change(), bytes_change()),
                              min_size=1, max_size=3)


def exercise_checkpoint(folder: Path) -> None:
    """What inspect, inspect --stats, a run's check and a run's reads do with the checkpoint."""
    try:
        source = inspect.open_source(folder)
        problems = inspect.find_problems(source, None)
        tensors = inspect_stats.with_stats(source, inspect.collect(source, None, problems), progress=False)
        groups = inspect.group(tensors, source.config, fold_experts=True)
        inspect.render(Console(file=io.StringIO(), width=80), source, groups, tensors,
                       inspect.total_tensors(source), True, problems)
        inspect.write_json(io.StringIO(), inspect.group(tensors, source.config, fold_experts=False), problems)
        ckpt = source.checkpoint
        assert ckpt is not None
        try:
            ckpt.check(range(ckpt.config.num_hidden_layers), with_globals=True)
        except StepperError:
            pass
        for name in ckpt.weight_map:
            try:
                ckpt.matrix(name)
            except StepperError:
                pass
    except StepperError:
        pass


def bounded(exercise, *paths: Path) -> None:
    """The exercise of the files at `paths`, its allocations and its reads bounded by their sizes:
    each file read about once by read() calls (fixtures: and hashed), each tensor's bytes handed out
    at most twice over."""
    files = sum(size_of(path) for path in paths)
    with counted(traced=True) as work:
        exercise(*paths)
    assert (work.peak < ALLOCATED and work.read <= 2 * files + 64 * 1024
            and work.tensor_bytes <= TENSOR_READS * files), work


@SETTINGS
@given(changes=checkpoint_changes)
def test_a_changed_checkpoint_raises_only_stepper_errors(sound, changes):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "ck"
        shutil.copytree(sound[0], folder)
        for change in changes:
            change(folder)
        bounded(exercise_checkpoint, folder)


# -- fixture folders


@st.composite
def manifest_change(draw):
    where = draw(st.sampled_from(["top", "entry", "weights", "config"]))
    key = draw(st.sampled_from(["format", "version", "tensors", "config", "weights", "name", "shape", "sha256",
                                "key", "phase",
                                "layer", "dims", "tolerance", "files", "path", "qk_rope_head_dim", "hidden_size"]))
    value, pick = draw(json_value | st.just(...)), draw(st.integers(0, 10**6))

    def change(folder: Path) -> None:
        manifest = json.loads((folder / "manifest.json").read_text())
        if not all(isinstance(manifest.get(k), t) and manifest[k] for k,
                   t in (("tensors", list), ("weights", dict), ("config", dict))):
            return  # already changed past this change's reach
        if not isinstance(manifest["tensors"][pick % len(manifest["tensors"])], dict):
            return
        target = {"top": manifest, "entry": manifest["tensors"][pick % len(manifest["tensors"])],
                  "weights": manifest["weights"], "config": manifest["config"]}[where]
        target.pop(key, None) if value is ... else target.__setitem__(key, value)
        (folder / "manifest.json").write_text(json.dumps(manifest))

    return change


@st.composite
def tensors_change(draw):
    where, noise = draw(st.integers(0, 10**6)), draw(st.binary(min_size=1, max_size=8))

    def change(folder: Path) -> None:
        path = folder / "tensors.safetensors"
        raw = bytearray(path.read_bytes())
        if not raw:
            return
        at = where % len(raw)
        raw[at:at + len(noise)] = noise
        path.write_bytes(bytes(raw))

    return change


def exercise_fixture(folder: Path, candidate: Path) -> None:
    try:
        verify.verify(load(folder), candidate)
    except StepperError:
        pass


@SETTINGS
@given(changes=st.lists(manifest_change() | tensors_change(), min_size=1, max_size=3))
def test_a_changed_fixture_folder_raises_only_stepper_errors(sound, changes):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "fixture"
        shutil.copytree(sound[1], folder, ignore=shutil.ignore_patterns("weights"))
        candidate = Path(tmp) / "candidate.safetensors"
        shutil.copy(sound[1] / "tensors.safetensors", candidate)
        for change in changes:
            change(folder)
        bounded(exercise_fixture, folder, candidate)
