"""One plan of a run (stepper.planning): `stepper run`, `stepper.run` and `stepper diff` accept the
same request and make the same auto choices (the attention path, the prefill's chunks) by the same
memory figure, faked here, never the machine's."""

from dataclasses import replace

import numpy as np
import pytest
from helpers.cli import one_line
from helpers.cli import stepper as cli

import stepper
from stepper import session
from stepper.errors import StepperError
from stepper.planning import memory
from stepper.planning.names import planned_names
from stepper.seams.trace import matches
from stepper.session import RunSpec, prepare

LONG = RunSpec(layer=0, prompt_len=300)  # tiny's layer 0 on 300 positions, keeping its k_pe
KEEP = "*k_pe"


def estimate(spec: RunSpec) -> int:
    plan = prepare(spec)
    return sum(n.bytes for n in memory.needs(plan, [n for n in planned_names(plan) if matches(n, [KEEP])], "--only"))


@pytest.fixture
def executed(monkeypatch) -> list[RunSpec]:
    """The specs the runs executed, in order (each run goes on as it would)."""
    specs, execute = [], session.execute

    def spy(plan, sinks):
        specs.append(plan.spec)
        return execute(plan, sinks)

    monkeypatch.setattr(session, "execute", spy)
    return specs


@pytest.fixture
def tight(monkeypatch) -> int:
    """A memory figure in which the whole prompt fits neither naive (with its margin) nor absorbed,
    and absorbed in chunks of 256 positions does."""
    room = estimate(replace(LONG, attn="absorb", chunk=256))
    assert 2 * estimate(LONG) > room and estimate(replace(LONG, attn="absorb")) > room
    monkeypatch.setattr(memory, "available_bytes", lambda: room)
    return room


def test_a_long_prompt_runs_absorbed_in_chunks_through_the_command_line_the_api_and_diff(tight, executed, tmp_path):
    dump = tmp_path / "run.safetensors"
    out = cli("run", "--layer", "0", "--prompt-len", "300", "--only", KEEP, "--dump", dump, "--plain")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[2].startswith(f"--attn auto: absorbed throughout: naive the run would need about "
                               f"{memory.gib(estimate(LONG))}, over half the {memory.gib(tight)} available")
    assert lines[3].startswith(f"--chunk auto: the whole prompt would need about "
                               f"{memory.gib(estimate(replace(LONG, attn='absorb')))} and {memory.gib(tight)} is "
                               "available, so the prefill runs 256 positions at a time (2 chunks")

    api = stepper.run("tiny", layer=0, prompt_len=300, keep=KEEP)
    assert (api.spec.attn, api.spec.chunk) == ("absorb", 256)
    assert stepper.run("tiny", layer=0, prompt_len=300, keep=KEEP, chunk="auto").spec == api.spec
    dumped = stepper.load(dump)
    assert list(dumped) == api.names == ["layers.0.self_attn.k_pe"]
    assert np.array_equal(np.asarray(api[api.names[0]]), dumped[api.names[0]])

    same = cli("diff", f"run --layer 0 --prompt-len 300 --only {KEEP}", dump, "--plain")
    assert same.returncode == 0, same.stdout + same.stderr
    assert [(s.attn, s.chunk) for s in executed] == [("absorb", 256)] * 4  # run, the API twice, diff's side A


def test_the_whole_prompt_asked_for_is_refused_alike_where_it_does_not_fit(tight):
    """--chunk 0 / chunk=0: the whole prompt, even absorbed, is over the figure: refused before it
    starts, naming the option that lowers it in each one's own spelling."""
    line = one_line(cli("run", "--layer", "0", "--prompt-len", "300", "--only", KEEP, "--chunk", "0"))
    assert line.startswith("stepper: error: this run would need about ") and "lower it with --prompt-len" in line
    with pytest.raises(StepperError, match=r"^this run would need about .* lower it with prompt_len="):
        stepper.run("tiny", layer=0, prompt_len=300, keep=KEEP, chunk=0)
    side = one_line(cli("diff", "run --layer 0 --prompt-len 300 --chunk 0", "run --layer 0 --prompt-len 300"))
    assert side.startswith("stepper: error: diff A 'run --layer 0 --prompt-len 300 --chunk 0': this run would need "
                           "about ")


def test_the_long_context_command_of_the_usage_plans_absorbed_through_every_entry_point(monkeypatch):
    """docs/usage.md's decode over a 131K-position synthetic cache: the prefill attends over a
    longer cache, so auto runs absorbed throughout wherever the request is made (the runs stopped
    where the layer would start)."""
    chosen = []

    def stop(plan, sinks):
        chosen.append(plan.spec)
        raise StepperError("stopped before running")

    monkeypatch.setattr(memory, "available_bytes", lambda: 2**50)  # plenty: memory is not why
    monkeypatch.setattr(session, "execute", stop)
    options = "--model kimi-k2 --layer 1 --cache-len 131000 --prompt-len 1 --decode 1 --only *attn_weights"
    assert one_line(cli("run", *options.split(), "--plain"), 2) == "stepper: error: stopped before running"
    with pytest.raises(StepperError, match="^stopped before running$"):
        stepper.run("kimi-k2", layer=1, cache_len=131000, prompt_len=1, decode=1, keep="*attn_weights")
    assert one_line(cli("diff", f"run {options}",
                        "run")) == f"stepper: error: diff A 'run {options}': stopped before running"
    assert [(s.model, s.attn, s.chunk) for s in chosen] == [("kimi-k2", "absorb", 0)] * 3


@pytest.mark.parametrize("chunk", ["half", -1, 2.5, True])
def test_the_api_takes_the_chunks_stepper_run_takes_and_names_them_when_wrong(chunk):
    with pytest.raises(StepperError,
                       match=r"^chunk= expects an integer >= 0 \(0: the whole prompt at once\) or 'auto', got "):
        stepper.run("tiny", chunk=chunk)
