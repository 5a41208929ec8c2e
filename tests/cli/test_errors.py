"""Every failure is one line and exit code 2, Ctrl-C is "interrupted" and exit code 130, output files
keep the umask and are replaced only when stepper wrote them, and nothing the user asks for is
silently ignored: a pattern that matches no tensor of the run is an error before it starts."""

import hashlib
import os
import pty
import re
import resource
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import typer
from helpers.cli import one_line
from helpers.cli import stepper as in_this_process
from safetensors import safe_open
from safetensors.numpy import save_file

from stepper.cli.common import user_errors
from stepper.errors import StepperError
from stepper.planning.memory import Need, check_fits, needs
from stepper.planning.names import planned_names
from stepper.seams.trace import Recorder
from stepper.session import RunSpec, execute, prepare

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
COMMAND = [sys.executable, "-m", "stepper"]


def stepper(*args, cwd=None, umask=None, stdin=subprocess.DEVNULL, process=False) -> subprocess.CompletedProcess:
    """The command in the test process (helpers.cli), or in a real one for what only a process
    has (the umask), or where a broken check would start work without end (process=True: a
    child that overruns its timeout fails; the test process would hang)."""
    if umask is None and not process:
        return in_this_process(*args, cwd=cwd)
    return subprocess.run([*COMMAND, *map(str, args)], check=False, capture_output=True, text=True, cwd=cwd, env=ENV,
                          stdin=stdin,
                          timeout=120, preexec_fn=None if umask is None else (lambda: os.umask(umask)))


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every file and folder under `folder`, with its bytes (None for a folder)."""
    return {str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes() for p in sorted(folder.rglob("*"))}


# -- numbers ------------------------------------------------------------------------------------


def invalid(option: str, bound: str) -> str:
    """A number out of its option's range, in stepper's words (it was typer's validator's: "Invalid
    value for '--seed': Input should be greater than or equal to 0")."""
    return f"stepper: error: {option} must be {bound} (see stepper run --help)"


@pytest.mark.parametrize("args, line", [
    (["--seed", "-1"], invalid("--seed", ">= 0, got -1")),
    (["--prompt-len", "-3"], invalid("--prompt-len", ">= 1, got -3")),
    (["--decode", "-1"], invalid("--decode", ">= 0, got -1")),
    (["--start-pos", "-1"], invalid("--start-pos", ">= 0, got -1")),
    (["--layer", "-1"], invalid("--layer", ">= 0, got -1")),
    (["--weight-cache-mb", "-1"], invalid("--weight-cache-mb", ">= 0, got -1")),
    (["--prompt-len", "100000000000"],
     "stepper: error: positions up to 99999999999 exceed max_position_embeddings (131072) of model tiny"),
    (["--decode", "10000000000"],
     "stepper: error: positions up to 10000000006 exceed max_position_embeddings (131072) of model tiny"),
    (["--start-pos", str(10**30)],
     f"stepper: error: positions up to {10**30 + 6} exceed max_position_embeddings (131072) of model tiny"),
    (["--layer", str(10**20)], f"stepper: error: layer {10**20} out of range: model tiny has layers 0..2"),
])
def test_negative_or_absurd_numbers_are_one_line(args, line):
    assert one_line(stepper("run", *args, process="exceed" in line)) == line


@pytest.mark.parametrize("limit", ["-1", "0", "nan", "inf"])
def test_a_dump_limit_is_a_finite_size_above_0(limit, tmp_path):
    """-1 was "over the dump limit of -1 GiB"; nan wrote the dump with no limit."""
    out = stepper("run", "--dump", "d.safetensors", f"--dump-limit-gb={limit}", cwd=tmp_path)
    assert one_line(out) == f"stepper: error: --dump-limit-gb must be a finite number > 0 (GiB), got {float(limit):g}"
    assert snapshot(tmp_path) == {}


def test_a_huge_seed_runs():
    out = stepper("run", "--plain", "--only", "logits", "--seed", str(10**30))
    assert out.returncode == 0 and "synthetic weights, seed 1000000000000000000000000000000" in out.stdout


@pytest.mark.parametrize("args, line", [
    (["fixtures", "export", "fx", "--seed", "-1"],
     "stepper: error: --seed must be >= 0, got -1 (see stepper fixtures export --help)"),
    (["fp8", "--weight", "model.layers.0.self_attn.o_proj.weight", "--seed", "-2"],
     "stepper: error: --seed must be >= 0, got -2 (see stepper fp8 --help)"),
    (["lesson", "watch", "tour", "--interval", "-1"],
     "stepper: error: --interval must be >= 0.01, got -1 (see stepper lesson watch --help)"),
    (["run", "--decode", "1.5"], "stepper: error: --decode must be an integer, got '1.5' (see stepper run --help)"),
    (["run", "--dump-limit-gb", "x"],
     "stepper: error: --dump-limit-gb must be a number, got 'x' (see stepper run --help)"),
])
def test_numbers_of_other_commands_are_one_line(args, line, tmp_path):
    assert one_line(stepper(*args, cwd=tmp_path)) == line
    assert snapshot(tmp_path) == {}


TOO_LONG = "a" * 300  # longer than any file name may be (255 bytes): Path.exists() raises ENAMETOOLONG


@pytest.mark.parametrize("args, line", [
    (["diff", TOO_LONG, "run"], f"stepper: error: {TOO_LONG}: cannot be read (file name too long)"),
    (["fixtures", "verify", TOO_LONG, "c.safetensors"],
     f"stepper: error: {TOO_LONG}: cannot be read (file name too long)"),
    (["fixtures", "verify", "tiny-prefill-decode", f"{TOO_LONG}.npz"],
     f"stepper: error: {TOO_LONG}.npz: cannot be read (file name too long)"),
    (["lesson", "check", "rmsnorm", "--file", f"{TOO_LONG}.py"],
     f"stepper: error: {TOO_LONG}.py: cannot be read (file name too long)"),
    (["diff", "b" * 100_000, "run"], f"stepper: error: {'b' * 4096}...: cannot be read (file name too long)"),
], ids=["diff", "verify-fixture", "verify-candidate", "lesson-check-file", "past-PATH_MAX"])
def test_a_path_too_long_for_a_file_is_one_line(args, line, tmp_path):
    """Each was Path.exists(), is_file() or is_dir()'s OSError, a traceback; a path past the
    longest there can be (4096) is shown cut to it."""
    assert one_line(stepper(*args, cwd=tmp_path)) == line
    assert snapshot(tmp_path) == {}


def test_a_config_without_model_type_says_it_is_missing_then_what_it_may_be(tmp_path):
    """It read "field 'model_type' must be one of deepseek_v3, ..., deepseek_v4, is missing"."""
    (tmp_path / "config.json").write_text("{}")
    from stepper.families import model_types

    assert one_line(stepper("run", "--model", "config.json", cwd=tmp_path)) == (
        f"stepper: error: config.json: field 'model_type' is missing; it must be one of {', '.join(model_types())}")


# -- memory -------------------------------------------------------------------------------------


def limited_address_space() -> None:
    """In the child: 4 GiB of address space, whatever the machine has free (so the test does not
    depend on it), and a run that started its work before refusing would fail to allocate."""
    resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))


