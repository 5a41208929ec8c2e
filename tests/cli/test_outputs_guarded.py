"""What stepper writes where the user already has something: a `fixtures verify --report` onto an
existing file, a FIFO or a link; `lesson reset` twice. Nothing of the user's is replaced or lost;
a refusal is one line, exit 2; --force replaces only what stepper wrote."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import pytest
from helpers.cli import refused, stepper
from safetensors import safe_open
from safetensors.numpy import save_file
from typer.testing import CliRunner

from stepper.cli.main import app
from stepper.lessons.schema import find_lesson

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "fixtures" / "tiny-prefill-decode"
MINE = "my own notes, not a report\n"


@pytest.fixture(scope="module")
def candidate(tmp_path_factory) -> Path:
    """A port's dump holding the fixture's first tensors (verify with --allow-missing matches)."""
    with safe_open(FIXTURE / "tensors.safetensors", "np") as f:
        tensors = {name: f.get_tensor(name) for name in list(f.keys())[:5]}
    path = tmp_path_factory.mktemp("port") / "port.safetensors"
    save_file(tensors, str(path))
    return path


def verify(candidate: Path, report: Path, *more: str):
    return stepper("fixtures", "verify", FIXTURE, candidate, "--allow-missing", "--plain", "--report", report, *more)


def test_a_report_onto_a_users_file_is_refused_with_or_without_force(candidate, tmp_path):
    report = tmp_path / "report.json"
    report.write_text(MINE)
    assert refused(verify(candidate, report)) == (f"--report {report}: is not a report stepper wrote; --force "
                                                  "replaces only a report stepper wrote, so give another name")
    assert refused(verify(candidate, report, "--force")) == (
        f"--report {report}: is not a report stepper wrote; --force replaces only a report stepper wrote, so it was "
        "not touched")
    assert report.read_text() == MINE and sorted(tmp_path.iterdir()) == [report]


def test_a_report_onto_a_fifo_or_a_link_is_refused_and_neither_is_touched(candidate, tmp_path):
    fifo, link, target = tmp_path / "fifo.json", tmp_path / "link.json", tmp_path / "target.json"
    os.mkfifo(fifo)
    target.write_text(MINE)
    link.symlink_to(target)
    assert refused(verify(candidate, fifo,
                          "--force")) == f"--report {fifo}: is not a regular file; give a new file name"
    assert refused(verify(candidate, link, "--force")) == (f"--report {link}: is a link; stepper does not write "
                                                           "through links, give a new file name")
    assert fifo.is_fifo() and link.is_symlink() and target.read_text() == MINE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo.json", "link.json", "target.json"]


def test_force_replaces_a_report_stepper_wrote(candidate, tmp_path):
    report = tmp_path / "report.json"
    assert verify(candidate, report).returncode == 0
    first = report.read_bytes()
    assert verify(candidate, report, "--force").returncode == 0
    assert report.read_bytes() == first  # the whole report written again
    assert sorted(tmp_path.iterdir()) == [report]  # no temporary file left


@pytest.mark.parametrize("edit", [
    lambda text: json.dumps({**json.loads(text), "my_triage": "the rope is off"}),  # a note added
    lambda text: text.replace('"result": "match"', '"result": "checked by hand"'),  # a value changed in place
])
def test_force_keeps_a_report_changed_since_stepper_wrote_it(candidate, tmp_path, edit):
    report = tmp_path / "report.json"
    assert verify(candidate, report).returncode == 0
    report.write_text(edit(report.read_text()))
    mine = report.read_bytes()
    assert refused(verify(candidate, report, "--force")) == (
        f"--report {report}: changed since stepper wrote it; --force replaces only a report as stepper wrote it, "
        "so it was not touched")
    assert report.read_bytes() == mine and sorted(tmp_path.iterdir()) == [report]


def test_two_lesson_resets_keep_every_backup(tmp_path):
    lesson = find_lesson("tour")
    env = {"STEPPER_DATA_DIR": str(tmp_path / "data")}
    folder = tmp_path / "stepper-lessons"
    assert stepper("lesson", "start", "tour", cwd=tmp_path, env=env, stdin="q\n").returncode == 0
    (folder / "tour.py.bak").write_text("a backup the learner made\n")
    for attempt in ("first attempt\n", "second attempt\n"):
        (folder / "tour.py").write_text(attempt)
        out = stepper("lesson", "reset", "tour", "--plain", cwd=tmp_path, env=env)
        assert out.returncode == 0, out.stderr
    assert (folder / "tour.py").read_text() == lesson.stub.read_text()
    assert {p.name: p.read_text() for p in folder.iterdir()} == {
        "tour.py": lesson.stub.read_text(), "tour.py.bak": "a backup the learner made\n",
        "tour.py.bak2": "first attempt\n", "tour.py.bak3": "second attempt\n"}
    assert out.stdout == ("stepper-lessons/tour.py is the stub again; your previous file is "
                          "stepper-lessons/tour.py.bak3\n")
    again = stepper("lesson", "reset", "tour", "--plain", cwd=tmp_path, env=env)  # the stub untouched: no backup of it
    assert again.stdout == "stepper-lessons/tour.py is the stub again\n" and len(list(folder.iterdir())) == 4


def test_a_lesson_file_that_is_a_link_is_not_written_through(tmp_path):
    env = {"STEPPER_DATA_DIR": str(tmp_path / "data")}
    folder = tmp_path / "stepper-lessons"
    folder.mkdir()
    target = tmp_path / "elsewhere.py"
    target.write_text(MINE)
    (folder / "tour.py").symlink_to(target)
    out = stepper("lesson", "reset", "tour", cwd=tmp_path, env=env)
    assert "is a link, not an exercise file" in refused(out)
    assert target.read_text() == MINE and sorted(p.name for p in folder.iterdir()) == ["tour.py"]


def test_synth_force_does_not_replace_a_folder_holding_a_users_config(tmp_path):
    """A config.json alone carries a synth file's name, but no index says stepper wrote it."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "config.json").write_text('{"model_type": "kimi_k2"}\n')
    done = stepper("synth", "--out", out, "--force")
    assert "--force replaces only a checkpoint stepper synth wrote" in refused(done)
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]
    assert (out / "config.json").read_text() == '{"model_type": "kimi_k2"}\n'
    assert stepper("synth", "--out", tmp_path / "ours").returncode == 0
    assert stepper("synth", "--out", tmp_path / "ours", "--force", "--seed", "1").returncode == 0


