"""The remote cache under hostile conditions: links planted in the cache folder, a user's files
in it under `cache clear`, credentials in the URL, a server that trickles, a Content-Range total
of 2^60. Nothing outside the cache is written, nothing of the user's removed, no password shown
or stored, every failure one line."""

import base64
import json
from pathlib import Path

import numpy as np
import pytest
from helpers.cli import one_line, stepper
from helpers.remote_cache import cache_settings

from stepper.errors import StepperError
from stepper.seams.trace import Recorder
from stepper.session import RunSpec, run
from stepper.weights import remote
from stepper.weights.checkpoint import INDEX, Checkpoint
from stepper.weights.http_ranges import RangeClient

pytest.importorskip("huggingface_hub")

SPEC = RunSpec(model="", layer=1, ids=(5, 17, 3))
VICTIM = b"the user's own bytes, which no cache may write over\n" * 4


def output(weights) -> np.ndarray:
    rec = Recorder()
    run(SPEC, [rec], weights)
    return rec.tensors()["layers.1.output"]


def cache_folder(tmp_path: Path, url: str) -> Path:
    return tmp_path / "cache" / remote.resolve(url, 1.0).key


def first_shard(folder: Path) -> str:
    return min(set(json.loads((folder / INDEX).read_text())["weight_map"].values()))


def victim(tmp_path: Path) -> Path:
    path = tmp_path / "elsewhere" / "victim.bin"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(VICTIM)
    return path


def test_partial_files_planted_as_links_are_not_written_through(folder, server, tmp_path):
    url = f"{server.url}/ck/"
    target = victim(tmp_path)
    cached = cache_folder(tmp_path, url)
    (cached / ".stepper").mkdir(parents=True)
    shard = first_shard(folder)
    for planted in (cached / "config.json.partial", cached / ".stepper" / f"{shard}.partial",
                    cached / ".stepper" / f"{shard}.json.partial"):
        planted.symlink_to(target)
    got = output(remote.open_remote(url, cache_settings(tmp_path)))
    np.testing.assert_array_equal(got, output(Checkpoint(folder)))
    assert target.read_bytes() == VICTIM


@pytest.mark.parametrize(("planted", "said"), [
    ("shard", "is a link, not a file stepper cached"), ("config", "is a link, not a file stepper cached"),
    ("lock", "is a link; stepper does not write through links"), ("ledgers", "is a link, not a folder stepper made"),
])
def test_a_link_where_the_cache_keeps_a_file_is_refused_in_one_line_and_not_followed(folder, server, tmp_path, planted,
                                                                                      said):
    url = f"{server.url}/ck/"
    output(remote.open_remote(url, cache_settings(tmp_path)))  # a whole cache, then one of its files swapped for a link
    cached = cache_folder(tmp_path, url)
    target = victim(tmp_path)
    place = {"shard": cached / first_shard(folder), "config": cached / "config.json",
             "lock": cached / ".stepper" / "lock", "ledgers": cached / ".stepper"}[planted]
    if planted == "ledgers":
        (tmp_path / "elsewhere" / "ledgers").mkdir()
        for p in place.iterdir():
            p.unlink()
        place.rmdir()
        place.symlink_to(tmp_path / "elsewhere" / "ledgers")
    else:
        place.unlink()
        place.symlink_to(target)
    with pytest.raises(StepperError) as e:
        output(remote.open_remote(url, cache_settings(tmp_path)))
    assert "\n" not in str(e.value) and f"{place}: {said}" in str(e.value)
    assert target.read_bytes() == VICTIM and place.is_symlink()
    if planted == "ledgers":
        assert not any((tmp_path / "elsewhere" / "ledgers").iterdir())


def cache_cli(tmp_path: Path, *args: str, cache: Path | None = None):
    return stepper("cache", *args, env={"STEPPER_CACHE_DIR": str(cache or tmp_path / "cache")})


