"""Remote checkpoints: a synthetic checkpoint served by a local HTTP server (127.0.0.1) with
range requests, also as a Hub endpoint. A remote run equals the local one tensor for tensor; the
server sends only the headers and the bytes of the tensors read; a second run asks it for nothing;
faults are recovered or reported in one line, and nothing wrong is computed from."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.range_server import COMMIT
from helpers.remote_cache import cache_settings

from stepper.errors import StepperError
from stepper.presets import preset
from stepper.seams.trace import Recorder
from stepper.session import RunSpec, run
from stepper.weights import remote
from stepper.weights.checkpoint import SCALE, Checkpoint
from stepper.weights.names import EMBED, global_shapes, layer_shapes

pytest.importorskip("huggingface_hub")

IDS = (5, 17, 3)
SPEC = RunSpec(model="", layer=1, ids=IDS, start_pos=4100, decode=1)


def tensors(spec: RunSpec, weights) -> dict[str, np.ndarray]:
    rec = Recorder()
    run(spec, [rec], weights)
    return rec.tensors()


def opened(url: str, tmp_path: Path, **kw) -> remote.RemoteCheckpoint:
    return remote.open_remote(url, cache_settings(tmp_path, **kw))


def expected_bytes(folder: Path, layers: list[int], with_globals: bool, rows: int) -> int:
    """What a run must fetch, from the local checkpoint's own headers: config and index whole,
    each shard's 8 + header bytes, each tensor read (and its scales), the embedding's rows only."""
    local = Checkpoint(folder)
    total = (folder / "config.json").stat().st_size + (folder / "model.safetensors.index.json").stat().st_size
    total += sum(shard.header_size for shard in local.shards.values())
    cfg = local.config
    names = [n for layer in layers for n in layer_shapes(cfg, layer)]
    names += [n for n in global_shapes(cfg) if n != EMBED] if with_globals else []
    for name in names:
        for n in (name, name + SCALE):
            if n in local.weight_map:
                start, end = local.shard_of(n).data_range(n)
                total += end - start
    info = local.shard_of(EMBED).info(EMBED)
    return total + rows * info.nbytes // info.shape[0]
    return total


def test_a_remote_layer_equals_the_local_one_and_reads_only_its_bytes(folder, server, tmp_path):
    url = f"{server.url}/ck/"
    ours = tensors(SPEC, opened(url, tmp_path))
    want = tensors(SPEC, Checkpoint(folder))
    assert list(ours) == list(want)
    for name in want:
        np.testing.assert_array_equal(ours[name], want[name], err_msg=name)
    assert server.sent == expected_bytes(folder, [1], with_globals=False,
                                         rows=4)  # the layer's input: 3 + 1 embedding rows
    server.reset_counts()
    again = tensors(SPEC, opened(url, tmp_path))
    assert server.requests == [] and server.sent == 0  # a second run reads nothing remote
    np.testing.assert_array_equal(again["decode0.layers.1.output"], want["decode0.layers.1.output"])


def test_a_whole_model_reads_the_embedding_rows_of_its_prompt_only(folder, server, tmp_path):
    spec = RunSpec(model="", ids=IDS, decode=1)
    ours = opened(f"{server.url}/ck", tmp_path)
    got = tensors(spec, ours)
    want = tensors(spec, Checkpoint(folder))
    np.testing.assert_array_equal(got["decode0.logits"], want["decode0.logits"])
    generated = int(np.argmax(want["prefill.logits"][0, -1]))
    layers = list(range(preset("tiny").num_hidden_layers))
    assert server.sent == expected_bytes(folder, layers, with_globals=True, rows=len({*IDS, generated}))


def test_the_hub_revision_is_resolved_once_to_a_commit(folder, server, tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", server.url)  # as HF_ENDPOINT sets them when the Hub's library loads
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        server.url + "/{repo_id}/resolve/{revision}/{filename}")
    ckpt = opened("hf://org/ck", tmp_path)
    assert ckpt.label == f"hf://org/ck@{COMMIT[:12]}" and COMMIT in str(ckpt.path)
    paths = [path for path, _ in server.requests]
    assert "/api/models/org/ck/revision/main" in paths
    assert all(path.startswith(f"/org/ck/resolve/{COMMIT}/") for path in paths if not path.startswith("/api/"))
    got = tensors(SPEC, ckpt)
    np.testing.assert_array_equal(got["prefill.layers.1.output"],
                                  tensors(SPEC, Checkpoint(folder))["prefill.layers.1.output"])
    server.reset_counts()
    opened(f"hf://org/ck@{COMMIT}", tmp_path)  # a commit: no resolving, nothing fetched
    assert [path for path, _ in server.requests if not path.startswith("/api/agent")] == []


def test_offline_a_branch_that_cannot_be_resolved_names_the_cached_commit(folder, server, tmp_path, monkeypatch):
    """A second run of hf://ORG/NAME asks the Hub for its branch's commit: offline, that fails, and
    the one line says which commit the cache holds, which runs from the cache alone."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", server.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        server.url + "/{repo_id}/resolve/{revision}/{filename}")
    tensors(SPEC, opened("hf://org/ck", tmp_path))
    with socket.socket() as closed:  # a port nothing listens on: the Hub unreachable
        closed.bind(("127.0.0.1", 0))
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{closed.getsockname()[1]}")
        with pytest.raises(StepperError) as offline:
            opened("hf://org/ck", tmp_path)
    said = str(offline.value)
    assert said.startswith("hf://org/ck: cannot resolve revision 'main' on the Hub (") and "\n" not in said
    assert said.endswith(f"; the cache holds what runs fetched of hf://org/ck@{COMMIT}: name that commit to run "
                         "from it")
    server.reset_counts()
    tensors(SPEC, opened(f"hf://org/ck@{COMMIT}", tmp_path))
    assert server.requests == []
    with pytest.raises(StepperError) as never_fetched:
        opened("hf://org/other", tmp_path)
    assert "the cache holds" not in str(never_fetched.value)


