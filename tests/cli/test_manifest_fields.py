"""A fixture manifest a reader cannot use is one line naming the file and the field, exit 2: a
missing `run` or `inputs`, a tolerance without its `kind` or `atol`, strings where numbers belong.
Then fuzzing (derandomized, bounded): changed manifests and `--map` files end in exit 0 or 1, or
exit 2 with one line, never a traceback."""

import json
from pathlib import Path

import pytest
from helpers.cli import ends_well, stepper
from helpers.malformed import changed_at, paths_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "fixtures" / "tiny-prefill-decode"
SOUND = json.loads((FIXTURE / "manifest.json").read_text())
SETTINGS = settings(max_examples=40, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def verify(folder: Path, *more: str):
    return stepper("fixtures", "verify", str(folder), str(FIXTURE / "tensors.safetensors"), "--plain", *more)


def fixture_with(folder: Path, manifest: dict) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "tensors.safetensors").unlink(missing_ok=True)
    (folder / "tensors.safetensors").symlink_to(FIXTURE / "tensors.safetensors")
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def changed(path: tuple, value) -> dict:
    return changed_at(SOUND, [(path, value)])


def test_the_sound_manifest_verifies(tmp_path):
    out = verify(fixture_with(tmp_path / "f", SOUND))
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(("path", "value", "says"), [
    (("run",), KeyError, "no 'run' (an object expected)"),
    (("inputs",), KeyError, "no 'inputs' (an object expected)"),
    (("run", "kind"), KeyError, "'run.kind' must be one of model, layer, got None"),
    (("run", "kind"), "everything", "'run.kind' must be one of model, layer, got 'everything'"),
    (("inputs", "steps"), KeyError, "inputs: no 'steps' (a list expected)"),
    (("inputs", "steps"), [], "'inputs.steps' must list at least the prefill"),
    (("inputs", "steps", 0, "ids"), "17 402", "inputs.steps[0]: 'ids' must be a list"),
    (("inputs", "steps", 0, "ids"), ["17"], "inputs.steps[0]: 'ids' must be a list of token ids (integers >= 0)"),
    (("tensors", 0, "tolerance", "kind"), KeyError,
     "tensors[0] tolerance: 'kind' must be one of allclose, exact, same-experts, same-entries, got None"),
    (("tensors", 0, "tolerance", "atol"), KeyError, "tensors[0] tolerance: no 'atol' (a number expected)"),
    (("tensors", 0, "tolerance", "atol"), "1e-3", "tensors[0] tolerance: 'atol' must be a number"),
    (("tensors", 0, "tolerance", "rtol"), -1, "tensors[0] tolerance: 'rtol' must be a finite number >= 0, got -1"),
    (("tensors", 0, "layer"), "1", "tensors[0] 'layer' must be an integer or null"),
    (("tensors", 0, "shape"), ["1", "7"], "tensors[0] 'shape' must be a list of non-negative integers"),
    (("tensors", 0, "dims"), [1, 2], "tensors[0] 'dims' must be a list of dimension names (strings)"),
], ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple) else None)
def test_a_field_a_reader_needs_is_checked_with_one_line_naming_it(tmp_path, path, value, says):
    folder = fixture_with(tmp_path / "f", changed(path, value))
    out = verify(folder)
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
    assert out.stderr.strip() == f"stepper: error: {folder / 'manifest.json'}: {says}"


def test_an_infinite_tolerance_is_refused(tmp_path):
    folder = fixture_with(tmp_path / "f", SOUND)
    text = (folder / "manifest.json").read_text().replace('"atol": 3.7812500522704795e-05', '"atol": 1e999', 1)
    (folder / "manifest.json").write_text(text)
    out = verify(folder)
    assert out.stderr.strip().endswith("tensors[0] tolerance: 'atol' must be a finite number >= 0, got inf")


