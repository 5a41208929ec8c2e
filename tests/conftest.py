"""Shared fixtures. The helpers the tests share live in tests/helpers/ (importable as `helpers`:
pytest puts this folder on sys.path)."""

import pytest
from helpers.configs import config_with

from stepper.kernels import parallel


def pytest_configure(config):
    # The tests run stepper as the command line does: its own splits across the cores, BLAS on one
    # thread (left with its own threads, OpenBLAS spins on the other core after every call and
    # fights the work that follows: tests/model ran 2x slower on 2 cores).
    parallel.single_threaded_blas()


@pytest.fixture
def make_config():
    return config_with
