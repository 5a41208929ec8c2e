"""The malformed-input corpus (tests/helpers/malformed.py) through the commands a user types.

Every broken checkpoint goes through `stepper inspect` (exit 1 with the problem listed, or 2 and
one line when it cannot be read at all) and `stepper run` (exit 2: one line, or the list of the
run's problems); every broken fixture folder through `stepper fixtures verify` (exit 2, one
line); every broken safetensors file through `stepper inspect FILE`. No traceback, no control
character on the terminal; the bytes each command reads and decodes bounded by the sizes of the
files it is given, and its memory too. In-process (typer's runner), with a sample as real
subprocesses.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.files import size_of
from helpers.malformed import (
    CASES,
    DIR_CASES,
    FIXTURE_CASES,
    LAYER1_SHARD,
    MINI_CONFIG,
    DirCase,
    config_fields,
    with_tensor,
)
from helpers.work import counted
from typer.testing import CliRunner

from stepper.cli.main import app
from stepper.config import Config
from stepper.fixtures import aliases
from stepper.views import inspect as inspect_view
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.synth_checkpoint import synth_checkpoint

READ_SLACK = 64 * 1024  # what a command reads besides the files it is given (/proc/meminfo, cgroup limits)
PYTHON_BYTES = 64 * 2**20  # what one traced command may allocate in Python and NumPy (the files are ~130 KB)
GROWTH_KIB = 512 * 1024  # how far the test process's peak memory may rise over all of these commands
CHILD_BYTES = 2**30  # the address space of a whole `python -m stepper` process (a run of mini takes under 600 MB)
TRACED_EVERY = 8  # tracing allocations makes a command 5x slower: one case in 8 is traced


PEAK_BEFORE: list[int] = []  # the test process's peak memory before the first command of this module


@pytest.fixture(scope="module", autouse=True)
def peak_before():
    PEAK_BEFORE[:] = [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss]


@pytest.fixture(scope="module")
def mini(tmp_path_factory) -> Path:
    """The sound checkpoint; inspected and run once first, so that no case pays for the imports."""
    folder = synth_checkpoint(SyntheticWeights(Config.from_hf(MINI_CONFIG, "mini"), seed=0),
                              tmp_path_factory.mktemp("mini") / "ck")
    assert invoke("inspect", str(folder)).exit_code == 0 and invoke("run", "--model", str(folder)).exit_code == 0
    return folder


@pytest.fixture(scope="module")
def mini_fixture(mini, tmp_path_factory) -> tuple[Path, Path]:
    """A fixture folder exported from mini, and a candidate (its own tensors, kept outside it)."""
    folder = tmp_path_factory.mktemp("fixture") / "mini"
    done = invoke("fixtures", "export", str(folder), "--model", str(mini), "--prompt-len", "2")
    assert done.exit_code == 0, done.stderr
    candidate = folder.parent / "candidate.safetensors"
    shutil.copy(folder / "tensors.safetensors", candidate)
    return folder, candidate


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def measured(*args: str, traced: bool = False):
    """The command in-process, with the work it did: bytes read, tensor bytes handed out, and
    (traced) the most it allocated, NumPy's arrays included; the test process's peak memory after
    it. A command reads each file it is given about once (fixtures verify: and hashes it), and
    hands out at most the tensors' bytes those files hold: a command that read or decoded them
    over and over would fail. stepper's own naming tables, read once a process whichever test reads
    them first, are read before."""
    files = sum(size_of(Path(a)) for a in args if a.startswith("/"))
    aliases.tables()
    with counted(traced=traced) as work:
        done = invoke(*args)
    assert done.exception is None or isinstance(done.exception, SystemExit), (args, done.exception)
    assert work.read <= 2 * files + READ_SLACK and work.tensor_bytes <= files, (args, files, work)
    assert work.peak < PYTHON_BYTES, (args, work)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - PEAK_BEFORE[0] < GROWTH_KIB
    for text in (done.stdout, done.stderr):
        assert ("Traceback" not in text
                and not any(c < " " and c not in "\n\t" or c == "\x7f" for c in text)), (args, text)
    return done


def one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("stepper: error: "), stderr
    return lines[0]


def run_refusal(stderr: str) -> None:
    """One line (a single problem too), or the run's list of problems: a line ending with the count,
    then one per problem."""
    first, *rest = stderr.splitlines()
    assert first.startswith("stepper: error: "), stderr
    if rest:
        assert (first.endswith("problem(s) with the weights of this run:")
                and all(r.startswith("  - ") for r in rest)), stderr


def broken(mini: Path, tmp_path: Path, case: DirCase) -> Path:
    folder = tmp_path / "ck"
    shutil.copytree(mini, folder)
    case.edit(folder)
    return folder


def test_the_corpus_has_over_a_hundred_cases_beyond_the_header_cases():
    header_shards = [c for c in DIR_CASES if c.name.startswith("shard-header-")]
    assert len(DIR_CASES) - len(header_shards) + len(FIXTURE_CASES) >= 100 and len(header_shards) == len(CASES)


def test_the_sound_mini_checkpoint_passes_inspect_and_runs(mini):
    checked = measured("inspect", "--plain", str(mini), traced=True)
    assert checked.exit_code == 0 and checked.stderr == "" and "problem" not in checked.stdout
    assert measured("run", "--model", str(mini), "--prompt-len", "2", "--plain", traced=False).exit_code == 0


def test_a_config_at_odds_with_every_tensor_lists_some_problems_and_counts_the_rest(mini, tmp_path, monkeypatch):
    """A config.json that does not describe its weights makes a problem of every tensor (a million,
    in a header of zero-size tensors): the screen lists LISTED_PROBLEMS (here 10) of them and says
    how many more, --json every one."""
    folder = tmp_path / "ck"
    shutil.copytree(mini, folder)
    config_fields(hidden_size=MINI_CONFIG["hidden_size"] * 2)(folder)
    monkeypatch.setattr(inspect_view, "LISTED_PROBLEMS", 10)
    done = measured("inspect", "--plain", str(folder))
    listed = [line for line in done.stdout.splitlines() if line.startswith("  ! ")]
    problems = int(re.search(r"^(\d+) problems", done.stdout, re.MULTILINE)[1])
    assert done.exit_code == 1 and problems > 10 and len(listed) == 10
    assert done.stdout.rstrip().endswith(f"  ... and {problems - 10:,} more (--json lists every one)")
    every = measured("inspect", "--json", str(folder)).stdout.splitlines()[-1]
    assert len(json.loads(every)["problems"]) == problems


def test_a_multi_token_prediction_layer_is_no_stray(mini, tmp_path):
    """DeepSeek-V3's MTP layer follows the last one (num_nextn_predict_layers): not a problem."""
    folder = tmp_path / "ck"
    shutil.copytree(mini, folder)
    with_tensor("model.layers.2.enorm.weight", "BF16", [64], shard=LAYER1_SHARD)(folder)
    assert measured("inspect", "--plain", str(folder)).exit_code == 1
    config_fields(num_nextn_predict_layers=1)(folder)
    done = measured("inspect", "--plain", str(folder))
    assert done.exit_code == 0 and "layer 2 (beyond the config's num_hidden_layers = 2)" in done.stdout


