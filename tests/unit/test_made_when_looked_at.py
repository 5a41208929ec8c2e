"""Tensors the model makes only when a sink looks at them (catalogue `made: "when looked at"`: a
KDA layer's state after every token, [B, Hk, T, K, Kv], 4 GiB a layer of Kimi-Linear-48B at 2,048
positions): the catalogue marks exactly those, and the memory estimate counts one only where the
run shows or keeps it, so a run that leaves it out is not chunked or refused for it; and then as
what it holds (catalogue `holds`: the state before each chunk), since it is made when read."""

import numpy as np
import pytest
from helpers.cli import stepper as cli
from helpers.configs import TINY

import stepper
from stepper import catalog, session
from stepper.cli.run import checked_plan, run_spec
from stepper.planning import memory, plan_run
from stepper.seams.trace import unphased
from stepper.session import RunSpec


class LooksAtNothing:
    """A sink that is handed every tensor the model makes and asks for none (`wants`)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def wants(self, event) -> bool:
        return False

    def __call__(self, event) -> None:
        self.names.append(event.name)


@pytest.mark.parametrize("model", TINY)
def test_the_catalogue_marks_exactly_the_tensors_made_only_when_looked_at(model):
    planned = plan_run(RunSpec(model=model, prompt_len=3, decode=1))
    sink = LooksAtNothing()
    planned.execute([sink])
    unmade = [n for n in planned.names if n not in set(sink.names)]
    marked = [n for n in planned.names if memory.on_demand(n)]
    assert unmade == marked
    if model == "tiny-kimi-linear":  # its KDA layers' states after every token and chunk, each step
        assert {catalog.key_of(unphased(n)) for n in marked} == {"self_attn.state_per_token",
                                                                 "self_attn.state_per_chunk"}


KIMI_48B = run_spec("kimi-linear-48b-a3b", 0, None, None, 2048, 0, 0, 0, None, "auto", 0)


def layer_need(only: list[str], pictures: set[str] = frozenset()) -> int:
    planned = checked_plan(KIMI_48B, only, None, set(pictures), False, 1.0, 0, None)[0]
    needs = memory.needs(planned.plan, [], "--only", planned.looked)
    return next(n.bytes for n in needs if n.what == "one layer's tensors")


def test_the_estimate_counts_a_state_per_token_only_when_the_run_shows_it_and_as_what_it_holds(monkeypatch):
    """Shown, the states after every token are made when read from the state before each chunk: the
    estimate counts those (64 MiB at 2,048 positions, where the whole tensor is 4 GiB)."""
    monkeypatch.setattr(memory, "available_bytes", lambda: None)
    per_chunk = 32 * 32 * 128 * 128 * 4  # [1, Hk, 2048 / 64 chunks, K, Kv]
    shown, left_out = layer_need(["*state_per_token"]), layer_need(["*.output"])
    assert shown - left_out == per_chunk
    every = layer_need(["*.output", "*.self_attn.state"], {"state"})  # a picture looks at every tensor
    assert layer_need([]) == every == shown + per_chunk  # state_per_chunk's too


def test_run_shows_a_long_prompts_states_after_every_token_without_chunking_it(monkeypatch):
    """tiny-kimi-linear's layer 0 over 4,096 positions needs about 73 MiB showing its output, 74 MiB
    showing its states after every token (64 MiB whole, one state per chunk held: 1 MiB); with 100 MiB
    available both run the prompt whole (the states were counted whole, 137 MiB, and chunked)."""
    monkeypatch.setattr(memory, "available_bytes", lambda: 100 * 2**20)
    args = ("run", "--model", "tiny-kimi-linear", "--layer", "0", "--prompt-len", "4096", "--only")
    output, states = cli(*args, "layers.0.output"), cli(*args, "*state_per_token")
    assert output.returncode == states.returncode == 0, output.stderr + states.stderr
    assert "--chunk auto" not in output.stdout and "needs about 73 MiB" in output.stdout
    assert "--chunk auto" not in states.stdout and "needs about 74 MiB" in states.stdout
    assert "layers.0.self_attn.state_per_token  [B=1 batch, 4 KDA heads, T=4096 positions" in states.stdout


def test_a_python_run_is_planned_with_the_tensors_it_keeps(monkeypatch):
    """stepper.run looks at what it keeps: keeping the output, or the states after every token (held
    as one state per chunk), the prompt runs whole in 100 MiB."""
    monkeypatch.setattr(memory, "available_bytes", lambda: 100 * 2**20)
    chunks = []
    execute = session.execute
    monkeypatch.setattr(session, "execute", lambda plan, sinks: chunks.append(plan.spec.chunk) or execute(plan, sinks))
    run = stepper.run("tiny-kimi-linear", layer=0, prompt_len=4096, keep="layers.0.output")
    assert chunks == [0] and np.asarray(run["layers.0.output"]).shape == (1, 4096, 160)
    kept = stepper.run("tiny-kimi-linear", layer=0, prompt_len=4096, keep="layers.0.self_attn.state_per_token")
    assert chunks == [0, 0] and kept["layers.0.self_attn.state_per_token"][0, 1, 4000].shape == (32, 32)
