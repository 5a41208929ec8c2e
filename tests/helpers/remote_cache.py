"""The cache the remote tests open checkpoints through: under the test's own folder, with short
pauses between retries."""

from __future__ import annotations

from pathlib import Path

from stepper.weights import remote


def cache_settings(tmp_path: Path, timeout: float = 5.0) -> remote.Settings:
    return remote.Settings(tmp_path / "cache", 2**40, timeout, pause=0.01)
