"""A config.json or index that is not a regular file, or far larger than one, is one line (exit 2):
a FIFO never blocks the command (nothing would ever write to it), a link to /dev/zero is not read
until memory runs out, and a huge file is refused from its size before a byte is read. A shard
that is no file is named for what it is."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cli import refused, stepper

from stepper.untrusted import jsonfile

if sys.platform == "win32":
    pytest.skip("FIFOs and /dev/zero are POSIX", allow_module_level=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("special") / "ck"
    assert stepper("synth", "--model", "tiny", "--out", folder).returncode == 0
    return folder


def linked_copy(checkpoint: Path, folder: Path, special: str) -> Path:
    """The checkpoint's files linked into `folder`, all but `special`, which is left to the test."""
    folder.mkdir()
    for f in checkpoint.iterdir():
        if f.name != special:
            (folder / f.name).symlink_to(f)
    return folder


def in_child(*args: object) -> subprocess.CompletedProcess:
    """A real process: if it blocked on a FIFO, the timeout would end the test instead of hanging it."""
    return subprocess.run([sys.executable, "-m", "stepper", *map(str, args)], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL, check=False)


@pytest.mark.parametrize("special, what", [("config.json", "a config.json"),
                                           ("model.safetensors.index.json", "the checkpoint index")])
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_special_file_is_refused_without_reading_it(checkpoint, tmp_path, special, what, kind):
    folder = linked_copy(checkpoint, tmp_path / "ck", special)
    if kind == "fifo":
        os.mkfifo(folder / special)
    else:
        (folder / special).symlink_to("/dev/zero")
    for args in (["run", "--model", folder, "--layer", "1"], ["inspect", folder]):
        out = in_child(*args)
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
        assert f"{folder / special}: is not a regular file" in out.stderr
    if special == "config.json":
        line = refused(in_child("run", "--model", folder))
        assert line == f"{folder / special}: is not a regular file, expected {what}"


def test_a_config_larger_than_any_is_refused_from_its_size(checkpoint, tmp_path):
    folder = linked_copy(checkpoint, tmp_path / "ck", "config.json")
    with open(folder / "config.json", "wb") as f:  # sparse: no bytes written, none read
        f.truncate(jsonfile.MAX_BYTES + 1)
    assert refused(stepper("run", "--model", folder, "--layer", "1")) == (
        f"{folder / 'config.json'}: {jsonfile.MAX_BYTES + 1:,} bytes, more than a config.json holds (at most 64 MiB)")



@pytest.mark.parametrize("kind, why", [("folder", "a folder, not a file"),
                                       ("fifo", "not a regular file: a FIFO or a device"),
                                       ("loop", "a symlink loop: too many levels of symbolic links")])
def test_a_shard_that_is_no_file_is_named_for_what_it_is(checkpoint, tmp_path, kind, why):
    shard = "model-00003-of-00005.safetensors"
    folder = linked_copy(checkpoint, tmp_path / "ck", shard)
    if kind == "folder":
        (folder / shard).mkdir()
    elif kind == "fifo":
        os.mkfifo(folder / shard)
    else:
        (folder / "other").symlink_to(shard)
        (folder / shard).symlink_to("other")
    line = refused(in_child("run", "--model", folder, "--layer", "1"))
    assert line.startswith(f"{folder}: {shard} cannot be read ({why}); it holds ")
