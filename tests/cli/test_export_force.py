"""`stepper fixtures export --force` replaces only a fixture folder stepper wrote: whatever else
is in the way is named in one line and kept byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.malformed import MINI_CONFIG
from typer.testing import CliRunner

from stepper.cli.main import app


def export(out: Path, *more: str):
    return CliRunner().invoke(app, ["fixtures", "export", str(out), "--model", str(out.parent / "mini.json"),
                                    "--prompt-len", "2", *more])


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def written(tmp_path) -> Path:
    (tmp_path / "mini.json").write_text(json.dumps(MINI_CONFIG))
    out = tmp_path / "fixture"
    assert export(out).exit_code == 0
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "tensors.safetensors", "weights"]
    return out


def test_force_replaces_a_fixture_folder_stepper_wrote(written):
    manifest = json.loads((written / "manifest.json").read_text())
    done = export(written, "--force", "--seed", "1")
    assert done.exit_code == 0 and json.loads((written / "manifest.json").read_text()) != manifest
    assert sorted(p.name for p in written.parent.iterdir()) == ["fixture", "mini.json"]  # no .old-* or .partial-*


def test_force_keeps_a_tensors_file_changed_since_stepper_wrote_it(written):
    """Its manifest notes the tensors file's bytes and sha256: an edit of one value (same size) is seen."""
    tensors = written / "tensors.safetensors"
    data = bytearray(tensors.read_bytes())
    data[-1] ^= 1
    tensors.write_bytes(bytes(data))
    before = snapshot(written)
    done = export(written, "--force")
    assert done.exit_code == 2 and snapshot(written) == before
    assert done.stderr == (f"stepper: error: {written}: holds 'tensors.safetensors' (changed since stepper wrote it); "
                           "--force replaces only a fixture folder stepper wrote, so nothing there was touched\n")


@pytest.mark.parametrize("intruder, named", [
    ("notes.txt", "'notes.txt'"),
    ("weights/notes.txt", "'weights/notes.txt'"),
    ("weights/sub/x.bin", "'weights/sub'"),
])
def test_force_keeps_a_folder_holding_anything_else(written, intruder, named):
    (written / intruder).parent.mkdir(parents=True, exist_ok=True)
    (written / intruder).write_text("mine\n")
    before = snapshot(written)
    done = export(written, "--force")
    assert done.exit_code == 2 and snapshot(written) == before
    assert done.stderr == (f"stepper: error: {written}: holds {named}; --force replaces only a fixture folder stepper "
                           "wrote, so nothing there was touched\n")


def test_force_keeps_a_manifest_of_another_format_and_a_plain_folder(written, tmp_path):
    (written / "manifest.json").write_text('{"format": "mine"}')
    before = snapshot(written)
    done = export(written, "--force")
    assert done.exit_code == 2 and "holds 'manifest.json' (not a stepper-fixture manifest)" in done.stderr
    assert snapshot(written) == before
    mine = tmp_path / "mine"
    (mine / "data").mkdir(parents=True)
    (mine / "tensors.safetensors").write_bytes(b"my own tensors")
    done = export(mine, "--force")
    assert (done.exit_code == 2 and "holds 'data'" in done.stderr
            and (mine / "tensors.safetensors").read_bytes() == b"my own tensors")


def test_a_file_in_the_way_is_kept(tmp_path):
    (tmp_path / "mini.json").write_text(json.dumps(MINI_CONFIG))
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    done = export(afile, "--force")
    assert done.exit_code == 2 and done.stderr == (
        f"stepper: error: {afile}: is a file, not a folder; stepper writes a new folder there "
        "(remove the file first)\n")
    assert afile.read_text() == "keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["afile", "mini.json"]


def test_without_force_an_existing_folder_is_refused(written):
    before = snapshot(written)
    done = export(written)
    assert (done.exit_code == 2
            and done.stderr == f"stepper: error: {written}: already exists; pass --force to replace it\n")
    assert snapshot(written) == before


def test_a_link_in_the_way_is_named_as_a_link_and_not_followed(written, tmp_path):
    before = snapshot(written)
    link = tmp_path / "alink"
    link.symlink_to(written)  # a folder stepper wrote, behind a link: --force must not replace it through the link
    done = export(link, "--force")
    assert done.exit_code == 2 and done.stderr == (
        f"stepper: error: {link}: is a link, not a folder; stepper writes a new folder there "
        "(remove the link first)\n")
    assert link.is_symlink() and snapshot(written) == before


def test_synth_force_keeps_a_folder_whose_index_is_nested_too_deep_in_one_line(tmp_path):
    from helpers.cli import one_line, stepper
    out = tmp_path / "ck"
    out.mkdir()
    index = out / "model.safetensors.index.json"
    index.write_text("[" * 100_000 + "]" * 100_000)
    said = one_line(stepper("synth", "--model", "tiny", "--out", out, "--force"))
    assert "'model.safetensors.index.json' (missing, or not written by stepper)" in said
    assert index.read_text() == "[" * 100_000 + "]" * 100_000


def note_in_config(folder: Path) -> None:
    config = folder / "weights" / "config.json"
    config.write_text(config.read_text() + "// mine\n")


def flip_a_shard_byte(folder: Path) -> None:
    shard = max((folder / "weights").glob("model-*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))


def note_in_manifest(folder: Path) -> None:
    manifest = folder / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"description": "', '"description": "MY NOTES ', 1))


@pytest.mark.parametrize("edit, named", [(note_in_config, "weights/config.json"),
                                         (flip_a_shard_byte, "weights/model-00004-of-00004.safetensors"),
                                         (note_in_manifest, "manifest.json")])
def test_force_keeps_weights_or_a_manifest_changed_since_stepper_wrote_them(written, edit, named):
    edit(written)
    before = snapshot(written)
    done = export(written, "--force")
    assert done.exit_code == 2 and snapshot(written) == before
    assert done.stderr == (f"stepper: error: {written}: holds '{named}' (changed since stepper wrote it); --force "
                           "replaces only a fixture folder stepper wrote, so nothing there was touched\n")


@pytest.mark.parametrize("new", [False, True])
def test_a_file_put_in_the_folder_while_the_run_ran_is_kept(written, monkeypatch, new):
    """The folder is checked again before it is replaced: a dump copied into the old fixture during a
    long run (Kimi K2's layer takes minutes), or a folder made at a new name meanwhile, was deleted."""
    from stepper.fixtures import export as export_module

    out = written.parent / "new" if new else written
    write = export_module.write_tensors

    def meanwhile(path, events):
        out.mkdir(exist_ok=True)
        (out / "port.safetensors").write_bytes(b"mine")
        write(path, events)

    monkeypatch.setattr(export_module, "write_tensors", meanwhile)
    done = export(out, *([] if new else ["--force"]))
    assert done.exit_code == 2 and (out / "port.safetensors").read_bytes() == b"mine", done.output
    assert done.stderr.startswith(f"stepper: error: {out}: ")
    assert sorted(p.name for p in written.parent.iterdir()) == sorted(["fixture", "mini.json"] + ["new"] * new)
