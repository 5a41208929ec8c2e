"""Golden fixtures: the shipped ones re-export to the same tensors, `verify` finds the first tensor a
port gets wrong, rejects bad candidates with one line (exit 2), and transformers' DeepseekV3, fed
each shipped tiny fixture's weights and inputs, passes `verify`."""

import json
import os
import shlex
from pathlib import Path

import numpy as np
import pytest
from helpers.cli import stepper
from safetensors.numpy import save_file

from stepper import families
from stepper.fixtures import sealed, verify
from stepper.fixtures.export import Capture, export
from stepper.fixtures.fixture import Fixture, check_weights, load, read_manifest
from stepper.fixtures.format import TENSORS
from stepper.fixtures.hashing import sha256_array, sha256_file
from stepper.fixtures.read_hashes import ReadHashes
from stepper.fixtures.show import summary_line
from stepper.fixtures.spec import ExportSpec
from stepper.fixtures.tensor_check import measure
from stepper.presets import preset
from stepper.seams.trace import unphased
from stepper.session import RunSpec, run
from stepper.weights.checkpoint import SCALE, Checkpoint
from stepper.weights.safetensors_reader import SafetensorsFile
from stepper.weights.seeded import SyntheticWeights

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p.parent.name for p in (ROOT / "fixtures").glob("*/manifest.json"))
TINY = [name for name in SHIPPED if read_manifest(ROOT / "fixtures" / name)["weights"]["copied"]]
FULL_SIZE = [name for name in SHIPPED if name not in TINY]
BASIC = ROOT / "fixtures" / "tiny-prefill-decode"


@pytest.fixture(scope="module")
def basic() -> Fixture:
    return load(BASIC)


def write_candidate(path: Path, tensors: dict[str, np.ndarray]) -> Path:
    if path.suffix == ".npz":
        np.savez(path, **tensors)
    else:
        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path))
    return path


def test_the_expected_fixtures_are_shipped_and_small():
    assert set(SHIPPED) == {"tiny-prefill-decode", "tiny-yarn-4094", "tiny-absorb", "tiny-v3-grouped", "tiny-bf16",
                            "kimi-k2-layer1-decode", "tiny-v2-lite", "tiny-v32-indexer", "tiny-minicpm3",
                            "tiny-glm5-shared", "tiny-kimi-linear-kda", "tiny-kimi-linear-mla", "tiny-v4-windows"}
    total = sum(p.stat().st_size for p in (ROOT / "fixtures").rglob("*") if p.is_file())
    # 29 MiB, then 3 for two MLA families of issue 33, 4.3 for Kimi Linear's layers, 4.4 for DeepSeek-V4's windows
    assert total < 42 * 2**20, total
    readme = (ROOT / "fixtures" / "README.md").read_text()
    assert all(name in readme for name in SHIPPED)


# ---------------------------------------------------------------------------------------------
# The committed files are what their manifests say, and what stepper makes today


@pytest.mark.parametrize("name", SHIPPED)
def test_manifest_hashes_hold_for_the_committed_files(name):
    fixture = load(ROOT / "fixtures" / name)  # checks every tensor's sha256
    m = fixture.manifest
    assert m["format"] == "stepper-fixture" and m["version"] == 1
    assert sha256_file(fixture.path / TENSORS) == m["files"][TENSORS]["sha256"]
    assert check_weights(fixture) == []
    assert [e["name"] for e in m["tensors"]] == list(fixture.tensors)
    with SafetensorsFile(fixture.path / TENSORS) as f:
        assert json.loads(f.metadata["order"]) == list(fixture.tensors)
    for margin in m["routing"].values():  # no routing decision close to a tie
        assert all(v is None or v > 1e-3 for v in margin.values()), margin  # as fixtures/README.md says
    # sealed as stepper wrote it: regenerate.sh's --force replaces only an unchanged folder (a hand edit of
    # its named shapes once stopped it at tiny-v4-windows)
    assert sealed.FIELD in m and not sealed.changed(fixture.path / "manifest.json", m)


@pytest.mark.parametrize("name", TINY + (FULL_SIZE if os.environ.get("STEPPER_FULL_FIXTURES") else []))
def test_reexport_matches_the_committed_fixture(name, tmp_path):
    committed = load(ROOT / "fixtures" / name)
    spec = ExportSpec.from_dict(committed.manifest["export"])
    fresh = export(spec, tmp_path / name)
    assert [(e["name"], e["shape"], e["dims"], e["dtype"]) for e in fresh["tensors"]] == [
        (e["name"], e["shape"], e["dims"], e["dtype"]) for e in committed.entries]
    for key in ("config", "inputs", "attention", "run", "dtype_policy"):
        assert fresh[key] == committed.manifest[key], key
    if committed.manifest["weights"]["copied"]:  # the same weight files, byte for byte
        assert fresh["weights"]["files"] == committed.manifest["weights"]["files"]
    else:
        assert fresh["weights"]["read"] == committed.manifest["weights"]["read"]
    # every tensor bit-identical or within the manifest's tolerance
    verdict = verify.verify(committed, tmp_path / name / TENSORS, strict=True)
    assert verdict.exit_code == 0 and verdict.count("match") == len(committed.entries), summary_line(verdict)
    identical = sum(e["sha256"] == f["sha256"] for e, f in zip(committed.entries, fresh["tensors"]))
    print(f"{name}: {identical} of {len(committed.entries)} tensors bit-identical, the rest within tolerance")


@pytest.mark.parametrize("name", FULL_SIZE)
def test_full_size_fixture_first_position_reexports(name):
    """Re-exporting Kimi K2's layer 1 takes about a minute (set STEPPER_FULL_FIXTURES=1 for the whole
    re-export). This runs the prefill of the first prompt token only (about 15 s): causal attention
    makes every position-0 slice of the prefill tensors the same computation."""
    committed = load(ROOT / "fixtures" / name)
    m = committed.manifest
    spec = ExportSpec.from_dict(m["export"])
    first = m["inputs"]["prompt_ids"][:1]
    capture = Capture()
    run(RunSpec(model=spec.model, layer=spec.layer, ids=tuple(first), seed=spec.seed, attn=spec.attn), [capture])
    compared = 0
    for event in capture.events:
        entry = next(e for e in committed.entries if e["name"] == f"prefill.{event.name}")
        index = tuple(slice(0, 1) if d in ("T", "S", "N") else slice(None) for d in entry["dims"])
        ref = committed.tensors[entry["name"]][index]
        tol = entry["tolerance"]
        if tol["kind"] == "allclose":
            assert measure(event.array, ref, tol)["ok"], event.name
        else:
            assert np.array_equal(np.sort(event.array, -1), np.sort(ref, -1)), event.name
        compared += 1
    assert compared == len([e for e in committed.entries if e["phase"] == "prefill"])
    # weights named by seed: a few re-created tensors hash as recorded
    source = SyntheticWeights(preset(m["weights"]["preset"]), m["weights"]["seed"])
    for weight in ("model.layers.1.input_layernorm.weight", "model.layers.1.self_attn.kv_a_proj_with_mqa.weight",
                   "model.layers.1.mlp.gate.e_score_correction_bias"):
        stored, record = source.stored(weight), m["weights"]["read"][weight]
        assert sha256_array(stored.data) == record["sha256"]
        if stored.scale_inv is not None:
            assert sha256_array(stored.scale_inv) == record["scale_inv_sha256"]