def test_cache_clear_removes_stepper_files_and_leaves_the_users_naming_them(folder, server, tmp_path):
    url = f"{server.url}/ck/"
    output(remote.open_remote(url, cache_settings(tmp_path)))
    cached = cache_folder(tmp_path, url)
    notes, beside = tmp_path / "cache" / "notes.txt", cached / "mine.txt"
    notes.write_text("my notes\n")
    beside.write_text("mine\n")
    out = cache_cli(tmp_path, "clear")
    assert out.returncode == 0, out.stderr
    assert notes.read_text() == "my notes\n" and beside.read_text() == "mine\n"
    left = sorted(str(p.relative_to(tmp_path / "cache")) for p in (tmp_path / "cache").rglob("*"))
    assert left == ["notes.txt", "url", str(cached.relative_to(tmp_path / "cache")),
                    str(beside.relative_to(tmp_path / "cache"))]
    assert out.stdout.splitlines()[-1] == (f"left {tmp_path / 'cache'}: it holds what stepper did not write "
                                           f"(notes.txt, {beside.relative_to(tmp_path / 'cache')})")


def test_cache_clear_leaves_a_config_or_index_the_user_changed_or_put_there(folder, server, tmp_path):
    """config.json and the index are the cache's only as it wrote them: one changed after the fetch,
    or put in the folder before it, is the user's and stays (named); the unchanged ones go."""
    url = f"{server.url}/ck/"
    output(remote.open_remote(url, cache_settings(tmp_path)))
    cached = cache_folder(tmp_path, url)
    assert (cached / ".stepper" / "config.json.written").is_file()
    edited = (cached / "config.json").read_text().replace("{", '{"note": "mine", ', 1)
    (cached / "config.json").write_text(edited)
    out = cache_cli(tmp_path, "clear")
    assert out.returncode == 0, out.stderr
    left = sorted(p.relative_to(cached) for p in cached.rglob("*"))
    assert left == [Path("config.json")] and (cached / "config.json").read_text() == edited
    assert out.stdout.splitlines()[-1].endswith(f"({cached.relative_to(tmp_path / 'cache') / 'config.json'})")
    # put there before the first fetch: used as the checkpoint's config, never written, so never removed
    output(remote.open_remote(url, cache_settings(tmp_path)))
    assert not (cached / ".stepper" / "config.json.written").exists()
    assert (cached / ".stepper" / f"{INDEX}.written").is_file()
    assert cache_cli(tmp_path, "clear").returncode == 0
    assert sorted(p.relative_to(cached) for p in cached.rglob("*")) == [Path("config.json")]


def test_cache_clear_of_one_part_removes_it_whole_when_only_stepper_wrote_there(folder, server, tmp_path):
    url = f"{server.url}/ck/"
    output(remote.open_remote(url, cache_settings(tmp_path)))
    (tmp_path / "cache" / "notes.txt").write_text("my notes\n")
    out = cache_cli(tmp_path, "clear", "url")
    assert out.returncode == 0 and out.stdout.count("\n") == 1, out.stdout
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["notes.txt"]
    (tmp_path / "cache" / "notes.txt").unlink()
    assert cache_cli(tmp_path, "clear").returncode == 0
    assert (tmp_path / "cache").is_dir()  # the cache folder itself stays: the user may have made it
    for outside in ("../", "/etc", "url/../..", "nothing"):
        refused = cache_cli(tmp_path, "clear", outside)
        assert (refused.returncode == 2 and refused.stderr.count("\n") == 1
                and "no such cached checkpoint" in refused.stderr)


def test_a_cache_folder_that_is_a_link_is_cleared_inside_and_the_link_left(folder, server, tmp_path):
    real = tmp_path / "real"
    link = tmp_path / "cache-link"
    real.mkdir()
    link.symlink_to(real)
    output(remote.open_remote(f"{server.url}/ck/", remote.Settings(link, 2**40, 5.0, pause=0.01)))
    (real / "notes.txt").write_text("my notes\n")
    out = cache_cli(tmp_path, "clear", cache=link)
    assert out.returncode == 0, out.stderr
    assert link.is_symlink() and sorted(p.name for p in real.iterdir()) == ["notes.txt"]
    inside = cache_cli(tmp_path, "clear", "url", cache=link)
    assert one_line(inside) == f"stepper: error: url: no such cached checkpoint in {link} (see stepper cache ls)"


