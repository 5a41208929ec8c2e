"""Fixtures of the remote-checkpoint tests: a synthetic checkpoint served by a local range server."""

from pathlib import Path

import pytest
from helpers.range_server import RangeServer

from stepper.presets import preset
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.synth_checkpoint import synth_checkpoint


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A tiny checkpoint (seed 3) written once per module, served as /ck/."""
    return synth_checkpoint(SyntheticWeights(preset("tiny"), seed=3), tmp_path_factory.mktemp("served") / "ck")


@pytest.fixture
def server(folder):
    with RangeServer(folder.parent) as s:
        yield s
