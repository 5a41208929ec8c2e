"""Shared fixtures. The helpers the tests share live in tests/helpers/ (importable as `helpers`:
pytest puts this folder on sys.path)."""

import compileall
import os
from pathlib import Path

import pytest
from helpers import untouched
from helpers.configs import config_with
from helpers.untouched import Guard

from stepper.kernels import parallel
from stepper.planning import memory
from stepper.weights import remote

CHECKOUT = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    # The tests run stepper as the command line does: its own splits across the cores, BLAS on one
    # thread (left with its own threads, OpenBLAS spins on the other core after every call and
    # fights the work that follows: tests/model ran 2x slower on 2 cores).
    parallel.single_threaded_blas()
    # The hundreds of commands the tests start each import stepper: compiled here once (into its
    # __pycache__, as an import writes it), they do not compile it again where PYTHONDONTWRITEBYTECODE
    # keeps imports from writing it (a command took 2.0 s, 1.3 s compiled, on a Zen 3).
    if not hasattr(config, "workerinput"):  # once, in the process that starts the workers
        compileall.compile_dir(CHECKOUT / "stepper", quiet=1)


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject's addopts): a worker for each core the run may use, at most four (each
    worker holds torch and the reference models; the suite's work is spread by then)."""
    return min(4, parallel.cores())


@pytest.fixture
def make_config():
    return config_with


@pytest.fixture(scope="session", autouse=True)
def default_folders(tmp_path_factory):
    """stepper's default cache and data folders (XDG_CACHE_HOME/stepper, XDG_DATA_HOME/stepper) in
    the test run's temporary folder for the session: never the user's (Hugging Face's cache stays
    where it was)."""
    home = tmp_path_factory.mktemp("home")
    names = ("XDG_CACHE_HOME", "XDG_DATA_HOME", "HF_HOME")
    saved = {k: os.environ.get(k) for k in names}
    os.environ["HF_HOME"] = (saved["HF_HOME"]
                             or str(Path(saved["XDG_CACHE_HOME"] or Path.home() / ".cache") / "huggingface"))
    os.environ["XDG_CACHE_HOME"], os.environ["XDG_DATA_HOME"] = str(home / "cache"), str(home / "data")
    yield home
    for k, v in saved.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


ROOM = 16 * 2**30  # the memory every test's run is told it may use


@pytest.fixture(autouse=True)
def fixed_room(monkeypatch):
    """Runs in the test process see a fixed amount of free memory, never the machine's (which other
    work on the machine moves: a lesson's 2 MiB run was once refused with "0 B available"). A test
    about the memory check sets its own figure over this one."""
    monkeypatch.setattr(memory, "available_bytes", lambda: ROOM)


@pytest.fixture(autouse=True)
def no_cache_chosen_before():
    """Each test starts with no remote cache chosen: a command run in this process (typer's
    CliRunner) chooses one for the process (cli.cache.choose), which a later test's
    STEPPER_CACHE_DIR would not move."""
    remote.configure(None)
    yield
    remote.configure(None)


@pytest.fixture(autouse=True)
def nothing_else_written(request, default_folders):
    """Fails the test if it changed a file of the checkout or of stepper's default folders (a test
    writes in its own tmp_path; each command run by helpers.cli checks that it changed there only
    stepper's own files)."""
    guard = Guard([CHECKOUT, default_folders / "cache" / "stepper", default_folders / "data" / "stepper"])
    untouched.test_folder = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield guard
    untouched.test_folder = None
    changed = guard.check()
    if changed:
        pytest.fail(f"the test changed files outside its own folders: {', '.join(changed[:5])}", pytrace=False)