@pytest.mark.parametrize("fault", ["500", "503", "429", "drop", "short", "bad-range", "stall"])
def test_a_transient_fault_is_retried_and_nothing_wrong_is_kept(folder, server, tmp_path, fault):
    server.faults = [fault]
    ckpt = remote.open_remote(f"{server.url}/ck/", cache_settings(tmp_path, timeout=1.0))
    got = tensors(SPEC, ckpt)
    np.testing.assert_array_equal(got["decode0.layers.1.output"],
                                  tensors(SPEC, Checkpoint(folder))["decode0.layers.1.output"])
    assert server.faults == []


def test_a_fault_that_persists_is_one_line_naming_the_file_and_range(folder, server, tmp_path):
    url = f"{server.url}/ck/"
    remote.open_remote(url, cache_settings(tmp_path))  # headers cached
    server.faults = ["500"] * 20
    ckpt = remote.open_remote(url, cache_settings(tmp_path))
    with pytest.raises(StepperError) as e:
        tensors(SPEC, ckpt)
    message = str(e.value)
    assert ("\n" not in message and ".safetensors: bytes " in message
            and "the server answered 500 (after 5 tries)" in message)


def test_a_file_changed_on_the_server_between_reads_is_refused(folder, server, tmp_path):
    ckpt = remote.open_remote(f"{server.url}/ck/", cache_settings(tmp_path))
    server.etag_suffix = "-new"
    with pytest.raises(StepperError, match="the file changed on the server between two reads"):
        tensors(SPEC, ckpt)