def test_a_run_that_cannot_fit_is_refused_at_once():
    # the whole prompt at once (--chunk auto would run it in chunks that fit: tests/cli/test_chunk_option.py)
    line = one_line(subprocess.run([*COMMAND, "run", "--model", "kimi-k2", "--layer", "0", "--prompt-len", "100000",
                                    "--chunk", "0"], capture_output=True, text=True, env=ENV, timeout=120, check=False,
                                   preexec_fn=limited_address_space))
    assert re.fullmatch(r"stepper: error: this run would need about [\d.]+ GiB of memory \([\d.]+ GiB for one layer's "
                        r"tensors\) and [\d.]+ (GiB|MiB) is available; lower it with --prompt-len", line), line


def test_the_refusal_names_the_estimate_what_is_available_and_the_option():
    items = [Need("attention scores", 3 * 2**30, "--prompt-len"), Need("the 5 tensors kept", 5 * 2**30, "--only")]
    with pytest.raises(StepperError) as e:
        check_fits(items, 6 * 2**30)
    assert str(e.value) == ("this run would need about 8.0 GiB of memory (5.0 GiB for the 5 tensors kept) and 6.0 GiB "
                            "is available; lower it with --only")
    check_fits(items, 8 * 2**30)  # fits exactly
    check_fits(items, None)  # nothing known about the machine: no refusal


