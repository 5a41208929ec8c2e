"""A run of one layer: on the prompt's tokens it reads the embedding's rows, which the check of the
layer's own weights does not cover; on an --input file, that file's one tensor."""

import json

import numpy as np
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


def test_an_input_of_another_format_or_no_positions_is_named_as_such(tmp_path):
    """--input takes a safetensors file (a --dump): a NumPy or zip file is named for what it is, not
    for the header length its first bytes would be; a tensor of no positions says so."""
    import numpy as np
    from safetensors.numpy import save_file

    np.save(tmp_path / "x.npy", np.zeros((1, 3, 320), np.float32))
    np.savez(tmp_path / "x.npz", x=np.zeros((1, 3, 320), np.float32))
    save_file({"x": np.zeros((1, 0, 320), np.float32)}, str(tmp_path / "empty.safetensors"))
    run = ("run", "--layer", "1", "--plain", "--input")
    assert refused(stepper(*run, tmp_path / "x.npy")) == (
        f"{tmp_path / 'x.npy'}: a NumPy .npy file, not a safetensors file")
    assert refused(stepper(*run, tmp_path / "x.npz")) == (
        f"{tmp_path / 'x.npz'}: a zip archive (NumPy's .npz or a PyTorch checkpoint), not a safetensors file")
    assert refused(stepper(*run, tmp_path / "empty.safetensors")) == (
        f"{tmp_path / 'empty.safetensors'}: tensor 'x' has shape [1, 0, 320], expected [B, T, 320] with at least "
        "one position (T)")


@pytest.mark.parametrize("dtype, stored", [(np.int64, "I64"), (np.bool_, "BOOL"), (np.int32, "I32")])
def test_an_input_that_is_no_float_stream_is_refused_naming_its_dtype(tmp_path, dtype, stored):
    """An I64 or BOOL residual stream was taken as the numbers its values are, exit 0."""
    from safetensors.numpy import save_file

    path = tmp_path / "in.safetensors"
    save_file({"layers.1.hidden_states": np.ones((1, 3, 320), dtype)}, str(path))
    assert refused(stepper("run", "--layer", "1", "--plain", "--input", path)) == (
        f"{path}: tensor 'layers.1.hidden_states' is {stored}, expected F32, BF16, F16, F64, F8_E4M3, F8_E5M2")


def test_an_input_tensor_s_name_of_100_000_characters_is_shown_cut(tmp_path):
    """The one tensor of an --input file is named in a refusal by its first 60 characters: a name of
    100,000 made a line of 100,000."""
    from safetensors.numpy import save_file

    long, path = "x" * 100_000, tmp_path / "in.safetensors"
    save_file({long: np.ones((1, 3, 33), np.float32)}, str(path))
    assert refused(stepper("run", "--layer", "1", "--plain", "--input", path)) == (
        f"{path}: tensor '{'x' * 60}...' has shape [1, 3, 33], expected [B, T, 320]")
    save_file({long: np.ones((1, 3, 320), np.int32)}, str(path))
    assert refused(stepper("run", "--layer", "1", "--plain", "--input", path)) == (
        f"{path}: tensor '{'x' * 60}...' is I32, expected F32, BF16, F16, F64, F8_E4M3, F8_E5M2")


def test_a_dump_of_the_layers_before_feeds_the_next_layer(tmp_path):
    """A dump of layers 0..0 holds layers.0.output, which is layer 1's input (the residual stream):
    --layer 1 --input takes it, and its output is the whole run's, bit for bit."""
    dump = tmp_path / "d0.safetensors"
    assert stepper("run", "--layers", "0:1", "--dump", dump, "--only", "layers.0.*").returncode == 0  # many tensors
    alone = stepper("run", "--layer", "1", "--input", dump, "--json", "--only", "layers.1.output")
    whole = stepper("run", "--layers", "0:2", "--json", "--only", "layers.1.output")
    assert alone.returncode == whole.returncode == 0, alone.stderr + whole.stderr
    assert json.loads(alone.stdout)["stats"] == json.loads(whole.stdout)["stats"]