@pytest.mark.parametrize("case", DIR_CASES, ids=lambda c: c.name)
def test_a_broken_checkpoint_is_reported_by_inspect_and_refused_by_run(mini, tmp_path, case):
    folder = broken(mini, tmp_path, case)
    checked = measured("inspect", "--plain", str(folder), traced=DIR_CASES.index(case) % TRACED_EVERY == 0)
    assert checked.exit_code == case.inspect, (checked.stdout[-2000:], checked.stderr)
    if case.inspect == 1:
        assert checked.stderr == "" and case.message in checked.stdout, checked.stdout[-2000:]
        summary = checked.stdout.split("\n")
        assert any(line.startswith("  ! ") and case.message in line for line in summary), checked.stdout[-2000:]
    elif case.inspect == 0:  # sound after all
        assert checked.stderr == "" and "problem" not in checked.stdout, checked.stdout[-2000:]
    else:
        assert case.message in one_line(checked.stderr) and checked.stdout == ""
    ran = measured("run", "--model", str(folder), "--prompt-len", "2", "--plain")
    assert ran.exit_code == case.run, ran.stderr
    if case.run == 2:
        run_refusal(ran.stderr)
        assert case.message in ran.stderr


@pytest.mark.parametrize("case", FIXTURE_CASES, ids=lambda c: c.name)
def test_a_broken_fixture_folder_is_refused_by_verify(mini_fixture, tmp_path, case):
    sound, candidate = mini_fixture
    folder = tmp_path / "fixture"
    shutil.copytree(sound, folder)
    case.edit(folder)
    done = measured("fixtures", "verify", str(folder), str(candidate),
                    traced=FIXTURE_CASES.index(case) % TRACED_EVERY == 0)
    assert done.exit_code == 2 and case.message in one_line(done.stderr), done.stderr


