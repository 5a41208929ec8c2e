"""stepper.files, the one writer: no link followed, nothing replaced that was not asked for,
temporary files made exclusively and never left behind."""

from __future__ import annotations

import os

import pytest

from stepper import files
from stepper.errors import StepperError

MINE = b"the user's bytes\n"


def user_file(tmp_path, name="mine.txt"):
    path = tmp_path / name
    path.write_bytes(MINE)
    return path


def test_a_new_file_is_never_made_through_a_link_even_a_dangling_one(tmp_path):
    target = user_file(tmp_path)
    for name, points_at in (("link", target), ("dangling", tmp_path / "nothing-yet")):
        (tmp_path / name).symlink_to(points_at)
        with pytest.raises(FileExistsError):
            files.write_new(tmp_path / name, b"stepper's")
    assert target.read_bytes() == MINE and not (tmp_path / "nothing-yet").exists()


def test_writing_without_replace_keeps_a_file_that_is_already_there(tmp_path):
    path = user_file(tmp_path)
    with pytest.raises(FileExistsError):
        files.write_atomically(path, lambda f: f.write(b"new"), replace=False)
    assert path.read_bytes() == MINE and sorted(tmp_path.iterdir()) == [path]


def test_an_atomic_write_replaces_a_link_itself_not_what_it_points_at(tmp_path):
    target = user_file(tmp_path)
    link = tmp_path / "ledger.json"
    link.symlink_to(target)
    files.write_bytes_atomically(link, b"{}")
    assert target.read_bytes() == MINE and not link.is_symlink() and link.read_bytes() == b"{}"


def test_a_failed_write_leaves_no_temporary_file(tmp_path):
    def fails(f):
        f.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        files.write_atomically(tmp_path / "out.bin", fails)
    assert list(tmp_path.iterdir()) == []


def test_a_temporary_name_taken_by_a_planted_link_is_passed_over(tmp_path, monkeypatch):
    target = user_file(tmp_path)
    names = iter(["aaaaaaaa", "aaaaaaaa", "bbbbbbbb"])
    monkeypatch.setattr(files.secrets, "token_hex", lambda n: next(names))
    planted = tmp_path / f".out.bin.tmp-{os.getpid()}-aaaaaaaa"
    planted.symlink_to(target)
    files.write_bytes_atomically(tmp_path / "out.bin", b"written")
    assert (tmp_path / "out.bin").read_bytes() == b"written" and target.read_bytes() == MINE
    assert planted.is_symlink()


def test_folders_below_a_kept_folder_are_never_links(tmp_path):
    root, outside = tmp_path / "cache", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "url").symlink_to(outside)
    with pytest.raises(StepperError, match="is a link, not a folder stepper made"):
        files.make_folder(root / "url" / "x" / ".stepper", within=root)
    assert list(outside.iterdir()) == []
    files.make_folder(root / "hf" / "org" / "name", within=root)
    assert (root / "hf" / "org" / "name").is_dir()


def test_updating_a_file_refuses_a_link(tmp_path):
    target = user_file(tmp_path)
    (tmp_path / "shard").symlink_to(target)
    with pytest.raises(StepperError, match="is a link"):
        files.open_for_update(tmp_path / "shard")
    with pytest.raises(StepperError, match="is a link"):
        files.open_lock(tmp_path / "shard")
    assert target.read_bytes() == MINE


def test_updating_a_file_refuses_a_hard_link(tmp_path):
    target = user_file(tmp_path)
    os.link(target, tmp_path / "shard")  # the same file under a second name: writing one writes the other
    with pytest.raises(StepperError, match="shard: has 2 names"):
        files.open_for_update(tmp_path / "shard")
    assert target.read_bytes() == MINE


def test_removing_a_link_removes_the_link_only_and_a_folder_is_not_removed(tmp_path):
    target = user_file(tmp_path)
    (tmp_path / "link").symlink_to(target)
    (tmp_path / "folder").mkdir()
    assert files.remove_file(tmp_path / "link") and not files.remove_file(tmp_path / "folder")
    assert target.read_bytes() == MINE and (tmp_path / "folder").is_dir()
    (tmp_path / "folder" / "x").write_bytes(b"")
    assert not files.remove_empty_folder(tmp_path / "folder")


@pytest.mark.parametrize("force", [False, True])
def test_an_output_is_refused_over_a_users_file_a_link_a_fifo_or_a_folder(tmp_path, force):
    mine = user_file(tmp_path)
    (tmp_path / "link").symlink_to(mine)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    expected = {"mine.txt": "is not a report stepper wrote; --force replaces only a report stepper wrote, so "
                            + ("it was not touched" if force else "give another name"),
                "link": "is a link", "fifo": "is not a regular file", "folder": "is a folder"}
    for name, why in expected.items():
        with pytest.raises(StepperError, match=why):
            files.check_output("--report", tmp_path / name, force, lambda p: False, "a report stepper wrote")
    assert (mine.read_bytes() == MINE
            and sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "folder", "link", "mine.txt"])


def test_an_output_checked_before_the_run_is_not_written_over_a_file_that_appeared_since(tmp_path):
    path = tmp_path / "report.json"
    files.check_output("--report", path, False, lambda p: False, "a report stepper wrote")
    path.write_bytes(MINE)  # the user's, made while the run ran
    with pytest.raises(StepperError, match="is not a report; --force replaces only a report, so give another name"):
        files.write_output("--report", path, lambda f: f.write(b"report"), False, lambda p: False, "a report")
    with pytest.raises(StepperError, match="is not a report"):
        files.write_output("--report", path, lambda f: f.write(b"report"), True, lambda p: False, "a report")
    assert path.read_bytes() == MINE and sorted(tmp_path.iterdir()) == [path]