@pytest.mark.parametrize("model", ["tiny", "tiny-v4"])
def test_synth_force_does_not_replace_a_config_edited_since_synth_wrote_it(tmp_path, model):
    """A user raising max_position_embeddings in a synth folder's config.json: the folder is still
    stepper's by its names and index, but --force does not replace the edit; a shard grown since
    is refused too. Left as written, the folder is replaced."""
    out = tmp_path / "synth"
    assert stepper("synth", "--model", model, "--out", out).returncode == 0
    config = json.loads((out / "config.json").read_text())
    edited = json.dumps({**config, "max_position_embeddings": 2**25}, indent=2) + "\n"
    (out / "config.json").write_text(edited)
    done = stepper("synth", "--model", model, "--out", out, "--force")
    assert refused(done) == (f"{out}: holds 'config.json' (changed since stepper wrote it); --force "
                             "replaces only a checkpoint stepper synth wrote, so nothing there was touched")
    assert (out / "config.json").read_text() == edited
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")  # put back as synth wrote it
    shard = min(out.glob("model-*.safetensors"))
    with open(shard, "ab") as f:
        f.write(b" ")
    assert "changed since stepper wrote it" in refused(stepper("synth", "--model", model, "--out", out, "--force"))
    shard.write_bytes(shard.read_bytes()[:-1])
    assert stepper("synth", "--model", model, "--out", out, "--force", "--seed", "1").returncode == 0
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["metadata"]["stepper_synthetic_seed"] == 1


@pytest.mark.parametrize("model, writer", [("tiny", "stepper.weights.synth_checkpoint._write"),
                                           ("tiny-v4", "stepper.families.deepseek_v4_synth.write_safetensors")])
@pytest.mark.parametrize("new", [False, True])
def test_synth_keeps_a_file_put_in_its_folder_while_it_wrote(tmp_path, monkeypatch, model, writer, new):
    """The folder is checked again before it is replaced, as fixtures export's is: a file put in it
    during a long write (a full-size layer takes minutes), or a folder made at a new name meanwhile,
    was deleted with it."""
    out = tmp_path / "synth"
    if not new:
        assert CliRunner().invoke(app, ["synth", "--model", model, "--out", str(out)]).exit_code == 0
    module, _, name = writer.rpartition(".")
    write = getattr(importlib.import_module(module), name)

    def meanwhile(*args, **kwargs):
        out.mkdir(exist_ok=True)
        (out / "port.safetensors").write_bytes(b"mine")
        return write(*args, **kwargs)

    monkeypatch.setattr(writer, meanwhile)
    done = CliRunner().invoke(app, ["synth", "--model", model, "--out", str(out), *([] if new else ["--force"])])
    assert done.exit_code == 2 and (out / "port.safetensors").read_bytes() == b"mine", done.output
    assert done.stderr.startswith(f"stepper: error: {out}: ")
    assert [p.name for p in tmp_path.iterdir()] == ["synth"]  # no partial folder left beside it