def test_a_password_in_the_url_is_never_shown_nor_stored(folder, server, tmp_path):
    port = server.url.rsplit(":", 1)[1]
    url = f"http://reader:s3cret-pw@127.0.0.1:{port}/ck/"
    env = {"STEPPER_CACHE_DIR": str(tmp_path / "cache")}
    runs = [stepper("run", "--plain", "--model", url, "--layer", "1", "--only", "*k_pe", env=env),
            stepper("inspect", "--plain", url, env=env),
            stepper("cache", "ls", env=env),
            stepper("run", "--model", f"http://reader:s3cret-pw@127.0.0.1:{port}/nothing/", env=env)]
    assert [r.returncode for r in runs] == [0, 0, 0, 2], runs[0].stderr
    assert f"127.0.0.1:{port}/ck/" in runs[0].stdout  # the URL is shown, its credentials not
    for r in runs:
        assert "s3cret" not in r.stdout + r.stderr and "reader" not in r.stdout + r.stderr
    stored = list((tmp_path / "cache").rglob("*"))
    assert stored and not any("s3cret" in str(p) or "reader" in str(p) for p in stored)
    assert not any(b"s3cret" in p.read_bytes() for p in stored if p.is_file() and not p.is_symlink())
    sent = {h.get("authorization") for h in server.headers_seen}
    assert "Basic " + base64.b64encode(b"reader:s3cret-pw").decode() in sent  # the credentials do reach the server


def test_a_server_that_trickles_is_cut_off_in_one_line(folder, server, tmp_path):
    server.faults = ["trickle"]  # config.json, one byte every 0.2 s (about 4 minutes for the whole file)
    with pytest.raises(StepperError) as e:
        remote.open_remote(f"{server.url}/ck/", cache_settings(tmp_path, timeout=0.5))
    assert "\n" not in str(e.value) and "config.json: the whole file: the answer took over" in str(e.value)
    assert server.sent < (folder / "config.json").stat().st_size // 4


def test_a_trickling_server_through_the_command_line_is_exit_2(folder, server, tmp_path):
    server.faults = ["trickle"]
    out = stepper("inspect", f"{server.url}/ck/", env={"STEPPER_CACHE_DIR": str(tmp_path / "cache"),
                                                      "STEPPER_REMOTE_TIMEOUT": "0.5"})
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "given up" in out.stderr, out.stderr


def test_the_run_has_a_deadline_over_all_its_requests(server):
    client = RangeClient(timeout=5.0, run_seconds=0.0)
    with pytest.raises(StepperError, match="the run's remote reads took over 0 s together; given up"):
        client.whole(f"{server.url}/ck/config.json", 1 << 20)
    assert server.requests == []


def test_a_content_range_total_of_2_to_the_60_is_refused_without_a_file(folder, server, tmp_path):
    url = f"{server.url}/ck/"
    remote.open_remote(url, cache_settings(tmp_path))  # config and index cached, then a shard's first answer lies
    cached = cache_folder(tmp_path, url)
    shard = first_shard(folder)
    (cached / shard).unlink()
    server.faults = ["huge-total"]
    ckpt = remote.open_remote(url, cache_settings(tmp_path))
    assert "more than any checkpoint file" in ckpt.unreadable[shard] and "\n" not in ckpt.unreadable[shard]
    assert not (cached / shard).exists()


def test_a_server_that_trickles_its_headers_is_cut_off_in_one_line(folder, server, tmp_path):
    server.faults, server.trickle_seconds = ["trickle-headers"], 0.5  # over 40 s for the status line and headers
    with pytest.raises(StepperError) as e:  # each byte comes within the per-read timeout; the answer's deadline is 4 s
        remote.open_remote(f"{server.url}/ck/", cache_settings(tmp_path, timeout=2.0))
    assert "\n" not in str(e.value) and "config.json: the whole file: the answer took over" in str(e.value)
    assert 0 < server.head_sent < 60  # cut off near its deadline (about 8 bytes), long before the headers' end
    assert server.sent == 0


def test_a_password_in_a_url_given_to_the_api_is_not_kept_in_the_run(server, tmp_path, monkeypatch):
    import stepper as api

    monkeypatch.setenv("STEPPER_CACHE_DIR", str(tmp_path / "cache"))
    url = server.url.replace("http://", "http://reader:s3cret-pw@") + "/ck/"
    got = api.run(url, layer=1, keep="*k_pe")
    assert got.spec.model == f"{server.url}/ck/" and "s3cret" not in repr(got) + repr(got.spec)
    sent = {h.get("authorization") for h in server.headers_seen}
    assert "Basic " + base64.b64encode(b"reader:s3cret-pw").decode() in sent  # the credentials do reach the server


