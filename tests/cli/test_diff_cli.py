"""`stepper diff A B`: runs, dumps and fixtures compared; exit 0 the same, 1 a tensor differs, 2 bad input."""

import re
import subprocess
import sys

import numpy as np
import pytest
from helpers.cli import stepper

from stepper.untrusted import shown


def diff(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return stepper("diff", "--plain", *args, cwd=cwd)


def table_rows(text: str) -> list[list[str]]:
    return [cells for cells in map(str.split,
                                   text.splitlines()) if cells[:1] and cells[0].isdigit() and cells[1] != "only"]


def test_naive_against_absorb_names_no_divergence():
    out = diff("run --attn naive --decode 1 --prompt-len 4", "run --attn absorb --decode 1 --prompt-len 4")
    assert out.returncode == 0, out.stderr
    rows = table_rows(out.stdout)
    assert len(rows) > 150 and {r[2] for r in rows} <= {"same", "close"}
    assert "no tensor in both differs beyond round-off" in out.stdout and "0 differ" in out.stdout
    assert "only in A: prefill.layers.0.self_attn.kv," in out.stdout


def test_a_chunked_prefill_against_the_whole_prompt_is_within_round_off_and_replays_once(monkeypatch):
    from stepper.prefill import Replay
    replays = []
    run_chunk = Replay.run
    monkeypatch.setattr(Replay, "run", lambda self, k, *a, **kw: (replays.append(k), run_chunk(self, k, *a, **kw))[1])
    out = diff("run --prompt-len 16 --chunk 4", "run --prompt-len 16")
    assert out.returncode == 0, out.stderr
    assert "104 tensors in both" in out.stdout and " 0 differ" in out.stdout
    assert "no tensor differs beyond round-off" in out.stdout
    # no replay for the histograms (every tensor held: the chunks binned before a range was final are binned
    # again from their values kept on disk), then one replay of every chunk for the chunked tensors read whole
    assert replays == [0, 1, 2, 3]


def test_a_patched_run_first_differs_at_the_patch_and_the_growth_is_drawn():
    out = diff("run --ids 1,2,3", "run --ids 1,2,3 --patch layers.1.self_attn.k_pe=x*1.001")
    assert out.returncode == 1, out.stderr
    assert "first difference: layers.1.self_attn.k_pe" in out.stdout
    growth = {line.split("  ")[0]: line for line in out.stdout.splitlines() if line.startswith(("layer ", "model "))}
    assert growth["layer 0"].endswith("the same") and "differs from self_attn.k_pe" in growth["layer 1"]
    assert "differs from hidden_states" in growth["layer 2"]


def test_a_dump_against_the_same_run_and_a_fixture_against_a_run(tmp_path):
    dump = tmp_path / "a.safetensors"
    made = subprocess.run([sys.executable, "-m", "stepper", "run", "--plain", "--ids", "5,6", "--decode", "1",
                           "--dump", str(dump)], capture_output=True, text=True, timeout=120, check=False)
    assert made.returncode == 0, made.stderr
    out = diff(str(dump), "run --ids 5,6 --decode 1", "--changed")
    assert out.returncode == 0, out.stderr
    assert "the same bit for bit" in out.stdout and "0 within round-off, 0 differ" in out.stdout
    assert table_rows(out.stdout) == []  # --changed: nothing to list


@pytest.mark.parametrize("a, message", [
    ("no/such/dump.safetensors", "diff A 'no/such/dump.safetensors': no such file or folder"),
    ("run --no-such-option", "diff A 'run --no-such-option': No such option: --no-such-option\n"),
    ("run --dcode 1", "diff A 'run --dcode 1': No such option: --dcode (did you mean --decode?)\n"),
    ("run --dump x.safetensors", "diff A 'run --dump x.safetensors': --dump is not for diff"),
    ("run --attn fast", "--attn must be one of auto, naive, absorb"),
    ("run --ids '1,2", "diff A 'run --ids '1,2': No closing quotation"),
    ("run --help", ("diff A 'run --help': --help is not for diff; give the options of the run itself (stepper run "
                    "--help lists them)\n")),  # not run's help and exit 0, read as "no tensor differs"
    ("run --ids 1,2 --help", "diff A 'run --ids 1,2 --help': --help is not for diff"),
    ("run --json", "diff A 'run --json': --json is not for diff; give the options of the run itself\n"),  # as typed
    ("run --dump-limit-gb=3", "diff A 'run --dump-limit-gb=3': --dump-limit-gb is not for diff"),
])
def test_bad_sides_are_one_line_and_exit_2(a, message):
    out = diff(a, "run")
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1 and out.stdout == ""


def test_tensor_names_and_paths_from_files_are_shown_escaped(tmp_path):
    odd = "E\x1b[2J\rR\x9b[red]x"
    a, b = tmp_path / f"a{odd}.npz", tmp_path / "b.npz"
    x = np.arange(4, dtype=np.float32)
    np.savez(a, **{f"layers.1.{odd}": x, "layers.1.same": x})
    np.savez(b, **{f"layers.1.{odd}": x + 1, "layers.1.same": x})
    out = diff(str(a), str(b))
    assert out.returncode == 1, out.stderr
    assert re.findall("[\x00-\x08\x0b-\x1f\x7f-\x9f]", out.stdout + out.stderr) == []
    assert f"first difference: layers.1.{shown(odd)}" in out.stdout and shown(odd) in out.stdout.splitlines()[1]


def test_two_runs_with_no_tensor_in_common_are_refused_not_called_the_same():
    """A run with decode steps names its tensors prefill... and decode0...; one without, layers...:
    compared with each other nothing is compared, which must not read as agreement (exit 0)."""
    out = diff("run --ids 1,2,3", "run --ids 1,2,3 --decode 1")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == ("stepper: error: diff: run --ids 1,2,3 and run --ids 1,2,3 --decode 1 have no tensor in "
                          "common (one side has decode steps, so its names begin prefill. and decode0., and the other "
                          "has none; compare runs or fixtures made with as many decode steps)\n")
    out = diff("run --ids 1,2,3 --only '*k_pe'", "run --ids 1,2,3 --only '*.q'")
    assert out.returncode == 2 and "have no tensor in common (A's first name is layers.0.self_attn.k_pe, B's " \
                                   "layers.0.self_attn.q; diff reads stepper's own names" in out.stderr


def test_a_name_of_100_000_characters_is_shown_cut(tmp_path):
    """The names only one side has, and the first names of two sides with none in common, are shown
    by their first 60 characters: a dump's name of 100,000 made a line of 100,000."""
    a, b, c = tmp_path / "a.npz", tmp_path / "b.npz", tmp_path / "c.npz"
    x, long = np.arange(4, dtype=np.float32), "layers.1." + "x" * 60_000  # (an .npz name: under 64 KiB)
    np.savez(a, **{"layers.1.same": x})
    np.savez(b, **{"layers.1.same": x, long: x})
    np.savez(c, **{long: x})
    out = diff(str(a), str(b))
    assert out.returncode == 0 and max(map(len, out.stdout.splitlines())) < 500, out.stderr
    assert f"1 only in B: {long[:60]}...\n" in out.stdout
    out = diff(str(a), str(c))
    assert out.returncode == 2 and out.stderr == (
        f"stepper: error: diff: {a} and {c} have no tensor in common (A's first name is layers.1.same, B's "
        f"{long[:60]}...; diff reads stepper's own names (a run, a --dump, a fixture): a dump in another "
        "implementation's names goes to stepper fixtures verify)\n")


def test_a_port_dump_written_by_safetensors_as_a_is_compared_in_the_run_order_of_b(tmp_path):
    """safetensors' save_file lists a file's tensors by dtype and name, not in the order the port made
    them: as A, its order (layers.1.attn_residual, layers.1.mlp... before layers.1.self_attn...) named a
    tensor downstream of the first difference as the first."""
    from safetensors.numpy import save_file

    from stepper.fixtures.candidate import Candidate

    run, port = tmp_path / "run.safetensors", tmp_path / "port.safetensors"
    made = stepper("run", "--plain", "--ids", "5,6,7", "--dump", run, "--patch", "layers.1.self_attn.o_proj=x*1.01")
    assert made.returncode == 0, made.stderr
    with Candidate(run) as dumped:
        save_file({name: np.array(dumped[name]) for name in dumped}, str(port))
    for a, b in ((str(port), "run --ids 5,6,7"), ("run --ids 5,6,7", str(port))):
        out = diff(a, b)
        assert out.returncode == 1, out.stderr
        assert "first difference: layers.1.self_attn.o_proj " in out.stdout, out.stdout[-600:]
        assert "file order" not in out.stdout
    one, two = tmp_path / "one.safetensors", tmp_path / "two.safetensors"  # neither records an order: A's, said so
    save_file({"layers.1.b": np.zeros(2, np.float32), "layers.1.a": np.zeros(2, np.float32)}, str(one))
    save_file({"layers.1.b": np.ones(2, np.float32), "layers.1.a": np.ones(2, np.float32)}, str(two))
    out = diff(str(one), str(two))
    assert out.returncode == 1 and "first difference: layers.1.a " in out.stdout
    assert "first in A's file order: neither side records the order the run made its tensors in" in out.stdout
