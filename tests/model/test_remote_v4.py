"""Remote DeepSeek-V4 checkpoints in the published layout: a tiny-v4 checkpoint `synth` writes,
served by the local range server (127.0.0.1). A remote run equals the local one tensor for
tensor and the server sends only config.json, the index, the shard headers, the tensors the run
checks with their `.scale` grids and the embedding rows of its tokens (never the `mtp.*` block); a
second run asks it for nothing; `inspect` and `run` take the URL; a missing shard or a truncated
header is one line, exit 2."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers.cli import one_line, stepper
from helpers.range_server import RangeServer
from helpers.remote_cache import cache_settings

from stepper.families.deepseek_v4_checkpoint import V4Checkpoint
from stepper.seams.trace import Recorder
from stepper.session import RunSpec, run
from stepper.weights import remote
from stepper.weights.checkpoint import INDEX
from stepper.weights.published import PublishedCheckpoint, scale_of

pytest.importorskip("huggingface_hub")

PROMPT = (5, 17, 3, 200, 17, 9, 41, 120, 7)
DECODE = 2


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Path:
    """The folder the server serves: ck/ (tiny-v4, seed 3), miss/ (a layer's shard gone), trunc/
    (a shard's header cut short)."""
    root = tmp_path_factory.mktemp("served")
    done = stepper("synth", "--model", "tiny-v4", "--out", root / "ck", "--seed", 3)
    assert done.returncode == 0, done.stderr
    shutil.copytree(root / "ck", root / "miss")
    (root / "miss" / "model-00003-of-00007.safetensors").unlink()
    shutil.copytree(root / "ck", root / "trunc")
    cut = root / "trunc" / "model-00004-of-00007.safetensors"
    data = cut.read_bytes()
    cut.write_bytes(data[: 8 + int.from_bytes(data[:8], "little") // 2])
    return root


@pytest.fixture
def server(served):
    with RangeServer(served) as s:
        yield s


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(remote, "_chosen", cache_settings(tmp_path))
    return tmp_path / "cache"


def tensors(weights, layer: int | None = None) -> tuple[dict[str, np.ndarray], tuple[int, ...]]:
    """Every named tensor of a run over PROMPT and DECODE steps (the whole model, or one layer
    alone), and the tokens generated."""
    rec = Recorder()
    result = run(RunSpec(model="", layer=layer, ids=PROMPT, decode=DECODE), [rec], weights)
    return rec.tensors(), result.generated


def headers_bytes(folder: Path) -> int:
    """config.json and the index whole, and each shard's 8 + header bytes."""
    local = PublishedCheckpoint(folder)
    total = (folder / "config.json").stat().st_size + (folder / INDEX).stat().st_size
    return total + sum(shard.header_size for shard in local.shards.values())


def expected_bytes(folder: Path, rows: int, layer: int | None = None) -> int:
    """What a run must fetch, from the local checkpoint's own headers: config.json and the index
    whole, each shard's 8 + header bytes, every tensor outside `mtp.*` with its scales (of `layer`
    alone, when given) but the embedding, and `rows` rows of the embedding."""
    local = PublishedCheckpoint(folder)
    total = headers_bytes(folder)
    layers = range(local.layers) if layer is None else [layer]
    for name in local.required(layers, with_globals=layer is None):
        for n in (name, scale_of(name)):
            if n != "embed.weight" and n in local.weight_map:
                start, end = local.shard_of(n).data_range(n)
                total += end - start
    info = local.shard_of("embed.weight").info("embed.weight")
    return total + rows * info.nbytes // info.shape[0]


def test_a_remote_run_equals_the_local_one_and_reads_only_its_bytes(served, server, cache):
    want, generated = tensors(V4Checkpoint(served / "ck"))
    ours, again = tensors(V4Checkpoint(f"{server.url}/ck/"))
    assert again == generated and list(ours) == list(want)
    for name in want:
        np.testing.assert_array_equal(ours[name], want[name], err_msg=name)
    assert PublishedCheckpoint(served / "ck").unused  # the mtp.* block, which the server never sends
    assert server.sent == expected_bytes(served / "ck", rows=len({*PROMPT, *generated}))
    server.reset_counts()
    tensors(V4Checkpoint(f"{server.url}/ck/"))
    assert server.requests == [] and server.sent == 0  # a second run reads nothing remote


def test_a_remote_layer_alone_fetches_that_layer_and_its_embedding_rows_only(served, server, cache):
    want, generated = tensors(V4Checkpoint(served / "ck"), layer=2)
    ours, _ = tensors(V4Checkpoint(f"{server.url}/ck/"), layer=2)
    assert list(ours) == list(want) and any(".layers.2.attn.compressor.entries" in n for n in want)
    for name in want:
        np.testing.assert_array_equal(ours[name], want[name], err_msg=name)
    assert server.sent == expected_bytes(served / "ck", rows=len({*PROMPT, *generated}), layer=2)
    assert server.sent < expected_bytes(served / "ck", rows=len({*PROMPT, *generated})) / 2  # of the whole model


def test_the_command_line_inspects_and_runs_a_remote_checkpoint(served, server, tmp_path, monkeypatch):
    env = {"STEPPER_CACHE_DIR": str(tmp_path / "cache")}
    listed = stepper("inspect", "--plain", f"{server.url}/ck/", env=env)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith(f"checkpoint {server.url}/ck/ · deepseek_v4 (published layout), 4 layers")
    local = stepper("inspect", "--plain", served / "ck", env=env).stdout.splitlines()
    lines = listed.stdout.splitlines()  # the local listing, but for the title and a last line saying how it was read
    assert lines[1:-1] == local[1:] and "ffn.experts.{0..15}.w1.weight         FP4" in listed.stdout
    assert lines[-1] == "listed from the headers alone: scale values are read by a run"
    headers = server.sent
    assert headers == headers_bytes(served / "ck")  # no tensor's bytes
    args = ("run", "--plain", "--decode", "1", "--only", "*layers.1.attn.*")
    remote_run = stepper(*args, "--model", f"{server.url}/ck/", env=env)
    local_run = stepper(*args, "--model", served / "ck", env=env)
    assert remote_run.returncode == 0, remote_run.stderr
    assert server.sent > headers
    body = remote_run.stdout.split("\n", 1)[1]  # after the header, which names where the weights are
    assert f"weights from {server.url}/ck" in remote_run.stdout
    assert body.rsplit(" · ", 1)[0] == local_run.stdout.split("\n", 1)[1].rstrip("\n") and "layers.1.attn.q" in body
    from huggingface_hub import constants

    # the Hub's paths on the same server, as HF_ENDPOINT sets them when the Hub's library loads
    monkeypatch.setattr(constants, "ENDPOINT", server.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        server.url + "/{repo_id}/resolve/{revision}/{filename}")
    hub = stepper(*args, "--model", "hf://org/ck", env=env)
    assert hub.returncode == 0, hub.stderr
    assert "weights from hf://org/ck ·" in hub.stdout
    assert hub.stdout.split("\n", 1)[1].rsplit(" · ", 1)[0] == body.rsplit(" · ", 1)[0]  # but the cache note
    assert "fetched" in body.rsplit(" · ", 1)[1] and "from the cache" in hub.stdout.rsplit(" · ", 1)[1]


@pytest.mark.parametrize(("folder", "shard", "why"), [
    ("miss", "model-00003-of-00007.safetensors", "the server answered 404"),
    ("trunc", "model-00004-of-00007.safetensors", "header length"),
])
def test_an_unreadable_remote_shard_is_one_line(served, server, tmp_path, folder, shard, why):
    env = {"STEPPER_CACHE_DIR": str(tmp_path / "cache")}
    line = one_line(stepper("run", "--plain", "--model", f"{server.url}/{folder}/", env=env))
    assert f"{server.url}/{folder}/{shard} cannot be read ({why}" in line and "first 'layers." in line
    listed = stepper("inspect", "--plain", f"{server.url}/{folder}/", env=env)
    assert f"{shard} cannot be read ({why}" in listed.stdout
    other = stepper("run", "--plain", "--model", f"{server.url}/{folder}/", "--layer", "0", env=env)
    assert other.returncode == 0, other.stderr  # a layer whose tensors are all in other shards runs


def test_a_remote_folder_without_an_index_or_single_file_is_one_line(served, server, tmp_path):
    folder = served / "noindex"
    if not folder.exists():
        shutil.copytree(served / "ck", folder)
        (folder / INDEX).unlink()
    env = {"STEPPER_CACHE_DIR": str(tmp_path / "cache")}
    line = one_line(stepper("run", "--plain", "--model", f"{server.url}/noindex/", env=env))
    assert f"{server.url}/noindex/{INDEX}: no such file, and {server.url}/noindex/model.safetensors" in line