def test_a_corrupted_cache_range_is_fetched_again(folder, server, tmp_path):
    url = f"{server.url}/ck/"
    want = tensors(SPEC, Checkpoint(folder))
    tensors(SPEC, opened(url, tmp_path))
    ckpt = opened(url, tmp_path)
    name = "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"
    shard = ckpt.shard_of(name)
    start, _ = shard.data_range(name)
    fd = os.open(shard.path, os.O_WRONLY)  # a flipped byte, the file's times kept as a disk fault would
    st = os.stat(shard.path)
    os.pwrite(fd, bytes([os.pread(os.open(shard.path, os.O_RDONLY), 1, start)[0] ^ 0xFF]), start)
    os.close(fd)
    os.utime(shard.path, ns=(st.st_atime_ns, st.st_mtime_ns))
    server.reset_counts()
    got = tensors(SPEC, ckpt)
    assert ckpt.transfer.repaired >= 1 and server.sent > 0
    np.testing.assert_array_equal(got["decode0.layers.1.output"], want["decode0.layers.1.output"])


def test_the_command_line_runs_and_inspects_a_remote_checkpoint(folder, server, tmp_path):
    env = {**os.environ, "STEPPER_CACHE_DIR": str(tmp_path / "cache"), "HF_TOKEN": "hf_secret_token_value"}

    def stepper(*args):
        return subprocess.run([sys.executable, "-m", "stepper", *args], capture_output=True, text=True, env=env,
                              timeout=120, check=False)

    listed = stepper("inspect", "--plain", f"{server.url}/ck/")
    assert listed.returncode == 0, listed.stderr
    assert "mlp.experts.{0..31}.up_proj.weight" in listed.stdout and "listed from the headers alone" in listed.stdout
    headers_only = server.sent
    done = stepper("run", "--plain", "--model", f"{server.url}/ck/", "--layer", "1", "--only", "*k_pe")
    assert done.returncode == 0, done.stderr
    assert "layers.1.self_attn.k_pe" in done.stdout and server.sent > headers_only
    env["HF_ENDPOINT"] = server.url  # the Hub's paths on the same server
    hub = stepper("run", "--plain", "--model", "hf://org/ck", "--layer", "1", "--only", "*k_pe")
    assert hub.returncode == 0, hub.stderr
    # the same tensor, only the footer's cache note differs
    hub_rows = hub.stdout.split("layers.1.self_attn.k_pe", 1)[1]
    local_rows = done.stdout.split("layers.1.self_attn.k_pe", 1)[1]
    assert hub_rows == local_rows.replace(done.stdout.rsplit(" · ", 1)[1], hub.stdout.rsplit(" · ", 1)[1])
    authorized = [h for h in server.headers_seen if h.get("authorization")]
    assert authorized and all(h["authorization"] == "Bearer hf_secret_token_value" for h in authorized)
    shown = stepper("cache", "ls")
    assert shown.returncode == 0 and "127.0.0.1" in shown.stdout
    missing = stepper("run", "--model", f"{server.url}/nothing-here/")
    assert (missing.returncode == 2 and missing.stderr.count("\n") == 1
            and "config.json: no such file (404)" in missing.stderr)
    for out in (listed, done, hub, shown, missing):
        assert "hf_secret_token_value" not in out.stdout + out.stderr
    cleared = stepper("cache", "clear")
    assert cleared.returncode == 0 and not any((tmp_path / "cache").rglob("*.safetensors"))


def test_a_long_range_is_fetched_in_bounded_requests_straight_into_the_file(folder, server, tmp_path, monkeypatch):
    """No request asks for more than REQUEST_BYTES, and the bytes arrive into the file, not memory."""
    from stepper.weights import fetch_cache

    monkeypatch.setattr(fetch_cache, "REQUEST_BYTES", 1 << 16)
    got = tensors(SPEC, opened(f"{server.url}/ck/", tmp_path))
    asked = [tuple(map(int, r.removeprefix("bytes=").split("-"))) for _, r in server.requests if r]
    data = [(a, b) for a, b in asked if a not in (0, 8)]  # (a header is read whole, as the reader holds it)
    assert len(data) > 10 and max(b - a + 1 for a, b in data) == 1 << 16
    np.testing.assert_array_equal(got["decode0.layers.1.output"],
                                  tensors(SPEC, Checkpoint(folder))["decode0.layers.1.output"])