LONG = "\x1b" + "k" * 100_000  # a value of 100,000 characters, an escape sequence first
BOUNDED_CASES = {  # (the path changed, the value, the line's end): a value is shown cut, its refusal one short line
    "version-a-long-list": (("version",), list(range(100_000)),
                            ("manifest.json: fixture format version [0, 1, 2, 3, 4, 5, ...]; this stepper reads "
                             "version 1")),
    "run-kind-long": (("run", "kind"), LONG, ("manifest.json: 'run.kind' must be one of model, layer, got "
                                              "'\\x1bkkkkkkkkkkkkkkkkkkkkkkk...kkkkkkkkkkkkkkkkkkkkkkkkkkkk'")),
    "tolerance-kind-a-long-list": (("tensors", 0, "tolerance", "kind"), list(range(100_000)),
                                   ("manifest.json: tensors[0] tolerance: 'kind' must be one of allclose, exact, "
                                    "same-experts, same-entries, got [0, 1, 2, 3, 4, 5, ...]")),
    "atol-past-any-float": (("tensors", 0, "tolerance", "atol"), 10**400,  # it made an OverflowError's traceback
                            ("manifest.json: tensors[0] tolerance: 'atol' must be a finite number >= 0, got "
                             "100000000000000000...0000000000000000000")),
    "shape-a-long-list": (("tensors", 0, "shape"), list(range(100_000)),
                          ("tensors.safetensors: tensor 'prefill.embed' has shape [1, 7, 320], the manifest says "
                           "[0, 1, 2, 3, 4, 5, ...]")),
    "name-long": (("tensors", 0, "name"), "a" * 100_000,
                  f"tensors.safetensors: tensor '{'a' * 60}...' of the manifest is missing"),
}


@pytest.mark.parametrize("case", BOUNDED_CASES)
def test_a_long_value_is_shown_cut_in_its_one_line(tmp_path, case):
    path, value, says = BOUNDED_CASES[case]
    folder = fixture_with(tmp_path / "f", changed(path, value))
    out = verify(folder)
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr[:2000]
    assert out.stderr.strip() == f"stepper: error: {folder}/{says}"


def test_a_tensor_listed_twice_is_refused_not_compared_twice(tmp_path):
    """It was compared and counted twice ("624 fixture tensors, 624 match"), and a manifest of the
    same entries many times over took minutes."""
    manifest = changed(("tensors",), SOUND["tensors"] + SOUND["tensors"][:1])
    folder = fixture_with(tmp_path / "f", manifest)
    out = verify(folder)
    assert out.returncode == 2 and out.stderr == (
        f"stepper: error: {folder}/manifest.json: tensors[{len(SOUND['tensors'])}] 'name' 'prefill.embed' is "
        "tensors[0]'s too; each tensor is listed once\n")


# -- fuzzing ------------------------------------------------------------------------------------

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                      st.text(max_size=12), st.sampled_from([0, -1, 1, 2**63, 1e308, "", "\x1b[2J", "model", "exact"]))
json_value = st.recursive(
    json_leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)


PATHS = [p for p in paths_of(SOUND) if p[0] != "config" or len(p) == 1]  # config fields: the config reader's fuzzing


@SETTINGS
@given(changes=st.lists(st.tuples(st.sampled_from(PATHS), json_value | st.just(KeyError)), min_size=1, max_size=3))
def test_fuzzed_manifests_end_in_a_verdict_or_one_line(tmp_path_factory, changes):
    folder = fixture_with(tmp_path_factory.mktemp("fuzz"), changed_at(SOUND, changes))
    ends_well(verify(folder))



@SETTINGS
@given(mapping=(json_value | st.dictionaries(st.text(max_size=30), st.text(max_size=30) | json_leaf, max_size=4)).map(
    lambda v: json.dumps(v).encode()) | st.sampled_from([b"[" * 5000, b"{", b"\x00", b'{"a": "b", "a": "c"}', b"NaN",
                                                         b'{"a": "\\ud800"}', b"\xff\xfe", b'{"a": 1e999}']))
def test_fuzzed_map_files_end_in_a_verdict_or_one_line(tmp_path_factory, mapping):
    folder = tmp_path_factory.mktemp("map")
    (folder / "map.json").write_bytes(mapping)
    ends_well(verify(FIXTURE, "--map", str(folder / "map.json")))