def total(spec: RunSpec, kept: bool = False) -> int:
    plan = prepare(spec)
    return sum(n.bytes for n in needs(plan, planned_names(plan) if kept else [], "--only"))


def test_the_estimate_allows_a_full_size_layer_and_holds_what_views_keep():
    assert 0.5 * 2**30 < total(RunSpec(model="kimi-k2", layer=1, prompt_len=512)) < 2 * 2**30  # measured peak 1.6 GB
    assert total(RunSpec(model="kimi-k2", layer=1, prompt_len=512, decode=4), kept=True) < 3 * 2**30
    assert total(RunSpec(), kept=True) < 64 * 2**20  # what the test suite and the docs run is small
    # the debugger's history: the sum of every tensor the run emits
    plan = prepare(RunSpec(prompt_len=300))
    recorder = Recorder()
    execute(plan, [recorder])
    held = sum(e.array.nbytes for e in recorder.events)
    kept = next(n for n in needs(plan, planned_names(plan), "--only") if n.what.endswith("tensors kept"))
    assert 0.9 * held < kept.bytes < 1.1 * held


def test_a_memory_error_anywhere_is_one_line():
    # address space; the estimate is told nothing of the limit, so the run starts and NumPy fails (the
    # interpreter and stepper take ~170 MB of it: 600 MB fails within the first layer's tensors)
    limit = 600 * 2**20
    blind = ("import sys; import stepper.planning.memory as m; m.address_space_room = lambda: None; "
             "from stepper.cli.main import main; sys.argv[0] = 'stepper'; main()")
    out = subprocess.run([sys.executable, "-c", blind, "run", "--plain", "--prompt-len", "100000"], check=False,
                         capture_output=True,
                         text=True, env=ENV, timeout=120, stdin=subprocess.DEVNULL,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    line = one_line(out)
    assert re.fullmatch(r"stepper: error: out of memory: Unable to allocate [\d.]+ [MG]iB for an array with shape "
                        r"\(.*\) and data type \w+", line), line


def test_user_errors_turns_memory_error_and_ctrl_c_into_exit_codes(capsys):
    with pytest.raises(typer.Exit) as e, user_errors():
        raise MemoryError()
    assert e.value.exit_code == 2 and capsys.readouterr().err == "stepper: error: out of memory: an allocation failed\n"
    with pytest.raises(typer.Exit) as e, user_errors():
        raise KeyboardInterrupt
    assert e.value.exit_code == 130


# -- Ctrl-C -------------------------------------------------------------------------------------


@pytest.fixture
def ctrl_c_as_at_a_terminal():
    """Children get Ctrl-C as at a terminal even when the tests were started with SIGINT ignored
    (in the background of a shell without job control, or under nohup): an ignored signal stays
    ignored across exec, and the tests of Ctrl-C would hang instead of testing it; a handled one
    is the default again in the child."""
    before = signal.getsignal(signal.SIGINT)
    if before == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def interrupt(args, cwd: Path, after: str, seconds: float = 0.0) -> subprocess.CompletedProcess:
    """Start stepper, wait until stdout shows `after` (and `seconds` more), send SIGINT, collect."""
    p = subprocess.Popen([*COMMAND, *map(str, args)], cwd=cwd, env={**ENV, "PYTHONUNBUFFERED": "1"},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    seen = ""
    while after not in seen:
        line = p.stdout.readline()
        assert line, "stepper ended before it could be interrupted"
        seen += line
    time.sleep(seconds)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    return subprocess.CompletedProcess(p.args, p.returncode, seen + out, err)


def test_ctrl_c_during_a_run_leaves_the_old_dump_as_it_was(tmp_path, ctrl_c_as_at_a_terminal):
    dump = tmp_path / "run.safetensors"
    assert stepper("run", "--plain", "--only", "logits", "--dump", dump).returncode == 0
    before = snapshot(tmp_path)
    out = interrupt(["run", "--model", "kimi-k2", "--layer", "1", "--prompt-len", "4", "--plain", "--dump", dump,
                     "--force"], tmp_path, "hidden_states")
    assert out.returncode == 130 and out.stderr.endswith("\nstepper: interrupted\n") and "Traceback" not in out.stderr
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("args", [
    ["synth", "--model", "kimi-k2", "--layers", "1:2", "--out", "ck"],
    ["fixtures", "export", "fx", "--model", "kimi-k2", "--layer", "1", "--prompt-len", "4"],
])
def test_ctrl_c_while_writing_leaves_nothing(args, tmp_path, ctrl_c_as_at_a_terminal):
    (tmp_path / "notes.txt").write_text("mine")
    p = subprocess.Popen([*COMMAND, *args], cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, text=True)
    def writing() -> bool:  # the half-written folder beside its place
        return any(f.name.startswith(".") for f in tmp_path.iterdir())

    hang_guard = time.monotonic() + 120  # a run that never begins to write fails below, not on time
    while not writing() and p.poll() is None and time.monotonic() < hang_guard:
        time.sleep(0.05)
    assert writing() and p.poll() is None, "the command never began to write"
    time.sleep(1)
    p.send_signal(signal.SIGINT)
    err = p.communicate(timeout=60)[1]
    assert p.returncode == 130 and err.endswith("\nstepper: interrupted\n") and "Traceback" not in err
    assert snapshot(tmp_path) == {"notes.txt": b"mine"}


def in_pty(args, cwd: Path, prompt: bytes) -> tuple[int, bytes]:
    """Run stepper on a terminal, press Ctrl-C (SIGINT to its process group) at `prompt`, then Ctrl-D
    once the prompt comes again. -> the exit code and everything written"""
    pid, fd = pty.fork()
    if pid == 0:  # the child: stepper on the terminal
        os.chdir(cwd)
        os.execve(sys.executable, [*COMMAND, *map(str, args)], {**ENV, "COLUMNS": "80", "TERM": "xterm"})
    deadline = time.monotonic() + 60
    out = read_until(fd, b"", prompt, deadline)
    assert prompt in out, out[-500:]
    # Pressed again while nothing answers: a SIGINT that lands between readline printing the prompt
    # and starting to wait for a key is only noticed at the next key (CPython's readline loop), a
    # window of microseconds that a loaded machine can stretch to where a test lands in it.
    for _ in range(5):
        os.killpg(pid, signal.SIGINT)
        if select.select([fd], [], [], 2)[0]:
            break
    out = read_until(fd, out, DROPPED + prompt, deadline)  # the line dropped, the prompt again
    for _ in range(10):  # then Ctrl-D, at each prompt that comes (a lesson's prediction, then its debugger)
        os.write(fd, b"\x04")
        try:
            chunk = os.read(fd, 65536) if select.select([fd], [], [], 5)[0] else b""
        except OSError:  # the terminal closed
            break
        if not chunk:
            break
        out += chunk
        while select.select([fd], [], [], 0.5)[0]:
            try:
                out += os.read(fd, 65536)
            except OSError:
                break
    while time.monotonic() < deadline + 30:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), out
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    raise AssertionError(f"it did not end at Ctrl-D: {out[-500:]!r}")


DROPPED = b"(line dropped: q or Ctrl-D quits)\r\n"
SGR = re.compile(rb"\x1b\[[0-9;]*m")  # colours and styles


def read_until(fd: int, out: bytes, wanted: bytes, deadline: float) -> bytes:
    """What the terminal shows, read until `wanted` is in it (or the deadline passes)."""
    while wanted not in SGR.sub(b"", out) and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.2)[0]:
            out += os.read(fd, 65536)
    return out