def test_read_hashes_are_the_bytes_a_synthesized_checkpoint_holds():
    source = ReadHashes(SyntheticWeights(preset("tiny"), 0))
    names = ["model.layers.1.self_attn.kv_b_proj.weight", "model.layers.1.mlp.gate.weight",
             "model.layers.1.mlp.gate.e_score_correction_bias"]
    for name in names:
        source.get(name)
    shards = Checkpoint(ROOT / "fixtures" / "weights" / "tiny-seed0")
    for name in names:
        data = shards.shard_of(name).get(name)
        assert sha256_array(data) == source.read[name]["sha256"]
    scale = shards.shard_of(names[0] + SCALE).get(names[0] + SCALE)
    assert sha256_array(scale) == source.read[names[0]]["scale_inv_sha256"]


def test_dtype_policy_names_the_run_s_integer_tensors_and_its_weights_own_formats():
    v4, mla, bf16 = (read_manifest(ROOT / "fixtures" / name) for name in ("tiny-v4-windows", "tiny-v3-grouped",
                                                                          "tiny-bf16"))
    integer = list(dict.fromkeys(e["key"] for e in v4["tensors"] if e["dtype"] == "int64"))
    assert {"ffn.gate.topk_idx", "ffn.gate.hash_idx", "attn.indexer.chosen", "attn.chosen"} <= set(integer)
    assert v4["dtype_policy"]["tensors"] == "float32; int64 for " + ", ".join(integer)
    assert v4["dtype_policy"]["weights"] == (
        "each weight widened to float32 before use: FP8 e4m3 as code x the E8M0 scale of its 128x128 block, "
        "FP4 e2m1 routed experts as code x the E8M0 scale of its 32 inputs, BF16 exactly")
    assert mla["dtype_policy"] == {**v4["dtype_policy"], "tensors": "float32; int64 for mlp.gate.topk_idx",
                                   "weights": "each weight widened to float32 before use: FP8 as code x scale_inv "
                                              "of its 128x128 block, BF16 exactly"}
    assert bf16["dtype_policy"]["weights"] == "each weight widened to float32 before use: BF16 exactly"
    assert bf16["dtype_policy"]["tensors"] == "float32"  # layer 0 is dense: no router, no integer tensor


def test_bf16_fixture_records_and_uses_bf16_weights():
    fixture = load(ROOT / "fixtures" / "tiny-bf16")
    assert fixture.manifest["weights"]["storage"].startswith("bf16")
    assert "quantization_config" not in fixture.manifest["config"]
    ck = Checkpoint(fixture.weights_path(), families.load_config)
    dtypes = {ck.shard_of(n).info(n).dtype for n in ck.weight_map}
    assert dtypes == {"BF16"} and not any(n.endswith(SCALE) for n in ck.weight_map)
    # BF16 holds the dequantized FP8 weight rounded once: within BF16's half-ulp of it
    fp8 = SyntheticWeights(preset("tiny"), 0).get("model.layers.0.self_attn.q_b_proj.weight")
    bf16 = ck.get("model.layers.0.self_attn.q_b_proj.weight")
    assert np.all(np.abs(bf16 - fp8) <= np.abs(fp8) * 2.0**-8)


# ---------------------------------------------------------------------------------------------
# verify: injected errors, missing tensors, bad candidates


@pytest.mark.parametrize("target", ["decode0.layers.1.self_attn.k_pe_rope", "prefill.layers.0.mlp.act",
                                    "decode1.layers.2.mlp.gate.scores"])
def test_verify_names_an_injected_error_as_the_first_divergence(basic, tmp_path, target):
    tensors = dict(basic.tensors)
    bad = tensors[target].copy()
    bad.flat[3] += 1e-3 * np.abs(bad).max()  # one entry, 100x the tolerance
    tensors[target] = bad
    candidate = write_candidate(tmp_path / "port.safetensors", tensors)
    out = stepper("fixtures", "verify", BASIC, candidate, "--report", tmp_path / "report.json", "--plain")
    assert out.returncode == 1, out.stderr
    assert f"first divergence: {target}: 1 of {bad.size} entries outside tolerance" in out.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["first_divergence"]["name"] == target and report["result"] == "mismatch"
    mismatched = [t["name"] for t in report["tensors"] if t["status"] == "mismatch"]
    assert mismatched == [target]  # later tensors come from the fixture, so they still match
    assert all(i["status"] == "match" for i in report["first_divergence"]["inputs"])
    assert "its inputs match, so the difference starts in this step" in out.stdout


def test_first_divergence_names_what_the_tensor_is_computed_from(basic):
    index = next(i for i, e in enumerate(basic.entries) if e["name"] == "decode0.layers.1.self_attn.attn_scores")
    inputs = [basic.entries[j]["name"] for j in verify.formula_inputs(basic, index)]
    assert inputs == ["decode0.layers.1.self_attn.query_states", "decode0.layers.1.self_attn.key_states"]
    index = next(i for i, e in enumerate(basic.entries) if e["name"] == "prefill.layers.2.hidden_states")
    assert [basic.entries[j]["name"] for j in verify.formula_inputs(basic, index)] == ["prefill.layers.1.output"]


def test_a_first_divergence_whose_formula_names_no_tensor_is_not_said_to_start_there_when_its_layer_misses_some(
        tmp_path):
    """KDA's delta is computed from beta, v, k and the state, which its formula writes beta_t, v_t, k_t,
    S: no fixture tensor is named, so the tensor before it (state_per_chunk) stood for its inputs, and
    with beta missing the verdict put the difference in delta's own step."""
    kda = load(ROOT / "fixtures" / "tiny-kimi-linear-kda")
    tensors = {k: v for k, v in kda.tensors.items() if k != "prefill.layers.0.self_attn.beta"}
    tensors["prefill.layers.0.self_attn.delta"] = tensors["prefill.layers.0.self_attn.delta"] * 1.05  # as a wrong beta
    out = stepper("fixtures", "verify", kda.path, write_candidate(tmp_path / "c.npz", tensors), "--allow-missing",
                  "--plain", "--problems")
    assert out.returncode == 1 and "first divergence: prefill.layers.0.self_attn.delta:" in out.stdout, out.stderr
    assert "so the difference starts in this step" not in out.stdout
    assert "prefill.layers.0.self_attn.beta is not in the candidate" in out.stdout
    tensors["prefill.layers.0.self_attn.beta"] = kda.tensors["prefill.layers.0.self_attn.beta"]
    out = stepper("fixtures", "verify", kda.path, write_candidate(tmp_path / "c.npz", tensors), "--plain", "--problems")
    assert "its inputs match, so the difference starts in this step" in out.stdout  # every earlier tensor is there


