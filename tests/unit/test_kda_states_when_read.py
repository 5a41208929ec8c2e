"""A KDA layer's states after every token (self_attn.state_per_token, [B, Hk, T, K, Kv]) are made when
read, from the state before each chunk: the debugger keeps every tensor of the run, and kept these
whole (Kimi-Linear-48B's layer at 2,048 positions: 4 GiB, where the run itself holds one 2 MiB state).
Each state the debugger shows is the recurrence's, in float64, inside a chunk and at its edges; to
make one it replays at most the writes of its own chunk; and what it keeps of them is one state per
chunk."""

import gc
import io
import re
import tracemalloc

import numpy as np
from helpers.cli import stepper
from rich.console import Console

import stepper as api
from stepper.kernels.kda_chunked import CHUNK, chunked
from stepper.model import kda
from stepper.planning import plan_run
from stepper.session import RunSpec
from stepper.tensors.tensor import held
from stepper.views.debugger import CommandSource, Debugger

rng = np.random.default_rng(11)
T = 150  # three chunks: 64, 64 and 22 tokens
SEEN = (1, 2, 62, 63, 64, 65, 100, 127, 128, 129, 149)  # inside chunks and either side of their edges


def recurrence64(k, v, g, beta, state=None):
    """The gated delta rule token by token in float64: every state.  -> [B, H, T, K, V]"""
    k, v, g, beta = (np.asarray(a, np.float64) for a in (k, v, g, beta))
    B, H, steps, K = k.shape
    S = np.zeros((B, H, K, v.shape[-1])) if state is None else np.asarray(state, np.float64)
    states = np.empty((B, H, steps, K, v.shape[-1]))
    for t in range(steps):
        S = np.exp(g[:, :, t])[..., None] * S
        delta = beta[:, :, t, None] * (v[:, :, t] - np.einsum("bhk,bhkv->bhv", k[:, :, t], S))
        S = S + k[:, :, t, :, None] * delta[:, :, None, :]
        states[:, :, t] = S
    return states


def inputs(B=1, H=2, K=16, V=16):
    q = kda.l2_normalise(rng.standard_normal((B, H, T, K)).astype(np.float32)) * np.float32(K**-0.5)
    k = kda.l2_normalise(rng.standard_normal((B, H, T, K)).astype(np.float32))
    v = rng.standard_normal((B, H, T, V)).astype(np.float32)
    g = (-np.logaddexp(0, rng.standard_normal((B, H, T, K)) - 3)).astype(np.float32)
    beta = (1 / (1 + np.exp(-rng.standard_normal((B, H, T))))).astype(np.float32)
    return q, k, v, g, beta


def test_each_tokens_state_is_the_recurrences_and_is_replayed_from_its_own_chunk_alone():
    q, k, v, g, beta = inputs()
    first = rng.standard_normal((1, 2, 16, 16)).astype(np.float32) * np.float32(0.3)  # a state before the step
    _, delta, _, per_chunk = chunked(q, k, v, g, beta, first, keep_states=True)
    states = kda.replayed(k, g, delta, first, per_chunk)
    exact = recurrence64(k, v, g, beta, first)
    for t in SEEN:
        assert np.max(np.abs(states[0, :, t] - exact[0, :, t])) <= 1e-5 * np.max(np.abs(exact[0, :, t])), t
    poisoned = delta.copy()
    poisoned[:, :, :CHUNK] = np.nan  # the first chunk's writes: a state of a later chunk never reads them
    later = kda.replayed(k, g, poisoned, first, per_chunk)
    np.testing.assert_array_equal(later[0, 1, CHUNK:], states[0, 1, CHUNK:])
    assert np.isnan(later[0, 1, CHUNK - 1]).all()


def test_the_debugger_prints_each_tokens_state_as_the_recurrence_in_float64():
    """What `p` shows at positions inside the chunks and either side of their edges, to 7 digits."""
    prints = [f"p self_attn.state_per_token[0, 1, {t}, :2, :3] 7" for t in SEEN]
    out = stepper("step", "--plain", "--model", "tiny-kimi-linear", "--layer", "0", "--prompt-len", T,
                  stdin="\n".join(["u layers.0.self_attn.state", *prints, "q"]) + "\n")
    assert out.returncode == 0, out.stderr
    names = ["self_attn.k_unit", "self_attn.v_conv", "self_attn.forget_gate", "self_attn.beta"]
    run = api.run("tiny-kimi-linear", layer=0, prompt_len=T, keep=[f"layers.0.{name}" for name in names])
    k, v, g, beta = (np.asarray(run[f"layers.0.{name}"]) for name in names)
    v = v.reshape(1, T, 4, 32).transpose(0, 2, 1, 3)  # [B, Hk, T, Kv], as the layer splits it per head
    exact = recurrence64(k, v, g, beta)
    for t in SEEN:
        head = out.stdout.split(f"state_per_token[0, 1, {t}, :2, :3]  [2x3]  float32\n")[1]
        shown = np.array([float(x) for x in re.findall(r"-?\d+\.\d+", "\n".join(head.splitlines()[:2]))])
        assert np.max(np.abs(shown - exact[0, 1, t, :2, :3].ravel())) <= 2e-7 + 1e-5 * np.abs(exact[0, 1, t]).max(), t


def test_the_debugger_keeps_one_state_per_chunk_not_one_per_token(monkeypatch):
    """Over 1,100 positions the debugger's history holds the tensors it shows and, of the states after
    every token (18 MiB whole), no more than the 18 chunks' states; none is made until one is read, and
    p or s state of them all is one line asking for a slice, before any is made."""
    planned = plan_run(RunSpec(model="tiny-kimi-linear", layer=0, prompt_len=1100), lambda plan, names: names)
    rows, replay = [], kda.replayed

    def counted(*args):
        tensor = replay(*args)
        tile = tensor.tile
        tensor.tile = lambda heads, tokens: rows.append((heads, tokens)) or tile(heads, tokens)
        return tensor

    monkeypatch.setattr(kda, "replayed", counted)

    script = ["u layers.0.self_attn.state", "p self_attn.state_per_token", "s state self_attn.state_per_token", "c"]
    out = io.StringIO()

    def debugged() -> Debugger:
        console = Console(width=200, file=out, color_system=None)
        debugger = Debugger(console, planned.plan.config, CommandSource(console, io.StringIO(""), False, script),
                            names=planned.names)
        planned.execute([debugger])
        return debugger

    debugged()  # the weights made and the caches warm: the run measured next makes only its tensors
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        debugger = debugged()
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    name = "layers.0.self_attn.state_per_token"
    states = debugger.history[name].array
    shown = sum(e.array.nbytes for n, e in debugger.history.items() if n != name and held(e.array))
    per_chunk = 4 * 18 * 32 * 32 * 4  # [1, Hk, ceil(1100 / 64), K, Kv] float32
    assert states.nbytes == 4 * 1100 * 32 * 32 * 4 and kept <= shown + per_chunk
    assert rows == []  # no state was made for nothing
    assert ("layers.0.self_attn.state_per_token [1, 4, 1100, 32, 32] is made a tile at a time, never held: print a "
            "slice of it, e.g. p self_attn.state_per_token[0, 0, 0, :8]") in out.getvalue()
    assert ("layers.0.self_attn.state_per_token: a state is [B, Hk, K, Kv] or one head's [K, Kv], got shape "
            "[1, 4, 1100, 32, 32]") in out.getvalue()
    np.testing.assert_array_equal(states[0, 1, 700], np.asarray(states)[0, 1, 700])
    assert rows[0] == (slice(1, 2), slice(700, 701))  # the slice: one head's token