@pytest.mark.parametrize("args, prompt", [
    (["step", "--prompt-len", "3"], b"(stepper) "),
    (["lesson", "start", "tour", "--workspace", "ws"], b"your prediction> "),
])
def test_ctrl_c_at_a_prompt_drops_the_line_and_asks_again(args, prompt, tmp_path, ctrl_c_as_at_a_terminal):
    """As other debuggers: Ctrl-C at the prompt drops what was typed and asks again; Ctrl-D ends,
    at a lesson's prediction too (as the dropped line's hint says: it showed the answer and went on)."""
    code, out = in_pty(args, tmp_path, prompt)
    plain = SGR.sub(b"", out)
    assert DROPPED + prompt in plain and b"Traceback" not in out and b"interrupted" not in out, out[-500:]
    after = plain.split(DROPPED + prompt, 1)[1]
    assert b"(Ctrl-D: quitting)" in after and b"the answer:" not in after, out[-500:]
    assert code == 0, out[-500:]


# -- output files -------------------------------------------------------------------------------


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_output_files_keep_the_umask(umask, mode, tmp_path):
    dump, export = tmp_path / "run.safetensors", tmp_path / "s.txt"
    assert stepper("run", "--plain", "--only", "logits", "--dump", dump, umask=umask).returncode == 0
    assert stepper("step", "--plain", "--export", export, umask=umask, stdin=subprocess.PIPE).returncode == 0
    assert (dump.stat().st_mode & 0o777, export.stat().st_mode & 0o777) == (mode, mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.safetensors", "s.txt"]


def test_force_replaces_a_dump_and_a_recorded_session(tmp_path):
    dump, export = tmp_path / "run.safetensors", tmp_path / "s.html"
    assert stepper("run", "--plain", "--only", "logits", "--dump", dump).returncode == 0
    assert stepper("step", "--plain", "--export", export, stdin=subprocess.PIPE).returncode == 0
    old = snapshot(tmp_path)
    assert stepper("run", "--plain", "--only", "embed", "--dump", dump, "--force").returncode == 0
    assert stepper("step", "--plain", "--prompt-len", "2", "--export", export, "--force",
                   stdin=subprocess.PIPE).returncode == 0
    new = snapshot(tmp_path)
    assert new.keys() == old.keys() and all(new[k] != old[k] for k in new)
    assert b"prefill" not in new["run.safetensors"] and b'"embed"' in new["run.safetensors"]


def test_a_dump_notes_its_sha256_and_force_keeps_one_changed_since(tmp_path):
    """A dump notes the sha256 of its bytes (that value read as 64 zeros), so that --force can tell
    a dump edited since from one stepper wrote: it replaced any file that said it was a dump."""
    dump = tmp_path / "run.safetensors"
    assert stepper("run", "--plain", "--only", "logits", "--dump", dump).returncode == 0
    data = dump.read_bytes()
    with safe_open(str(dump), "np") as f:
        noted = f.metadata()["written_sha256"]
    assert hashlib.sha256(data.replace(noted.encode(), b"0" * 64, 1)).hexdigest() == noted
    edited = bytearray(data)
    edited[-1] ^= 1  # the last logit's last byte
    dump.write_bytes(edited)
    out = stepper("run", "--plain", "--only", "embed", "--dump", dump, "--force")
    refusal = (f"stepper: error: --dump {dump}: is not a dump stepper wrote; --force replaces only a dump stepper "
               "wrote, so it was not touched")
    assert (out.returncode, out.stderr.strip()) == (2, refusal)
    assert dump.read_bytes() == edited
    save_file({"logits": np.zeros(3, np.float32)}, str(dump), metadata={"format": "stepper-dump"})  # noting none:
    assert stepper("run", "--plain", "--only", "embed", "--dump", dump, "--force").returncode == 0  # an older dump


def user_files(folder: Path) -> None:
    save_file({"w": np.ones(3, np.float32)}, str(folder / "weights.safetensors"))  # a user's own safetensors file
    (folder / "notes.txt").write_text("my notes\n")
    (folder / "page.html").write_text("<!DOCTYPE html><p>mine</p>\n")
    (folder / "dir.safetensors").mkdir()
    (folder / "dir.safetensors" / "inside.txt").write_text("kept\n")
    (folder / "dir.svg").mkdir()
    (folder / "null.txt").symlink_to("/dev/null")


@pytest.mark.parametrize("args, line", [
    (["run", "--dump", "weights.safetensors", "--force"],
     ("--dump weights.safetensors: is not a dump stepper wrote; --force replaces only a dump stepper wrote, "
     "so it was not touched")),
    (["run", "--dump", "weights.safetensors"],  # --force is not offered: it would not replace the user's file
     ("--dump weights.safetensors: is not a dump stepper wrote; --force replaces only a dump stepper wrote, "
      "so give another name")),
    (["run", "--dump", "dir.safetensors", "--force"],
     "--dump dir.safetensors: is a folder; give a file name inside it"),
    (["run", "--dump", "missing/run.safetensors"], "--dump missing/run.safetensors: folder missing does not exist"),
    (["run", "--dump", "/proc/x.safetensors"],
     "--dump /proc/x.safetensors: cannot write in /proc (No such file or directory)"),
    (["run", "--dump", "notes.txt"], "--dump notes.txt: the file name must end in .safetensors"),
    (["step", "--export", "notes.txt", "--force"],
     ("--export notes.txt: is not a session stepper recorded; --force replaces only a session stepper recorded, "
     "so it was not touched")),
    (["step", "--export", "page.html", "--force"],
     ("--export page.html: is not a session stepper recorded; --force replaces only a session stepper recorded, "
     "so it was not touched")),
    (["step", "--export", "dir.svg", "--force"], "--export dir.svg: is a folder; give a file name inside it"),
    (["step", "--export", "missing/s.txt"], "--export missing/s.txt: folder missing does not exist"),
    (["step", "--export", "/proc/s.txt"], "--export /proc/s.txt: cannot write in /proc (No such file or directory)"),
    (["step", "--export", "null.txt", "--force"],
     "--export null.txt: is a link; stepper does not write through links, give a new file name"),
    (["step", "--export", "s.pdf"], "--export s.pdf: the file name must end in .html, .svg, .txt"),
])
def test_an_output_place_that_cannot_take_the_file_is_one_line_and_nothing_changes(args, line, tmp_path):
    user_files(tmp_path)
    before = snapshot(tmp_path)
    assert one_line(stepper(*args, cwd=tmp_path)) == "stepper: error: " + line
    assert snapshot(tmp_path) == before


def test_a_special_file_is_never_replaced(tmp_path):
    fifo = tmp_path / "pipe.safetensors"
    os.mkfifo(fifo)
    assert one_line(stepper("run", "--dump", fifo, "--force", process=True)) == (  # a child opening the fifo times out
        f"stepper: error: --dump {fifo}: is not a regular file; give a new file name")
    assert [p.name for p in tmp_path.iterdir()] == ["pipe.safetensors"] and fifo.is_fifo()


# -- nothing silently ignored -------------------------------------------------------------------


@pytest.mark.parametrize("args, line", [
    (["run", "--only", "nosuch"], "--only nosuch: matches no tensor of this run"),
    (["run", "--only", "k_pee"], "--only k_pee: matches no tensor of this run; did you mean k_pe, k_nope, k_pe_rope?"),
    (["run", "--layer", "0", "--only", "mlp.gate.*"],
     "--only mlp.gate.*: matches no tensor of this run; did you mean mlp.act, mlp.gate_proj?"),
    (["run", "--only", "q_nope_absorbed"], "--only q_nope_absorbed: matches no tensor of this run"),  # naive attention
    (["step", "--until", "nosuch"], "--until nosuch: matches no tensor of this run"),
    (["step", "--break", "compresed_kv"], ("--break compresed_kv: matches no tensor of this run; did you mean "
                                          "compressed_kv, compressed_kv_norm, self_attn.compressed_kv?")),
    (["step", "--break", "layers.3.*"],
     ("--break layers.3.*: matches no tensor of this run; did you mean layers.2.output, layers.1.output, "
     "layers.0.output?")),
    (["step", "--decode", "1", "--break", "decode1.*"], "--break decode1.*: matches no tensor of this run"),
])
def test_a_pattern_that_matches_nothing_is_refused_before_the_run(args, line):
    out = stepper(*args, "--plain")
    assert one_line(out) == "stepper: error: " + line and out.stdout == ""


def test_patterns_that_match_run():
    out = stepper("step", "--plain", "--decode", "1", "--break", "decode0.*k_pe", "--until", "layers.2.output",
                  stdin=subprocess.PIPE)
    assert out.returncode == 0 and "layers.2.output  [B=1" in out.stdout


def test_the_debugger_says_when_b_or_u_match_nothing_and_goes_on():
    commands = "b nosuch\nb k_pee\nu compresed_kv\nu embed\nu layers.2.output\nq\n"
    out = in_this_process("step", "--plain", "--break", "layers.1.*k_pe", stdin=commands)
    assert out.returncode == 0, out.stderr
    said = [line for line in out.stdout.splitlines() if line.startswith(("b ", "u ", "breakpoints"))]
    assert said == [
        "b nosuch: matches no tensor of this run",
        "b k_pee: matches no tensor of this run; did you mean k_pe, k_nope, k_pe_rope?",
        ("u compresed_kv: matches no tensor of this run; did you mean compressed_kv, compressed_kv_norm, "
        "self_attn.compressed_kv?"),
        "u embed: every tensor it matches has passed (h lists them)",
    ]
    assert "layers.2.output  [B=1" in out.stdout and out.stdout.rstrip().endswith("quit after 102 tensors")


@pytest.mark.parametrize("spec", [
    RunSpec(), RunSpec(decode=2), RunSpec(layer=1, decode=1), RunSpec(layers=(1, 2)), RunSpec(attn="absorb"),
    RunSpec(model="tiny-v3", decode=1, attn="naive"), RunSpec(layers=(1, 3), decode=1, start_pos=5000),
])
def test_the_names_of_a_run_are_known_before_it_starts(spec):
    plan = prepare(spec)
    recorder = Recorder()
    execute(plan, [recorder])
    names = planned_names(plan)
    assert sorted(names) == sorted(e.name for e in recorder.events) and len(set(names)) == len(names)


def test_fixtures_verify_counts_missing_tensors_and_an_unwritable_report_is_one_line(tmp_path):
    fixture = ROOT / "fixtures" / "tiny-prefill-decode"
    tensors = {}
    with safe_open(fixture / "tensors.safetensors", "np") as f:
        for name in list(f.keys())[:9]:
            tensors[name] = f.get_tensor(name)
    candidate = tmp_path / "port.safetensors"
    save_file(tensors, str(candidate))
    out = stepper("fixtures", "verify", fixture, candidate, "--plain")
    assert one_line(out, 1) == (f"stepper: 303 of the fixture's 312 tensors are missing from {candidate}; "
                                "pass --allow-missing to accept that")
    assert stepper("fixtures", "verify", fixture, candidate, "--allow-missing", "--plain").returncode == 0
    line = one_line(stepper("fixtures", "verify", fixture, candidate, "--allow-missing", "--report", "/proc/r.json"))
    assert line == "stepper: error: --report /proc/r.json: cannot write in /proc (No such file or directory)"


def test_the_room_under_a_cgroup_limit_counts(tmp_path):
    """cgroup v2 then v1: the limit less the usage, reclaimable page cache counted as room; no limit, no room known."""
    from stepper.planning.memory import cgroup_room

    own = tmp_path / "cgroup"
    own.write_text("0::/job\n")
    v2 = tmp_path / "fs" / "job"
    v2.mkdir(parents=True)
    (v2 / "memory.max").write_text("4294967296\n")
    (v2 / "memory.current").write_text("3221225472\n")
    (v2 / "memory.stat").write_text("anon 1\ninactive_file 536870912\n")
    assert cgroup_room(tmp_path / "fs", own) == 2**30 + 2**29
    (v2 / "memory.max").write_text("max\n")
    assert cgroup_room(tmp_path / "fs", own) is None
    (v2 / "memory.max").unlink()
    v1 = tmp_path / "fs" / "memory"  # v1, the mount showing the container's own group
    v1.mkdir()
    (v1 / "memory.limit_in_bytes").write_text("2147483648\n")
    (v1 / "memory.usage_in_bytes").write_text("2147483648\n")
    assert cgroup_room(tmp_path / "fs", own) == 0
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup_room(tmp_path / "fs", own) is None


def test_a_run_past_the_address_space_limit_is_refused_before_it_starts():
    """Under `ulimit -v`, a prompt whose tensors would not fit is refused in one line, exit 2 (its
    attention runs in tiles, but 100000 tokens of every layer's tensors and logits stay)."""
    import resource
    import subprocess
    import sys

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))

    p = subprocess.run([sys.executable, "-m", "stepper", "run", "--prompt-len", "100000", "--only", "logits",
                        "--chunk", "0"],
                       capture_output=True, text=True, preexec_fn=limit, timeout=60, check=False)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("stepper: error: this run would need about ") and p.stderr.count("\n") == 1
    available = float(p.stderr.split(" and ")[1].split()[0])
    assert available < 3.0  # the limit, not the machine's 20-odd GiB


