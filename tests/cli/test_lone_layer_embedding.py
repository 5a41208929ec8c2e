"""A run of one layer on the prompt's tokens reads the embedding's rows, which the check of the
layer's own weights does not cover."""

import json

import pytest
from helpers.cli import refused, stepper


@pytest.mark.parametrize("model", ["tiny", "tiny-kimi-linear", "tiny-longcat"])
def test_a_lone_layer_run_checks_the_embedding_it_reads(tmp_path, model):
    """A run of one layer reads the prompt's embedding rows without the globals' check: a vocab_size
    the embedding does not have is refused naming both shapes, not an IndexError."""
    folder = tmp_path / "ck"
    assert stepper("synth", "--model", model, "--out", folder).returncode == 0
    config = json.loads((folder / "config.json").read_text())
    rows, width = config["vocab_size"], config["hidden_size"]
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 5 * rows}))
    line = refused(stepper("run", "--model", folder, "--layer", "1", "--plain"))
    assert line.startswith(f"{folder}: model-00001-of-") and line.endswith(
        f"'model.embed_tokens.weight' has shape [{rows}, {width}], expected [{5 * rows}, {width}]")