def test_over_its_limit_the_cache_drops_the_least_recently_used_checkpoint_but_not_a_link(folder, server, tmp_path):
    older, newer = f"{server.url}/ck/", f"{server.url}/org/ck/resolve/main/"  # the same files under two URLs
    output(remote.open_remote(older, cache_settings(tmp_path)))
    shards = sorted(set(json.loads((folder / INDEX).read_text())["weight_map"].values()))
    kept = cache_folder(tmp_path, older)
    assert all((kept / shard).is_file() for shard in shards)
    target = victim(tmp_path)
    (kept / shards[0]).unlink()
    (kept / shards[0]).symlink_to(target)  # its ledger stays: a link where a cached file was
    small = remote.Settings(tmp_path / "cache", 1, 5.0, pause=0.01)
    got = output(remote.open_remote(newer, small))
    np.testing.assert_array_equal(got, output(Checkpoint(folder)))
    # the older copy's files gone
    assert [s for s in shards if (kept / s).exists() and not (kept / s).is_symlink()] == []
    assert (kept / shards[0]).is_symlink() and target.read_bytes() == VICTIM
    assert all((cache_folder(tmp_path, newer) / shard).is_file() for shard in shards)


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "lots"])
def test_a_cache_limit_that_is_no_size_is_one_line(value, tmp_path):
    env = {"STEPPER_CACHE_DIR": str(tmp_path / "cache"), "STEPPER_CACHE_MAX_GB": value}
    assert one_line(stepper("cache", "ls", env=env)) == \
        f"stepper: error: STEPPER_CACHE_MAX_GB must be a number of GiB above 0, got {value!r}"
    env["STEPPER_CACHE_MAX_GB"] = None
    if value != "lots":  # the option's own type check words that one
        said = one_line(stepper("--cache-max-gb", value, "cache", "ls", env=env))
        assert said.startswith("stepper: error: --cache-max-gb must be a number of GiB above 0, got "), said


@pytest.mark.parametrize(("url", "why"), [("http://reader:s3cret-pw@[bad/", "Invalid IPv6 URL"),
                                          ("http://reader:s3cret-pw@127.0.0.1:99999/ck/", "Port out of range 0-65535")])
def test_a_malformed_url_is_one_line_without_its_password(url, why, tmp_path):
    import stepper as api

    shown = url.replace("reader:s3cret-pw@", "***@")
    for args, option in ((("run", "--model", url), "--model "), (("inspect", url), "")):
        assert one_line(stepper(*args, env={"STEPPER_CACHE_DIR": str(tmp_path / "cache")})) == \
            f"stepper: error: {option}{shown}: not a URL ({why}) (see stepper {args[0]} --help)"
    with pytest.raises(StepperError) as e:
        api.run(url)
    assert str(e.value) == f"{shown}: not a URL ({why})"


@pytest.mark.parametrize("url", ["https://", "http://", "https:///ck/", "https://reader:s3cret-pw@/ck/", "http://:8080/"])
def test_a_url_naming_no_host_is_refused_before_any_request(url, tmp_path, monkeypatch):
    """No request can reach a URL without a host: it was tried and retried (15-18 s) before the
    refusal "could not connect"; now it is refused before any request is made."""
    import stepper as api
    from stepper.weights import remote

    monkeypatch.setattr(remote, "resolve", lambda *a, **k: pytest.fail(f"{url} was resolved"))
    shown = url.replace("reader:s3cret-pw@", "***@")
    said = one_line(stepper("run", "--model", url, env={"STEPPER_CACHE_DIR": str(tmp_path / "cache")}))
    assert said == (f"stepper: error: --model {shown}: not a URL (it names no host); "
                    "expected https://HOST/PATH/ (see stepper run --help)")
    with pytest.raises(StepperError, match="it names no host"):
        api.run(url)


def test_a_hub_that_trickles_its_answer_on_a_revision_is_cut_off_in_one_line(server, tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", server.url)  # as HF_ENDPOINT sets it when the Hub's library loads
    server.api_fault, server.trickle_seconds = "trickle-headers", 0.5  # over 40 s for the status line and headers
    with pytest.raises(StepperError) as e:  # each byte comes within the per-read timeout; the answer's deadline is 4 s
        remote.open_remote("hf://org/ck", cache_settings(tmp_path, timeout=2.0))
    assert str(e.value) == "hf://org/ck: cannot resolve revision 'main' on the Hub (no answer within 4 s; given up)"
    assert 0 < server.head_sent < 60  # cut off near its deadline (about 8 bytes), long before the headers' end