def test_a_candidate_missing_half_the_tensors_is_reported_tensor_by_tensor(basic, tmp_path):
    kept = dict(list(basic.tensors.items())[::2])
    candidate = write_candidate(tmp_path / "half.npz", kept)
    out = stepper("fixtures", "verify", BASIC, candidate, "--allow-missing", "--plain", "--report", tmp_path / "r.json")
    assert out.returncode == 0, out.stdout + out.stderr
    missing = [n for n in basic.tensors if n not in kept]
    rows = {line.split()[1]: line.split()[2] for line in out.stdout.splitlines()[2:] if line.strip()[:1].isdigit()}
    assert all(rows[n] == "missing" for n in missing) and all(rows[n] == "match" for n in kept)
    assert f"{len(kept)} match, 0 differ, {len(missing)} missing" in out.stdout
    strict = stepper("fixtures", "verify", BASIC, candidate, "--problems", "--plain")
    assert strict.returncode == 1 and "missing tensors fail: --allow-missing accepts them" in strict.stdout
    assert strict.stderr == (f"stepper: {len(missing)} of the fixture's {len(basic.tensors)} tensors are missing "
                             f"from {candidate}; pass --allow-missing to accept that\n")
    assert all(n in strict.stdout for n in missing) and next(iter(kept)) not in strict.stdout


@pytest.mark.parametrize("kind", ["truncated", "garbage", "header-lies"])
def test_a_malformed_safetensors_candidate_exits_2_with_one_line(basic, tmp_path, kind):
    good = write_candidate(tmp_path / "good.safetensors", basic.tensors).read_bytes()
    content = {"truncated": good[: len(good) // 2], "garbage": b"not a safetensors file at all",
               "header-lies": (10**9).to_bytes(8, "little") + good[8:]}[kind]
    path = tmp_path / "port.safetensors"
    path.write_bytes(content)
    out = stepper("fixtures", "verify", BASIC, path)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("stepper: error: ") and str(path) in out.stderr


@pytest.mark.parametrize("kind, says", [
    ("truncated", "not a readable .npz file"), ("pickled", "tensor 'a' has dtype object; expected integers or floats"),
    ("not-zip", "not an .npz file (an .npz is a zip archive of .npy arrays; this one begins b'\\x00\\x00\\x00\\x00')"),
    ("text", "not an .npz file (an .npz is a zip archive of .npy arrays; this one begins b'laye')"),
    ("zero bytes", "not an .npz file (an .npz is a zip archive of .npy arrays; this one is empty)"),
    ("npy", "a single array (.npy), not an .npz archive of named tensors"),
    ("no arrays", "holds no tensor; expected the tensors of a run"),
    ("encrypted", ("tensor 'prefill.embed' is encrypted or stored as patched data (zip flags 0x1); expected an "
                   "archive as np.savez writes it, with no password")),
    ("patched", "tensor 'prefill.embed' is encrypted or stored as patched data (zip flags 0x20)"),
    ("compressed by AES", "tensor 'prefill.embed' is compressed by zip method 99; expected stored or deflated")])
def test_a_malformed_npz_candidate_exits_2_with_one_line(basic, tmp_path, kind, says):
    """A text file named .npz is not told about NumPy's pickles, nor an empty one about its 0 names; a
    member encrypted, patched or compressed in a way Python's zipfile does not read was a traceback."""
    path = tmp_path / "port.npz"
    if kind == "pickled":
        np.savez(path, a=np.array([{"x": 1}], dtype=object))
    else:
        np.savez(path, **{k: v for k, v in list(basic.tensors.items())[:5]})
        if kind == "truncated":
            path.write_bytes(path.read_bytes()[:-100])
        elif kind == "not-zip":
            path.write_bytes(b"\x00" * 64)
        elif kind == "text":
            path.write_text("layers.0.self_attn.q_a 0.1 0.2\n")
        elif kind == "zero bytes":
            path.write_bytes(b"")
        elif kind == "no arrays":
            np.savez(path)
        elif kind in ("encrypted", "patched", "compressed by AES"):  # the first member's flags or method
            data = bytearray(path.read_bytes())
            central = data.find(b"PK\x01\x02")
            flag = {"encrypted": 0x1, "patched": 0x20}.get(kind)
            for at in (6, central + 8) if flag else (8, central + 10):
                data[at] = data[at] | flag if flag else 99
            path.write_bytes(bytes(data))
        else:
            np.save(tmp_path / "x.npy", np.zeros(3))
            path.write_bytes((tmp_path / "x.npy").read_bytes())
    out = stepper("fixtures", "verify", BASIC, path)
    assert out.returncode == 2, out.stdout
    assert out.stderr.count("\n") == 1 and out.stderr.startswith(f"stepper: error: {path}: {says}"), out.stderr
    assert "pickle" not in out.stderr or kind == "pickled"


def test_one_unknown_extra_tensor_leaves_a_dump_read_by_stepper_names(basic, tmp_path):
    """An extra tensor no naming knows says nothing of the candidate's naming: the dump is read as
    stepper's own, with no note about other namings that spell a canonical name alike."""
    tensors = {**basic.tensors, "my_debug_probe": np.zeros(3, np.float32)}
    out = stepper("fixtures", "verify", BASIC, write_candidate(tmp_path / "c.safetensors", tensors), "--plain")
    assert out.returncode == 0, out.stdout + out.stderr
    n = len(basic.tensors)
    assert out.stdout.splitlines()[-2:] == [f"match: {n} fixture tensors, {n} match, 0 differ, 0 missing",
                                            "1 candidate names not recognised: my_debug_probe"]


def test_a_candidate_name_of_100_000_characters_is_shown_cut(basic, tmp_path):
    """The notes under the verdict and a refusal show a name's first 60 characters: they printed a
    line of 100,000."""
    long = "x" * 100_000
    extra = write_candidate(tmp_path / "c.safetensors", {**basic.tensors, long: np.zeros(3, np.float32)})
    out = stepper("fixtures", "verify", BASIC, extra, "--plain")
    assert out.returncode == 0 and max(map(len, out.stdout.splitlines())) < 200, out.stderr
    assert out.stdout.splitlines()[-1] == f"1 candidate names not recognised: {'x' * 60}..."
    alone = write_candidate(tmp_path / "alone.safetensors", {long: np.zeros(3, np.float32)})
    out = stepper("fixtures", "verify", BASIC, alone, "--plain")
    assert out.returncode == 2 and out.stderr.startswith(
        f"stepper: error: {alone}: none of its 1 tensor names is a name of fixture tiny-prefill-decode "
        f"(e.g. '{'x' * 60}...'); expected canonical names") and len(out.stderr) < 1000
    npz = write_candidate(tmp_path / "c.npz", {"\x1b[2J" + long[:60_000]: np.zeros(3, np.complex64)})  # (zip: < 64 KiB)
    out = stepper("fixtures", "verify", BASIC, npz, "--plain")
    assert out.returncode == 2 and out.stderr == (f"stepper: error: {npz}: tensor '\\x1b[2J{'x' * 56}...' has dtype "
                                                  "complex64; expected integers or floats (float32, float16, "
                                                  "bfloat16)\n")


def test_an_npz_member_whose_header_asks_for_terabytes_is_named(basic, tmp_path):
    """NumPy allocates an .npz array whole before reading it: a header of a few bytes asking for
    128 TiB was "out of memory" with no file or tensor named. The header is now measured against the
    bytes its member holds, before anything is allocated."""
    import io
    import zipfile

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (2**45,)})
    path = tmp_path / "c.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("prefill.embed.npy", header.getvalue() + bytes(16))
    out = stepper("fixtures", "verify", BASIC, path)
    assert out.returncode == 2 and out.stderr == (f"stepper: error: {path}: tensor 'prefill.embed' has shape "
                                                  "[35184372088832] of float32, 140,737,488,355,328 bytes, but its "
                                                  "member holds 16\n"), out.stderr


