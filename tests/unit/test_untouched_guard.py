"""The guard every test runs under (tests/conftest.py's `nothing_else_written`): it reports a file
created, changed or removed outside the test's own folders, and fails the test that did it."""

from __future__ import annotations

import os
from pathlib import Path

from helpers import untouched
from helpers.untouched import Guard

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"


def test_the_guard_reports_each_file_created_changed_or_removed(tmp_path):
    (tmp_path / "kept.txt").write_text("kept\n")
    (tmp_path / "edited.txt").write_text("before\n")
    (tmp_path / "gone.txt").write_text("gone\n")
    (tmp_path / "sub").mkdir()
    guard = Guard([tmp_path])
    assert guard.check() == []
    (tmp_path / "edited.txt").write_text("after, longer\n")
    (tmp_path / "gone.txt").unlink()
    (tmp_path / "sub" / "new.txt").write_text("new\n")
    (tmp_path / "link").symlink_to(tmp_path / "kept.txt")
    assert guard.check() == [f"changed {tmp_path / 'edited.txt'}", f"created {tmp_path / 'link'}",
                             f"created {tmp_path / 'sub' / 'new.txt'}", f"removed {tmp_path / 'gone.txt'}"]


def test_a_file_replaced_by_a_rename_is_reported_even_with_the_same_size_and_time(tmp_path):
    path = tmp_path / "report.json"
    path.write_text("1234\n")
    guard = Guard([tmp_path])
    other = tmp_path / ".tmp"
    other.write_text("5678\n")
    st = path.stat()
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(other, path)
    assert guard.check() == [f"changed {path}"]


def test_the_suites_fixture_fails_a_test_that_writes_outside_its_folders(pytester):
    # the suite's conftest, its checkout being the inner run's folder (the inner run's tmp folders are beside it)
    inner = CONFTEST.read_text().replace("Path(__file__).resolve().parents[1]", "Path(__file__).resolve().parent")
    assert inner != CONFTEST.read_text()
    pytester.makeconftest(f"import sys\nsys.path.insert(0, {str(CONFTEST.parent)!r})\n" + inner)
    pytester.makepyfile(test_inner="""
        import os
        from pathlib import Path

        def test_writes_into_the_default_cache():
            folder = Path(os.environ["XDG_CACHE_HOME"]) / "stepper"
            folder.mkdir(parents=True)
            (folder / "stray.bin").write_bytes(b"x")

        def test_writes_into_the_checkout():
            Path("stray.txt").write_text("x")

        def test_writes_only_in_its_tmp_path(tmp_path):
            (tmp_path / "out.bin").write_bytes(b"x")
    """)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=2)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_writes_into_the_default_cache*",
                                 ("the test changed files outside its own folders: created "
                                 "*home*/cache/stepper/stray.bin"),
                                 "*ERROR at teardown of test_writes_into_the_checkout*",
                                 "the test changed files outside its own folders: created */stray.txt"])


def test_a_command_may_change_only_stepper_places_in_the_tests_folder(tmp_path, monkeypatch):
    mine, data, out = tmp_path / "mine.txt", tmp_path / "data", tmp_path / "report.json"
    for path in (mine, out, data / "progress.json"):
        path.parent.mkdir(exist_ok=True)
        path.write_text("before\n")
    monkeypatch.setattr(untouched, "test_folder", tmp_path)

    def after(argv, env, *edited):
        guard = untouched.command_guard(argv, tmp_path, env)
        for path in edited:
            path.write_text("after, changed\n")
        return guard.check()

    assert after(["fixtures", "verify", "f", "c", "--report", str(out)], {}, out) == [f"changed {out}"]
    assert after(["fixtures", "verify", "f", "c", "--report", str(out), "--force"], {}, out) == []
    assert after(["lesson", "start"], {"STEPPER_DATA_DIR": str(data)}, data / "progress.json") == []
    assert after(["run"], {}, mine) == [f"changed {mine}"]
    assert after(["run", "--dump", "new.safetensors"], {},
                 tmp_path / "new.safetensors") == []  # a new file is an output
