"""Files and tensors the index and the folder disagree on, as `stepper inspect`, `stepper run` and
the API say it: a .safetensors file the index does not name is never read (a note, exit 0: a
consolidated copy beside the shards is common), a tensor a run needs that only such a file holds
is missing and said to be there, a tensor stored in two shards is a problem naming both copies."""

import json
import shutil
from pathlib import Path

import pytest
from helpers.cli import stepper

import stepper as api
from stepper.errors import StepperError

INDEX = "model.safetensors.index.json"
LAST = "model-00005-of-00005.safetensors"  # synth's tiny: the norm and lm_head
LAYER1 = "model-00003-of-00005.safetensors"
NORM = "model.norm.weight"


@pytest.fixture(scope="module")
def sound(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("unnamed") / "ck"
    assert stepper("synth", "--model", "tiny", "--out", out).returncode == 0
    return out


def copied(sound: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "ck"
    shutil.copytree(sound, folder)
    return folder


def edit_index(folder: Path, change) -> None:
    index = json.loads((folder / INDEX).read_text())
    change(index["weight_map"])
    (folder / INDEX).write_text(json.dumps(index))


def test_a_consolidated_copy_beside_the_shards_is_a_note_from_inspect_run_and_the_api(sound, tmp_path):
    folder = copied(sound, tmp_path)
    shutil.copy(folder / LAYER1, folder / "consolidated.safetensors")
    note = f"note: consolidated.safetensors is in {folder} but not in {INDEX}: no run reads it"
    inspected = stepper("inspect", "--plain", folder)
    assert inspected.returncode == 0 and inspected.stderr == ""
    assert inspected.stdout.splitlines()[-1] == note and "problem" not in inspected.stdout
    listed = json.loads(stepper("inspect", "--json", folder).stdout.splitlines()[-1])
    assert listed == {"problems": [], "notes": [note]}
    ran = stepper("run", "--plain", "--model", folder, "--prompt-len", "2", "--only", "*logits")
    assert ran.returncode == 0 and note in ran.stdout.splitlines()
    assert note in api.run(str(folder), prompt_len=2, keep="*logits").notes
    quiet = stepper("inspect", "--plain", sound)  # the sound folder: no note
    assert quiet.returncode == 0 and "note:" not in quiet.stdout


def test_several_stray_files_are_named_three_then_counted(sound, tmp_path):
    folder = copied(sound, tmp_path)
    for name in ("a.safetensors", "b.safetensors", "c.safetensors", "d.safetensors"):
        (folder / name).write_bytes(b"not a safetensors file")
    (folder / ".hidden.safetensors").write_bytes(b"")
    done = stepper("inspect", "--plain", folder)
    assert done.returncode == 0
    assert done.stdout.splitlines()[-1] == (f"note: a.safetensors, b.safetensors, c.safetensors and 1 more are in "
                                            f"{folder} but not in {INDEX}: no run reads them")


def test_a_file_beside_a_single_model_safetensors_is_a_note(sound, tmp_path):
    """No index: model.safetensors is the checkpoint, and another file beside it is not read."""
    folder = tmp_path / "single"
    folder.mkdir()
    shutil.copy(sound / "config.json", folder)
    done = stepper("synth", "--model", "tiny", "--layers", "1:2", "--out", tmp_path / "one")
    assert done.returncode == 0
    shutil.copy(tmp_path / "one" / "model-00001-of-00001.safetensors", folder / "model.safetensors")
    shutil.copy(folder / "model.safetensors", folder / "copy.safetensors")
    inspected = stepper("inspect", "--plain", "--layers", "1:2", folder)
    assert inspected.returncode == 0, inspected.stdout[-500:]
    assert inspected.stdout.splitlines()[-1] == (f"note: copy.safetensors is in {folder} but beside model.safetensors, "
                                                 "which is read alone: no run reads it")


def test_a_tensor_only_a_stray_file_holds_is_missing_and_said_to_be_there(sound, tmp_path):
    """A stale index that leaves out the last shard: its tensors are missing for a run, which says where they are."""
    folder = copied(sound, tmp_path)
    edit_index(folder, lambda m: [m.pop(name) for name in [n for n, shard in m.items() if shard == LAST]])
    line = f"'{NORM}' is missing (expected shape [320]); it is in {LAST}, which is not in {INDEX}"
    inspected = stepper("inspect", "--plain", folder)
    assert inspected.returncode == 1 and f"  ! {line}" in inspected.stdout.splitlines()
    assert inspected.stdout.splitlines()[-4] == f"note: {LAST} is in {folder} but not in {INDEX}: no run reads it"
    ran = stepper("run", "--plain", "--model", folder, "--prompt-len", "2")
    assert ran.returncode == 2 and ran.stdout == "" and f"  - {line}" in ran.stderr.splitlines()
    with pytest.raises(StepperError, match=f"it is in {LAST}, which is not in"):
        api.run(str(folder), prompt_len=2)
    alone = stepper("run", "--plain", "--model", folder, "--layer", "1", "--only", "layers.1.output")
    assert alone.returncode == 0, alone.stderr  # the layer does not need them


def test_a_tensor_in_two_shards_is_a_problem_naming_both(sound, tmp_path):
    """The norm copied into layer 1's shard too (both named by the index): two copies, and transformers reads the
    one in the shard it loads last, stepper the one the index names."""
    folder = copied(sound, tmp_path)
    header_len = int.from_bytes((folder / LAST).read_bytes()[:8], "little")
    header = json.loads((folder / LAST).read_bytes()[8:8 + header_len])
    offsets = header[NORM]["data_offsets"]
    norm_bytes = (folder / LAST).read_bytes()[8 + header_len + offsets[0]:8 + header_len + offsets[1]]
    append_tensor(folder / LAYER1, NORM, header[NORM]["dtype"], header[NORM]["shape"], norm_bytes)
    line = (f"'{NORM}' is in {LAST}, as {INDEX} says, and in {LAYER1} too: two copies, of which transformers reads "
            f"the one in {LAST} (it loads the shards in order)")
    inspected = stepper("inspect", "--plain", folder)
    assert inspected.returncode == 1 and f"  ! {line}" in inspected.stdout.splitlines()
    ran = stepper("run", "--plain", "--model", folder, "--prompt-len", "2")
    assert ran.returncode == 2 and ran.stderr == f"stepper: error: {folder}: {line}\n"


def append_tensor(path: Path, name: str, dtype: str, shape: list[int], data: bytes) -> None:
    """The shard written again with one more tensor at the end of its data."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header, body = json.loads(raw[8:8 + n]), raw[8 + n:]
    header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(body), len(body) + len(data)]}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + body + data)