def test_an_npz_member_claiming_more_bytes_than_it_stores_is_held_to_what_it_stores(basic, tmp_path):
    """The archive's own size of a member (here a zip64 field claiming 128 TiB) is believed only as far as
    the bytes it stores can give: 16 bytes deflated could not make the 128 TiB its .npy header asks for,
    which NumPy would have tried to allocate ("out of memory", naming no file)."""
    import io
    import zipfile

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (2**45,)})
    path = tmp_path / "c.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("prefill.embed.npy", header.getvalue() + bytes(16))
        z.infolist()[0].file_size = 2**47 + 256  # written into the central directory as it closes
    stored = zipfile.ZipFile(path).infolist()[0]
    assert stored.file_size == 2**47 + 256 and stored.compress_size < 100
    out = stepper("fixtures", "verify", BASIC, path)
    assert out.returncode == 2 and out.stderr.startswith(
        f"stepper: error: {path}: tensor 'prefill.embed' has shape [35184372088832] of float32, 140,737,488,355,328 "
        "bytes, but its member holds "), out.stderr
    assert int(out.stderr.rsplit(" ", 1)[1].replace(",", "")) < 1032 * stored.compress_size


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_a_candidate_tensor_is_read_when_it_is_compared_and_an_extra_one_never(basic, tmp_path, monkeypatch, suffix):
    """verify held every tensor of a candidate at once (an .npz decompressed whole, BF16 widened), so
    a dump of gigabytes needed that much memory. Now each tensor is read when it is compared: the
    candidate's extra tensors are never read, and a compared one at most twice (a router's choices
    once more, to pair its weights)."""
    from collections import Counter

    from stepper.fixtures import candidate

    extra = {f"extra{i}": np.zeros((64, 64), np.float32) for i in range(8)}
    path = write_candidate(tmp_path / f"c{suffix}", {**basic.tensors, **extra})
    read, low = Counter(), Counter()  # names looked up; the arrays read out of the file
    looked_up, source = candidate.Candidate.__getitem__, (np.lib.format if suffix == ".npz" else SafetensorsFile)
    reader = "read_array" if suffix == ".npz" else "get"
    original = getattr(source, reader)
    monkeypatch.setattr(candidate.Candidate, "__getitem__",
                        lambda self, name: read.update([name]) or looked_up(self, name))
    monkeypatch.setattr(source, reader, lambda *a, **k: low.update(["read"]) or original(*a, **k))
    verdict = verify.verify(basic, path)
    assert verdict.exit_code == 0 and verdict.count("match") == len(basic.entries) == len(basic.tensors)
    assert set(read) == set(basic.tensors) and max(read.values()) <= 2
    assert low["read"] == sum(read.values()) < 1.2 * len(basic.tensors)


def test_a_fixture_s_tensors_are_views_of_its_file_not_copies(basic):
    """A fixture's tensors were copied out of its file: a fixture of gigabytes held them all. Now each is
    a read-only view of the file's memory map, whose pages the system can drop and read again."""
    arrays = list(basic.tensors.values())
    assert arrays and not any(a.flags.owndata or a.flags.writeable for a in arrays)


class CountedName(str):
    """A candidate's name that counts the comparisons made with it (a lookup in a list compares a
    name with each element before it; one in a dict or set hashes it and compares almost none)."""

    compared = 0
    __hash__ = str.__hash__

    def __eq__(self, other):
        CountedName.compared += 1
        return str.__eq__(self, other)


def test_a_candidate_of_many_extra_names_is_verified_in_work_linear_in_its_names(basic, tmp_path, monkeypatch):
    """Each name was looked up in a list of the others and the catalogue rebuilt per name: 60,000
    extra names took a minute, 200,000 more than two. The names' comparisons are counted: a
    lookup in a list of the names, per name, makes about n^2 / 2 of them (4.5 million here)."""
    from stepper.fixtures import candidate as candidates

    extra = {f"probe{i}": np.zeros(1, np.float32) for i in range(3000)}
    path = write_candidate(tmp_path / "c.safetensors", {**basic.tensors, **extra})
    opened = candidates.OPENERS[".safetensors"]

    def counted(file):
        names, read, close = opened(file)
        return [CountedName(n) for n in names], read, close

    monkeypatch.setitem(candidates.OPENERS, ".safetensors", counted)
    CountedName.compared = 0
    out = stepper("fixtures", "verify", BASIC, path, "--plain")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1].startswith("3000 candidate names not recognised: probe0, probe1, ")
    assert 0 < CountedName.compared < 10 * (len(basic.tensors) + len(extra))


@pytest.mark.parametrize("args, message", [
    (["nowhere.safetensors"], "no such file"),
    (["{fixture}/manifest.json"], "unknown file type"),
    (["{candidate}", "--map", "nomap.json"], "--map nomap.json: no such file"),
    (["{candidate}", "--map", "{twice}"], ("'a' and 'b' both map to 'prefill.embed'; a fixture tensor is compared "
                                           "with one of yours, so map only one of them")),
    (["{candidate}", "--map", "{long}"], (f"'a' and '{'b' * 60}...' both map to 'prefill.embed'; a fixture tensor is "
                                          "compared with one of yours")),  # a line of 100,000 characters
    (["{candidate}", "--map", "{typo}"], ("--map: 'prefill.layers.0.self_attn.qa_typo' is no tensor name of fixture "
                                          "tiny-prefill-decode nor of stepper's catalogue")),
    (["{candidate}", "--rtol", "-1"], "--rtol must be a finite number >= 0, got -1.0"),
    (["{candidate}", "--atol", "inf"], "--atol must be a finite number >= 0, got inf"),  # it passed every tensor
    (["{candidate}", "--names", "vllm"], "--names must be one of transformers, inference, llama.cpp or canonical"),
])
def test_verify_bad_input_exits_2(basic, tmp_path, args, message):
    candidate = write_candidate(tmp_path / "c.safetensors", {"nothing.like.ours": np.zeros(2, np.float32)})
    twice = tmp_path / "twice.json"
    twice.write_text(json.dumps({"a": "prefill.embed", "b": "prefill.embed"}))
    long = tmp_path / "long.json"
    long.write_text(json.dumps({"a": "prefill.embed", "b" * 100_000: "prefill.embed"}))
    typo = tmp_path / "typo.json"  # one good target, one misspelt: exit 2 even with --allow-missing
    typo.write_text(json.dumps({"a": "prefill.embed", "nothing.like.ours": "prefill.layers.0.self_attn.qa_typo"}))
    args = [a.format(fixture=BASIC, candidate=candidate, twice=twice, long=long, typo=typo) for a in args]
    out = stepper("fixtures", "verify", BASIC, *args)
    assert out.returncode == 2 and message in out.stderr and out.stderr.count("\n") == 1, out.stderr


