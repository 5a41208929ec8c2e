"""Shared fixtures. The helpers the tests share live in tests/helpers/ (importable as `helpers`:
pytest puts this folder on sys.path)."""

import pytest
from helpers.configs import config_with


@pytest.fixture
def make_config():
    return config_with
