"""`stepper fp8 --weight NAME --model URL` on a remote DeepSeek-V4 checkpoint (the local range
server, 127.0.0.1): the FP4 group or FP8 block equals the local folder's, and the server sends
only config.json, the index, the shard headers, the weight's scales and the rows shown; bad input
is one line, exit 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.cli import one_line, stepper
from helpers.range_server import RangeServer

from stepper.presets import V4_PRESETS
from stepper.weights.checkpoint import INDEX
from stepper.weights.published import PublishedCheckpoint, scale_of

pytest.importorskip("huggingface_hub")

EXPERT = "layers.1.ffn.experts.0.w1.weight"  # FP4 [32, 64]: 32 bytes a row
WQ_B = "layers.1.attn.wq_b.weight"  # FP8 [256, 32] with 8 heads: two block rows of 128


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Path:
    """ck/: tiny-v4 with 8 heads (an FP8 weight of two block rows), seed 3; miss/: its layer-1 shard gone."""
    root = tmp_path_factory.mktemp("served")
    config = root / "config.json"
    config.write_text(json.dumps({**V4_PRESETS["tiny-v4"], "num_attention_heads": 8}))
    done = stepper("synth", "--model", config, "--out", root / "ck", "--seed", 3)
    assert done.returncode == 0, done.stderr
    shutil.copytree(root / "ck", root / "miss")
    (root / "miss" / PublishedCheckpoint(root / "ck").weight_map[EXPERT]).unlink()
    return root


@pytest.fixture
def server(served):
    with RangeServer(served) as s:
        yield s


def headers_bytes(folder: Path) -> int:
    """config.json and the index whole, and each shard's 8 + header bytes."""
    local = PublishedCheckpoint(folder)
    total = (folder / "config.json").stat().st_size + (folder / INDEX).stat().st_size
    return total + sum(shard.header_size for shard in local.shards.values())


def tensor_bytes(folder: Path, name: str) -> tuple[int, int]:
    """A tensor's bytes in its shard, and one row's."""
    local = PublishedCheckpoint(folder)
    info = local.shard_of(name).info(name)
    return info.nbytes, info.nbytes // info.shape[0]


def shown(args, model, env) -> tuple[dict, str]:
    """The --json record without its source, and the text view with the source's name taken out."""
    record = json.loads(stepper("fp8", "--weight", *args, "--model", model, "--json", env=env).stdout)
    text = stepper("fp8", "--weight", *args, "--model", model, env={**env, "COLUMNS": "200"})
    assert text.returncode == 0, text.stderr
    assert record.pop("source") == f"checkpoint {model}"
    return record, text.stdout.replace(str(model), "MODEL")


@pytest.mark.parametrize(("name", "block", "rows"), [(EXPERT, "3,1", 1), (WQ_B, "1,0", 128)])
def test_a_remote_weight_equals_the_local_one_fetching_its_scales_and_rows_only(served, server, tmp_path, name,
                                                                                 block, rows):
    env = {"STEPPER_CACHE_DIR": str(tmp_path / "cache")}
    url = f"{server.url}/ck/"
    remote_json = json.loads(stepper("fp8", "--weight", name, "--model", url, "--block", block, "--json",
                                     env=env).stdout)
    nbytes, row = tensor_bytes(served / "ck", name)
    scales, _ = tensor_bytes(served / "ck", scale_of(name))
    assert server.sent == headers_bytes(served / "ck") + scales + rows * row  # the shown rows and the scales only
    assert rows * row < nbytes
    assert remote_json["source"] == f"checkpoint {url}"
    ours = shown((name, "--block", block), url, env)
    assert ours == shown((name, "--block", block), served / "ck", env)  # the local folder's, but for its name
    if name == WQ_B:
        assert (ours[0]["scale_grid"], ours[0]["block"]) == ([2, 1], [1, 0])
    else:
        assert (ours[0]["dtype"], ours[0]["row"], ours[0]["inputs"]) == ("FP4", 3, [32, 64])


def test_a_remote_weight_then_a_run_reads_the_rest_of_it(served, server, tmp_path):
    env = {"STEPPER_CACHE_DIR": str(tmp_path / "cache")}
    url = f"{server.url}/ck/"
    assert stepper("fp8", "--weight", WQ_B, "--model", url, "--block", "1,0", env=env).returncode == 0
    args = ("run", "--plain", "--decode", "1", "--layer", "1", "--only", "*layers.1.attn.q")
    remote_run, local_run = stepper(*args, "--model", url, env=env), stepper(*args, "--model", served / "ck", env=env)
    assert remote_run.returncode == 0, remote_run.stderr  # the rows not fetched before are fetched, not read as zeros
    body = remote_run.stdout.split("\n", 1)[1]
    assert body.rsplit(" · ", 1)[0] == local_run.stdout.split("\n", 1)[1].rstrip("\n") and "layers.1.attn.q" in body


def test_bad_input_on_a_remote_checkpoint_is_one_line(served, server, tmp_path):
    env = {"STEPPER_CACHE_DIR": str(tmp_path / "cache")}
    url = f"{server.url}/ck/"
    line = one_line(stepper("fp8", "--weight", "layers.1.ffn.experts.0.w9.weight", "--model", url, env=env))
    assert line == (f"stepper: error: checkpoint {url}: no tensor named 'layers.1.ffn.experts.0.w9.weight' "
                    "(DeepSeek-V4's published names, e.g. layers.1.ffn.experts.0.w1.weight)")
    assert server.sent == headers_bytes(served / "ck")  # nothing but the headers
    line = one_line(stepper("fp8", "--weight", WQ_B, "--model", url, "--block", "2,0", env=env))
    assert line.endswith(f"--block 2,0 is outside '{WQ_B}': F8_E4M3 [256, 32] has a 2x1 grid of 128x128 blocks "
                         "(rows 0..1, columns 0..0)")
    assert server.sent == headers_bytes(served / "ck") + tensor_bytes(served / "ck", scale_of(WQ_B))[0]  # no rows
    line = one_line(stepper("fp8", "--weight", EXPERT, "--model", f"{server.url}/miss/", env=env))
    shard = PublishedCheckpoint(served / "ck").weight_map[EXPERT]
    assert f"{shard} cannot be read (" in line and "404" in line and EXPERT in line