def test_a_candidate_with_no_known_name_is_bad_input(tmp_path):
    candidate = write_candidate(tmp_path / "c.safetensors", {"blk.0.attn_q": np.zeros(2, np.float32)})
    out = stepper("fixtures", "verify", BASIC, candidate)
    assert out.returncode == 2 and "none of its 1 tensor names" in out.stderr and "--map" in out.stderr


def test_names_without_their_step_prefix_are_named_as_such(basic, tmp_path):
    prefill = {k.removeprefix("prefill."): v for k, v in basic.tensors.items() if k.startswith("prefill.")}
    bare = write_candidate(tmp_path / "bare.safetensors", prefill)
    out = stepper("fixtures", "verify", BASIC, bare)
    example = next(iter(read_names(bare)))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == (f"stepper: error: {bare}: {len(prefill)} of its {len(prefill)} tensor names lack the step "
                          f"prefix that fixture tiny-prefill-decode's names have (prefill., decode0., decode1.): e.g. "
                          f"'{example}' is 'prefill.{example}' there; prefix each name with its step, or pass --map "
                          f"FILE.json\n")
    some = {**{k: v for k, v in basic.tensors.items() if k.startswith("prefill.")},
            "layers.2.output": basic.tensors["decode1.layers.2.output"]}  # one name without its step
    out = stepper("fixtures", "verify", BASIC, write_candidate(tmp_path / "some.safetensors", some), "--allow-missing",
                  "--plain")
    assert out.returncode == 0
    assert ("1 of its 105 tensor names lack the step prefix that fixture tiny-prefill-decode's names have (prefill., "
            "decode0., decode1.): e.g. 'layers.2.output' is 'prefill.layers.2.output' there; prefix each name with "
            "its step, or pass --map FILE.json") in out.stdout.splitlines()


def read_names(path: Path) -> list[str]:
    return list(SafetensorsFile(path).names())


def test_stepper_s_own_dump_is_read_by_stepper_s_names_alone(basic):
    out = stepper("fixtures", "verify", BASIC, BASIC / TENSORS, "--plain")
    assert out.returncode == 0 and out.stderr == ""
    lines = out.stdout.splitlines()
    assert lines[-1] == f"match: {len(basic.entries)} fixture tensors, {len(basic.entries)} match, 0 differ, 0 missing"
    for other in ("transformers", "inference", "llama.cpp", "result_norm", "modeling_deepseek"):
        assert other not in out.stdout, other
    rows = [line for line in lines if line[:5].strip().isdigit()]
    assert len(rows) == len(basic.entries) and all(row.split()[2] == "match" for row in rows)


def test_not_a_fixture_is_bad_input(tmp_path):
    out = stepper("fixtures", "verify", tmp_path, tmp_path / "x.safetensors")
    assert out.returncode == 2 and "no manifest.json" in out.stderr


# ---------------------------------------------------------------------------------------------
# verify: names and layouts of other implementations


def test_ambiguous_bare_names_are_refused_and_a_map_resolves_them(basic, tmp_path):
    q = basic.tensors["prefill.layers.1.self_attn.q_a"]
    candidate = write_candidate(tmp_path / "c.safetensors", {"prefill.q-1": q, "prefill.layers.1.self_attn.q_a_norm":
                                                              basic.tensors["prefill.layers.1.self_attn.q_a_norm"]})
    verdict = verify.verify(basic, candidate)
    assert "prefill.q-1" in verdict.ambiguous and verdict.count("match") == 1
    (tmp_path / "map.json").write_text(json.dumps({"prefill.q-1": "prefill.layers.1.self_attn.q_a"}))
    out = stepper("fixtures", "verify", BASIC, candidate, "--map", tmp_path / "map.json", "--allow-missing", "--plain")
    assert out.returncode == 0 and "2 match" in out.stdout