def test_the_sound_fixture_verifies(mini_fixture):
    sound, candidate = mini_fixture
    assert measured("fixtures", "verify", "--plain", str(sound), str(candidate)).exit_code == 0


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_broken_safetensors_file_is_one_line_from_inspect(tmp_path, case):
    path = tmp_path / "file.safetensors"
    path.write_bytes(case.content)
    done = measured("inspect", "--plain", str(path), traced=CASES.index(case) % TRACED_EVERY == 0)
    assert done.exit_code == 2 and str(path) in one_line(done.stderr) and done.stdout == ""


SAMPLE = [c for i, c in enumerate(DIR_CASES) if i % 40 == 0]  # 5 cases, about 3 s each on a busy machine


@pytest.mark.parametrize("case", SAMPLE, ids=lambda c: c.name)
def test_a_sample_as_subprocesses(mini, tmp_path, case):
    folder = broken(mini, tmp_path, case)
    for args, code in ((["inspect", "--plain", str(folder)], case.inspect),
                       (["run", "--model", str(folder), "--prompt-len", "2"], case.run)):
        done = subprocess.run([sys.executable, "-m", "stepper", *args], capture_output=True, text=True,
                              timeout=30, check=False,
                              preexec_fn=limit_memory)
        assert done.returncode == code and "Traceback" not in done.stderr, done.stderr
        assert case.message in (done.stdout if code == 1 else done.stderr)


def limit_memory() -> None:
    """In the child: an address space of CHILD_BYTES at most, so that an allocation sized by a
    number read from a file fails there (a peak RSS measured from here would count this test
    process too, which the child is forked from)."""
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_BYTES, CHILD_BYTES))


def permissions_apply() -> list[str]:
    """A command prefix under which file permissions apply to the child: as root, setpriv dropping the
    capabilities that override them (the test is skipped without it)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("root, and no setpriv to drop CAP_DAC_OVERRIDE")
    caps = "-dac_override,-dac_read_search"
    return ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}"]


@pytest.mark.parametrize("mode", [0o600, 0o300], ids=["not-searchable", "not-listable"])
def test_a_folder_that_cannot_be_searched_or_listed_is_one_line(mini, tmp_path, mode):
    """Without search permission Path.exists() raised PermissionError (a traceback); without read
    permission a glob found the folder empty."""
    folder = broken(mini, tmp_path, DirCase("as-is", lambda f: None, 0, ""))
    folder.chmod(mode)
    try:
        for args in (["inspect", "--plain", str(folder)], ["run", "--model", str(folder), "--prompt-len", "2"]):
            done = subprocess.run([*permissions_apply(), sys.executable, "-m", "stepper", *args], capture_output=True,
                                  text=True, timeout=60, check=False)
            expected = f"stepper: error: {folder}: cannot be read (permission denied)\n"
            assert (done.returncode, done.stderr) == (2, expected), done.stderr[-2000:]
    finally:
        folder.chmod(0o755)
