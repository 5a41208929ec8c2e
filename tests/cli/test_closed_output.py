"""Standard output closed early (`| head`) or unwritable (`> /dev/full`), in real processes:
the files a command was asked to write are whole, other commands end quietly, and a full disk is
one line and exit 2, never a traceback."""

import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

if sys.platform == "win32":
    pytest.skip("needs POSIX pipes and /dev/full", allow_module_level=True)


def closed_after_one_line(*args: str, cwd) -> tuple[int, str]:
    """stepper ARGS with its output's reader gone after the first line: (exit code, stderr)."""
    child = subprocess.Popen([sys.executable, "-m", "stepper", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL, cwd=cwd)
    child.stdout.readline()
    child.stdout.close()
    error = child.stderr.read().decode()
    return child.wait(timeout=300), error


def test_a_dump_is_written_whole_when_the_reader_goes_away(tmp_path):
    code, error = closed_after_one_line("run", "--plain", "--dump", "cut.safetensors", cwd=tmp_path)
    assert (code, error) == (0, "")
    whole = subprocess.run([sys.executable, "-m", "stepper", "run", "--plain", "--dump", "whole.safetensors"],
                           cwd=tmp_path, capture_output=True, check=True, timeout=300)
    assert whole.returncode == 0
    cut, full = load_file(tmp_path / "cut.safetensors"), load_file(tmp_path / "whole.safetensors")
    assert set(cut) == set(full) and "logits" in cut
    for name in full:
        np.testing.assert_array_equal(cut[name], full[name], err_msg=name)


def test_a_fixture_is_written_whole_and_the_export_ends_well(tmp_path):
    code, error = closed_after_one_line("fixtures", "export", "fx", "--prompt-len", "2", cwd=tmp_path)
    assert (code, error) == (0, "")
    verified = subprocess.run([sys.executable, "-m", "stepper", "fixtures", "verify", "fx", "fx/tensors.safetensors"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_a_run_without_files_ends_quietly(tmp_path):
    assert closed_after_one_line("run", "--plain", cwd=tmp_path) == (0, "")


def test_a_full_disk_is_one_line_and_exit_2(tmp_path):
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "stepper", "run", "--plain"], stdout=full, stderr=subprocess.PIPE,
                              text=True, cwd=tmp_path, timeout=300, check=False)
    assert done.returncode == 2
    assert done.stderr == "stepper: error: the output cannot be written: No space left on device\n"