# -- a file given where something else is -------------------------------------------------------

COMMANDS_FILE = "a text file of debugger commands, one per line"

@pytest.mark.parametrize("args, line", [
    (["step", "--commands", "missing.txt"], "--commands missing.txt: no such file"),
    (["step", "--commands", "folder"], f"--commands folder: is a folder; expected {COMMANDS_FILE}"),
    (["step", "--commands", "fifo"], f"--commands fifo: is not a regular file; expected {COMMANDS_FILE}"),
    (["step", "--commands", "latin1.txt"], "--commands latin1.txt: not UTF-8 text; expected debugger commands"),
    (["run", "--use", "folder"], "folder: is a folder; expected a Python file ending in .py"),
    (["step", "--use", "fifo"], "fifo: is not a regular file; expected a Python file ending in .py"),
])
def test_a_folder_or_a_fifo_where_a_file_is_expected_is_one_line(args, line, tmp_path):
    """--commands said `cannot read it ([Errno 21] Is a directory: 'folder')` and waited forever on a
    FIFO no one writes to; --use said `folder: no such file` of a folder that is there."""
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "latin1.txt").write_bytes("p caf\xe9\n".encode("latin-1"))
    assert one_line(stepper(*args, "--plain", cwd=tmp_path, process=True)).startswith(f"stepper: error: {line}")


@pytest.mark.parametrize("command", [["synth", "--out"], ["fixtures", "export"]])
def test_force_is_offered_only_where_it_would_be_taken(command, tmp_path):
    """A folder of the user's was refused with 'pass --force to replace it', and --force then refused
    it as not stepper's: the first refusal now says so."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's\n")
    what = "a checkpoint stepper synth wrote" if command[0] == "synth" else "a fixture folder stepper wrote"
    assert one_line(stepper(*command, "mine", cwd=tmp_path)) == (
        f"stepper: error: mine: holds 'notes.txt'; --force replaces only {what}, so give a new folder")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "the user's\n"