def test_verify_accepts_batch_axes_heads_layouts_and_interleaved_rope(basic, tmp_path):
    t = dict(basic.tensors)
    cfg = basic.config
    h, r = cfg.num_attention_heads, cfg.qk_rope_head_dim
    changed = {}
    for name, a in t.items():
        key = name.split("layers.")[-1].split(".", 1)[-1] if "layers." in name else name.split(".", 1)[-1]
        if key in ("self_attn.q_pe_rope", "self_attn.k_pe_rope"):
            inter = np.empty_like(a)
            inter[..., 0::2], inter[..., 1::2] = a[..., : r // 2], a[..., r // 2:]  # pairs side by side
            changed[name] = inter
        elif key == "self_attn.query_states":
            inter = a.copy()
            inter[..., -r::2], inter[..., -r + 1::2] = a[..., -r:-r // 2], a[..., -r // 2:]
            changed[name] = inter
        elif key == "self_attn.q":
            b, _, n, x = a.shape
            changed[name] = a.transpose(0, 2, 1, 3).reshape(b, n, h * x)  # the q_b_proj output
        elif key == "self_attn.kv":
            changed[name] = a.transpose(0, 2, 1, 3)  # [B, T, H, X], as inference/model.py keeps it
        elif a.ndim == 3 and a.shape[0] == 1:
            changed[name] = a[0]  # no batch axis
    t.update(changed)
    candidate = write_candidate(tmp_path / "layouts.safetensors", t)
    verdict = verify.verify(basic, candidate, strict=True)
    assert verdict.exit_code == 0, summary_line(verdict)
    layouts = {c.name: c.layout for c in verdict.checks}
    assert layouts["prefill.layers.1.self_attn.q_pe_rope"] == "as reference, rope pairs interleaved"
    assert layouts["prefill.layers.1.self_attn.query_states"] == "as reference, rope pairs interleaved"
    assert layouts["prefill.layers.1.self_attn.q"].startswith("heads merged")
    assert layouts["prefill.layers.1.self_attn.kv"].startswith("positions before heads")
    assert layouts["prefill.layers.1.output"] == "reshaped [7, 320]"
    # interleaving is a layout, not a free pass: a wrong rotation still fails
    t["prefill.layers.1.self_attn.q_pe_rope"] = basic.tensors["prefill.layers.1.self_attn.q_pe"]
    verdict = verify.verify(basic, write_candidate(tmp_path / "wrong.safetensors", t))
    assert verdict.first["name"] == "prefill.layers.1.self_attn.q_pe_rope"


def test_expert_order_is_free_but_the_set_is_not(basic, tmp_path):
    t = dict(basic.tensors)
    name = "decode0.layers.2.mlp.gate.topk_idx"
    t[name] = t[name][:, ::-1].copy()
    t[name.replace("idx", "weight")] = t[name.replace("idx", "weight")][:, ::-1].copy()
    assert verify.verify(basic, write_candidate(tmp_path / "a.safetensors", t)).exit_code == 0
    other = t[name].copy()
    other[0, 0] = next(e for e in range(32) if e not in other[0])
    t[name] = other
    verdict = verify.verify(basic, write_candidate(tmp_path / "b.safetensors", t))
    assert verdict.first["name"] == name and "different experts for 1 of 1 tokens" in verdict.first["detail"]


def test_masked_scores_may_be_large_negative_numbers(basic, tmp_path):
    t = dict(basic.tensors)
    name = "prefill.layers.0.self_attn.attn_scores"
    t[name] = np.where(np.isinf(t[name]), np.finfo(np.float32).min, t[name])  # transformers' additive mask
    assert verify.verify(basic, write_candidate(tmp_path / "a.safetensors", t)).exit_code == 0
    t[name] = np.where(np.isinf(basic.tensors[name]), 0.0, basic.tensors[name])  # mask forgotten
    verdict = verify.verify(basic, write_candidate(tmp_path / "b.safetensors", t))
    assert verdict.first["name"] == name and "masked" in verdict.first["detail"]


def test_names_command_lists_the_aliases():
    out = stepper("fixtures", "names", "--system", "llama.cpp", "--json")
    assert out.returncode == 0
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert {"naming": "llama.cpp", "name": "kv_cmpr-{i}#1", "canonical": "self_attn.compressed_kv", "only": "",
            "source": "src/models/deepseek2.cpp:93", "revision": "07bede6a8f329362c72d46a0bc9756b6a12c22eb",
            "models": "deepseek_v3, kimi_k2", "note": ""} in rows
    assert {row["naming"] for row in rows} == {"llama.cpp"}
    assert [row["name"] for row in rows].index("q-{i}#1") < [row["name"] for row in rows].index("q-{i}#3")
    refused = stepper("fixtures", "names", "--names", "vllm")
    assert refused.returncode == 2 and refused.stderr == \
        "stepper: error: --names must be one of transformers, inference, llama.cpp, got 'vllm'\n"
    # verify's option name, and the same option by its first name
    assert stepper("fixtures", "names", "--names", "llama.cpp", "--json").stdout == out.stdout


def test_names_of_one_model_are_the_tables_its_fixtures_are_read_through():
    """Every table, at 80 columns, is 5,226 lines: --model keeps those a fixture of that model is
    read through (GLM-4.7-Flash's own transformers table, with its file's lines)."""
    rows = [json.loads(line) for line in stepper("fixtures", "names", "--model", "tiny-glm4-flash", "--json").stdout
            .splitlines()]
    assert {(row["naming"], row["models"]) for row in rows} == {("transformers", "glm4_moe_lite")}
    assert {"name": "model.layers.{i}.self_attn.kv_a_layernorm", "canonical": "self_attn.compressed_kv_norm",
            "source": "models/glm4_moe_lite/modeling_glm4_moe_lite.py:320"}.items() <= next(
        row for row in rows if row["name"] == "model.layers.{i}.self_attn.kv_a_layernorm").items()
    v3 = [json.loads(line) for line in stepper("fixtures", "names", "--model", "tiny", "--json").stdout.splitlines()]
    assert {row["naming"] for row in v3} == {"transformers", "inference", "llama.cpp"}
    assert all("kimi_k2" in row["models"].split(", ") for row in v3)
    longcat = [json.loads(line) for line in stepper("fixtures", "names", "--model", "tiny-longcat", "--json").stdout
               .splitlines()]
    assert {"name": "model.layers.{i}.self_attn.1.kv_a_layernorm", "canonical": "sub1.self_attn.compressed_kv_norm",
            "source": "models/longcat_flash/modeling_longcat_flash.py:403"}.items() <= next(
        row for row in longcat if row["name"] == "model.layers.{i}.self_attn.1.kv_a_layernorm").items()
    # the refusal names the command that takes a map (`fixtures names` has no --map: it said "--map gives ...")
    refused = stepper("fixtures", "names", "--model", "tiny-glm5", "--system", "llama.cpp")
    assert refused.returncode == 2 and refused.stderr == (
        "stepper: error: no llama.cpp table names the tensors of glm_moe_dsa models (stepper fixtures names "
        "lists each table's families; stepper fixtures verify --map FILE.json reads a dump under your own names)\n")


# ---------------------------------------------------------------------------------------------
# export: the command as a user meets it


def test_export_refuses_to_overwrite_and_reports_bad_input(tmp_path):
    out = tmp_path / "fx"
    first = stepper("fixtures", "export", out, "--ids", "1,2,3", "--layers", "0:1")
    assert first.returncode == 0, first.stderr
    assert "wrote" in first.stdout and (out / "weights" / "config.json").exists()
    m = json.loads((out / "manifest.json").read_text())
    assert m["run"]["layers_run"] == [0] and "model.norm.weight" not in json.dumps(m["weights"]["files"])
    again = stepper("fixtures", "export", out, "--ids", "1,2,3")
    assert again.returncode == 2 and "already exists; pass --force" in again.stderr
    assert stepper("fixtures", "export", out, "--ids", "1,2,3", "--force").returncode == 0
    for args, message in ((["--ids", "1,x"], "--ids expects"), (["--layer", "9"], "layer 9 out of range"),
                          (["--weights-dtype", "int4"], "--weights-dtype must be one of"),
                          (["--model", "kimi-k2", "--layer", "1", "--weights-dtype", "bf16"], "--weights-dtype bf16"),
                          (["--attn", "flash"], "--attn must be one of")):
        bad = stepper("fixtures", "export", tmp_path / "other", *args)
        assert bad.returncode == 2 and message in bad.stderr and bad.stderr.count("\n") == 1, (args, bad.stderr)
        assert not (tmp_path / "other").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no partial folders left


def test_a_checkpoint_fixture_s_paths_resolve_from_the_fixture_and_its_command_replays(tmp_path):
    """The checkpoint's path was recorded as typed (relative to the shell), and the command mixed the
    fixture's bare name with a --model relative to another folder: neither resolved."""
    assert stepper("synth", "--out", "ck", cwd=tmp_path).returncode == 0
    (tmp_path / "deep" / "a").mkdir(parents=True)
    assert stepper("fixtures", "export", "deep/a/fx", "--model", "ck", "--ids", "1,2", cwd=tmp_path).returncode == 0
    fixture = load(tmp_path / "deep" / "a" / "fx")
    assert fixture.manifest["weights"]["path"] == str(tmp_path / "ck")
    assert fixture.weights_path() == tmp_path / "ck"
    command = shlex.split(fixture.manifest["command"])
    assert command == ["stepper", "fixtures", "export", "fx", "--model", "../../ck", "--ids", "1,2"]
    assert fixture.manifest["export"]["model"] == "../../ck"
    again = stepper(*command[1:3], "fx2", *command[4:], cwd=tmp_path / "deep" / "a")  # from the folder holding it
    assert again.returncode == 0, again.stderr
    assert load(tmp_path / "deep" / "a" / "fx2").manifest["files"] == fixture.manifest["files"]


def test_shared_weights_folder_must_hold_the_same_weights(tmp_path):
    shared = tmp_path / "w"
    assert stepper("fixtures", "export", tmp_path / "a", "--ids", "1,2", "--weights-dir", shared).returncode == 0
    assert stepper("fixtures", "export", tmp_path / "b", "--ids", "3,4", "--weights-dir", shared).returncode == 0
    assert load(tmp_path / "b").weights_path().resolve() == shared.resolve()
    other = stepper("fixtures", "export", tmp_path / "c", "--ids", "3,4", "--seed", "1", "--weights-dir", shared)
    assert other.returncode == 2 and "holds other files than this run" in other.stderr


# ---------------------------------------------------------------------------------------------
# A real consumer: transformers' DeepseekV3 on each tiny fixture's weights and inputs

NEEDS_TORCH = not os.environ.get("STEPPER_REQUIRE_CROSSCHECK")


def transformers_dump(fixture: Fixture, path: Path) -> None:
    """Load the fixture's weights into transformers, run its inputs, and write every tensor under
    its canonical name, the projections in the layout their modules really output (verify's own
    arrangements place them). A lone layer N runs as a one-layer model whose layer 0 has layer N's
    weights. (tests/reference/test_naming.py reads transformers' own module names.)"""
    if NEEDS_TORCH:
        pytest.importorskip("torch")
        pytest.importorskip("transformers")
    from helpers.hf_families import hf_trace  # hf_reference's, with the MLA families of issue 33 registered

    m = fixture.manifest
    ck = Checkpoint(fixture.weights_path(), families.load_config)
    weights = {n: np.array(ck.get(n)) for n in ck.weight_map if not n.endswith(SCALE)}
    config = dict(m["config"])
    cfg = fixture.config
    layer = m["run"]["layers"][0] if m["run"]["kind"] == "layer" else None
    if layer is not None:
        config.update(num_hidden_layers=1, first_k_dense_replace=0 if cfg.is_moe_layer(layer) else 1)
        weights = {n.replace(f"model.layers.{layer}.", "model.layers.0."): w for n, w in weights.items()}
        weights.setdefault("model.norm.weight", np.ones(cfg.hidden_size, np.float32))
        weights.setdefault("lm_head.weight", np.zeros((cfg.vocab_size, cfg.hidden_size), np.float32))
    steps = m["inputs"]["steps"]
    trace = hf_trace(config, weights, np.array([steps[0]["ids"]]), start_pos=m["inputs"]["start_pos"],
                     decode_ids=[np.array([s["ids"]]) for s in steps[1:]] or None)
    out = {}
    for name, array in trace.items():
        short = unphased(name)
        phase = name[: len(name) - len(short)]
        index, key = (None, short) if not short.startswith("layers.") else short.split(".", 2)[1:]
        index = layer if layer is not None and index is not None else index
        if key in ("self_attn.q", "self_attn.kv"):  # q_b_proj / kv_b_proj output: [B, T, H * X]
            b, h, t, x = array.shape
            array = array.transpose(0, 2, 1, 3).reshape(b, t, h * x)
        elif key in ("rope_cos", "rope_sin"):
            array = array[None]  # rotary_emb returns [B, T, rope]
        elif key == "mlp.routed_output":
            array = array.reshape(-1, array.shape[-1])  # the experts module returns [N, d]
        out[phase + (f"layers.{index}.{key}" if index is not None else key)] = np.ascontiguousarray(array)
    save_file(out, str(path))


# transformers' DeepSeek models (tests/helpers/hf_reference.py); Kimi Linear's layers are checked against
# transformers' KimiLinearForCausalLM in tests/reference/test_kimi_linear_crosscheck.py
# and DeepSeek-V4's against its DeepseekV4ForCausalLM in tests/reference/test_fixture_v4.py
MLA_TINY = [name for name in TINY
            if read_manifest(ROOT / "fixtures" / name)["config"]["model_type"] not in ("kimi_linear", "deepseek_v4")]


@pytest.mark.parametrize("name", MLA_TINY)
def test_transformers_passes_verify_on_every_tiny_fixture(name, tmp_path):
    fixture = load(ROOT / "fixtures" / name)
    candidate = tmp_path / "transformers.safetensors"
    transformers_dump(fixture, candidate)
    out = stepper("fixtures", "verify", fixture.path, candidate, "--report", tmp_path / "report.json", "--plain",
                  "--allow-missing")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    checks = report["tensors"]
    absorbed_only = {"self_attn.q_nope_absorbed", "self_attn.attn_output_latent"}
    assert {t["key"] for t in checks if t["status"] == "missing"} <= absorbed_only  # transformers runs naive MLA
    assert report["counts"]["match"] >= len(checks) - sum(t["key"] in absorbed_only for t in checks)
    layouts = {t["layout"].split(" [")[0] for t in checks if t["layout"]}
    assert "heads merged" in layouts and "reshaped" in layouts  # q_b_proj and kv_b_proj outputs, rotary tables
    worst = max(t["rel_err"] or 0.0 for t in checks)
    print(f"{name}: transformers within {worst:.2e} of absmax on every tensor")


def test_readme_example_checks_transformers(tmp_path, monkeypatch):
    """The README's 'Checking a PyTorch port' block, run as written with transformers as the port."""
    if NEEDS_TORCH:
        pytest.importorskip("torch")
        pytest.importorskip("transformers")
    from helpers.hf_reference import build_hf_model
    from transformers.cache_utils import DynamicCache

    readme = (ROOT / "fixtures" / "README.md").read_text()
    code = readme.split("## Checking a PyTorch port", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]

    def load_port(weights_dir):
        ck = Checkpoint(weights_dir)
        model = build_hf_model(json.loads((Path(weights_dir) / "config.json").read_text()),
                               {n: np.array(ck.get(n)) for n in ck.weight_map if not n.endswith(SCALE)})
        cache = DynamicCache(config=model.config)
        return model, lambda ids, positions: model(input_ids=ids, position_ids=positions, cache=cache,
                                                   use_cache=True).logits

    monkeypatch.chdir(tmp_path)
    (tmp_path / "fixtures").symlink_to(ROOT / "fixtures")
    exec(compile(code, "fixtures/README.md", "exec"), {"load_port": load_port})  # noqa: S102 (the README's own code)
    out = stepper("fixtures", "verify", BASIC, tmp_path / "port.safetensors", "--allow-missing", "--plain",
                  "--report", tmp_path / "r.json")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["counts"]["match"] >= 150, report["counts"]  # every tensor an HF module outputs
    assert report["counts"]["mismatch"] == 0


def test_measure_counts_each_entry_a_candidate_gets_wrong_and_where():
    """A NaN or an infinity where the reference is finite is one entry outside the tolerance, at its
    place; each masked entry a candidate left unmasked is one more (not all, nor one for all)."""
    tol = {"atol": 1e-6, "rtol": 1e-5}
    ref = np.arange(1, 161, dtype=np.float32).reshape(1, 5, 32)
    cand = ref.copy()
    cand[0, 0, 3] = np.nan
    m = measure(cand, ref, tol)
    assert (m["outside"], m["worst"], m["ok"]) == (1, [0, 0, 3], False)
    assert m["nonfinite"] == "1 NaN where the reference is finite (first at [0,0,3])"
    assert (m["max_abs_err"], round(m["cosine"], 12)) == (0.0, 1.0)  # the figures of the finite entries, not inf and 0
    cand = ref.copy()
    cand[0, 2, 7] = np.inf
    assert (measure(cand, ref, tol)["outside"], measure(cand, ref, tol)["worst"]) == (1, [0, 2, 7])
    scores = np.where(np.tril(np.ones((4, 45), bool), 40), 1.0, -np.inf).astype(np.float32)[None]  # 100 masked
    unmasked = np.where(np.isfinite(scores), scores, 0).astype(np.float32)
    m = measure(unmasked, scores, tol)
    assert (m["outside"], m["same_nonfinite"], m["max_abs_err"]) == (int(np.isinf(scores).sum()), False, 0.0)
    assert measure(scores, scores, tol)["ok"] and measure(scores, scores, tol)["outside"] == 0
    both = measure(np.array([np.nan, 5.0, 3.0]), np.array([1.0, -np.inf, 3.0]), tol)  # a NaN, and a mask left off
    assert (both["outside"], both["worst"]) == (2, [1])  # the worst of the rest is the unmasked entry, not the NaN


def test_each_shipped_fixtures_storage_note_says_what_its_weight_files_hold():
    """A port reads weights.storage to know whether to look for block scales: an "fp8" note has
    F8_E4M3 weights beside their scales, a "bf16" one none (BF16 models were once noted as fp8)."""
    from safetensors import safe_open

    for manifest in sorted(ROOT.glob("fixtures/*/manifest.json")):
        weights = json.loads(manifest.read_text())["weights"]
        if not weights.get("copied") or not weights["storage"].startswith(("fp8:", "bf16:")):
            continue  # named, not copied; or in a family's own published layout (DeepSeek-V4's)
        said = json.loads(manifest.read_text())["description"].rsplit("; ", 1)[1].split()[0]
        assert weights["storage"].startswith(said + ":"), (manifest.parent.name, said)  # its description says so
        folder = (manifest.parent / weights["path"]).resolve()
        dtypes = set()
        for shard in folder.glob("*.safetensors"):
            with safe_open(shard, "np") as f:
                dtypes |= {f.get_slice(name).get_dtype() for name in f.keys()}  # noqa: SIM118 - not a dict
        assert ("F8_E4M3" in dtypes) == weights["storage"].startswith("fp8"), (manifest.parent.name, dtypes)


def test_every_name_a_dump_has_for_one_tensor_is_compared(basic, tmp_path):
    """A dump that holds a tensor twice (a module's output and the next module's input hook) is
    checked under both names: one that differs is a mismatch, named, whichever comes first."""
    tensors = {k: v for k, v in basic.tensors.items() if k.startswith("prefill.")}
    norm = tensors.pop("prefill.norm")
    tensors["prefill.model.norm"] = norm
    tensors["prefill.lm_head:input"] = -norm  # sorts first; the module's own output is read first anyway
    path = write_candidate(tmp_path / "c.safetensors", tensors)
    out = stepper("fixtures", "verify", BASIC, path, "--allow-missing", "--problems", "--plain",
                  "--report", tmp_path / "r.json")
    assert out.returncode == 1, out.stdout + out.stderr
    row = next(t for t in json.loads((tmp_path / "r.json").read_text())["tensors"] if t["name"] == "prefill.norm")
    assert (row["status"], row["candidate"]) == ("mismatch", "prefill.lm_head:input")
    assert row["detail"].endswith("; its other name prefill.model.norm matches")
    note = "1 candidate tensors are another name of a tensor read, and compared too: prefill.lm_head:input"
    assert note in out.stdout
    tensors["prefill.lm_head:input"] = norm
    out = stepper("fixtures", "verify", BASIC, write_candidate(tmp_path / "d.safetensors", tensors), "--allow-missing")
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_map_name_that_no_candidate_tensor_has_is_named(basic, tmp_path):
    """A typo in a --map key leaves its tensor unread: the verdict lists the key, not only the
    fixture tensor as missing."""
    tensors = {k: v for k, v in basic.tensors.items() if k != "prefill.layers.0.output"}
    tensors["my_out0"] = basic.tensors["prefill.layers.0.output"]
    (tmp_path / "m.json").write_text(json.dumps({"my_outO": "prefill.layers.0.output"}))
    out = stepper("fixtures", "verify", BASIC, write_candidate(tmp_path / "c.safetensors", tensors), "--map",
                  tmp_path / "m.json", "--problems", "--plain", "--report", tmp_path / "r.json")
    assert out.returncode == 1
    assert "1 --map names that no candidate tensor has: my_outO" in out.stdout.splitlines()
    assert json.loads((tmp_path / "r.json").read_text())["map_names_not_in_candidate"] == ["my_outO"]


def test_a_candidate_of_unknown_names_is_told_the_namings_its_family_has(tmp_path):
    """None of a candidate's names known: the message offers only the namings whose tables name the
    fixture's family, and with --names another naming that reads them is named."""
    hf = tmp_path / "hf.safetensors"
    save_file({"prefill.model.layers.1.mlp.gate[0]": np.zeros((8, 32), np.float32)}, hf)
    told = stepper("fixtures", "verify", str(ROOT / "fixtures" / "tiny-v3-grouped"), str(hf), "--names", "inference")
    assert told.returncode == 2 and told.stderr.rstrip().endswith(
        "they are transformers names, not inference ones: give --names transformers"), told.stderr
    told = stepper("fixtures", "verify", str(ROOT / "fixtures" / "tiny-v3-grouped"), str(hf), "--names", "canonical")
    assert told.returncode == 2 and told.stderr.rstrip().endswith(  # not "expected ... transformers module names"
        "they are transformers names, not canonical ones: give --names transformers"), told.stderr
    told = stepper("fixtures", "verify", str(ROOT / "fixtures" / "tiny-kimi-linear-kda"), str(hf))
    assert told.returncode == 2 and told.stderr.rstrip().endswith(  # a name of that fixture's own; transformers'
        "expected canonical names like prefill.layers.0.self_attn.q_proj, transformers module names (stepper "
        "fixtures names), or pass --map FILE.json"), told.stderr  # only: Kimi Linear has no inference/llama.cpp table
    save_file({"nothing.known": np.zeros(1, np.float32)}, hf.with_name("x.safetensors"))
    told = stepper("fixtures", "verify", str(ROOT / "fixtures" / "tiny-v3-grouped"), str(hf.with_name("x.safetensors")))
    assert told.stderr.rstrip().endswith("transformers module names, inference/model.py names, llama.cpp names "
                                         "(stepper fixtures names), or pass --map FILE.json"), told.stderr


def test_a_candidate_of_unknown_names_is_shown_a_name_of_the_fixtures_own(tmp_path):
    """LongCat's tensors are layers.N.sub0.* / sub1.*: the hint named layers.1.self_attn.k_pe, which it has not.
    (The candidate names its attention as DeepSeek-V3's transformers model does: LongCat's has two.)"""
    fixture = tmp_path / "fx"
    assert stepper("fixtures", "export", str(fixture), "--model", "tiny-longcat").returncode == 0
    save_file({"model.layers.0.self_attn.q_a_proj": np.zeros((1, 7, 96), np.float32)}, tmp_path / "c.safetensors")
    told = stepper("fixtures", "verify", str(fixture), str(tmp_path / "c.safetensors"))
    assert told.returncode == 2 and ("expected canonical names like layers.0.sub0.self_attn.k_pe, transformers module "
                                     "names (stepper fixtures names)") in told.stderr  # LongCat's table
