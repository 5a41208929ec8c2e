"""`stepper run --chunk N|auto`: the prefill in chunks as asked, or (auto) only where the whole
prompt's estimated memory does not fit, the largest chunk that does; a line under the header says
so; refused in one line where a run needs the whole prompt's tensors as they are made."""

import numpy as np
from typer.testing import CliRunner

from stepper import prefill
from stepper.cli.main import app
from stepper.planning import memory
from stepper.session import RunSpec, prepare


def invoke(*args):
    return CliRunner().invoke(app, list(args))


def estimate(plan):
    return memory.needs(plan, [], "--only")


def total(plan) -> int:
    return sum(n.bytes for n in estimate(plan))


def test_auto_runs_the_whole_prompt_where_it_fits_and_the_largest_chunk_that_fits_where_not():
    plan = prepare(RunSpec(prompt_len=100000))
    assert memory.choose_chunk(plan, estimate, 2**40, None) == (plan, None)
    assert memory.choose_chunk(plan, estimate, None, None) == (plan, None)  # nothing known of the machine
    room = 2**30
    chosen, why = memory.choose_chunk(plan, estimate, room, None)
    assert chosen.spec.chunk == 4096 and total(chosen) <= room < total(plan)  # 4.3 GiB whole, about 0.8 in chunks
    assert why == (f"--chunk auto: the whole prompt would need about {memory.gib(total(plan))} and 1.0 GiB is "
                   "available, "
                   "so the prefill runs 4,096 positions at a time (25 chunks, each tensor still shown whole over the "
                   "100,000 positions)")
    smaller, _ = memory.choose_chunk(plan, estimate, total(chosen) - 1, None)
    assert smaller.spec.chunk < 4096 and total(smaller) < total(chosen)


def test_a_chunk_asked_for_is_kept_and_said_and_a_chunk_as_long_as_the_prompt_is_the_whole_prompt():
    plan = prepare(RunSpec(prompt_len=20))
    chosen, why = memory.choose_chunk(plan, estimate, 1, 6)
    assert chosen.spec.chunk == 6 and why.startswith("--chunk 6: the prefill runs 6 positions at a time (4 chunks,")
    assert memory.choose_chunk(plan, estimate, 1, 20)[0].spec.chunk == 0
    assert memory.choose_chunk(plan, estimate, 1, 0) == (plan, None)


def test_the_line_under_the_header_and_the_refusals():
    result = invoke("run", "--layer", "1", "--prompt-len", "9", "--chunk", "4", "--only", "attn_weights", "--plain")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[3].startswith("--chunk 4: the prefill runs 4 positions at a time (3 chunks")
    assert "T=9 positions, S=9 attended positions" in result.output and result.output.count("attn_weights") == 1
    for extra, why in ((["--show", "attention"], "--show draws from whole tensors"),
                       (["--patch", "q_a=0"], "--patch changes tensors as the prefill makes them")):
        refused = invoke("run", "--prompt-len", "9", "--chunk", "4", *extra)
        assert refused.exit_code == 2 and refused.output == (
            f"stepper: error: --chunk 4: {why}, so the prompt must run whole: give --chunk 0\n")
    bad = invoke("run", "--chunk", "-3")
    assert bad.exit_code == 2 and bad.output.startswith("stepper: error: --chunk must be a number of positions")


def test_only_the_names_shown_are_gathered_chunk_by_chunk(monkeypatch):
    gathered = []

    class Part(prefill.Part):
        def __init__(self, event, *rest):
            gathered.append(event.name)
            super().__init__(event, *rest)

    monkeypatch.setattr(prefill, "Part", Part)
    result = invoke("run", "--prompt-len", "9", "--chunk", "4", "--only", "compressed_kv", "--plain")
    assert result.exit_code == 0, result.output
    assert gathered == [f"layers.{i}.self_attn.compressed_kv" for i in range(3)]  # not the attention scores, ...


def test_a_chunked_runs_dump_holds_the_whole_prompts_tensors(tmp_path):
    from safetensors.numpy import load_file

    files = {}
    for chunk in ("0", "3"):
        files[chunk] = tmp_path / f"chunk{chunk}.safetensors"
        result = invoke("run", "--layer", "0", "--prompt-len", "8", "--chunk", chunk, "--only", "attn_weights",
                        "--only", "q_a", "--dump", str(files[chunk]), "--plain")
        assert result.exit_code == 0, result.output
    whole, chunked = load_file(files["0"]), load_file(files["3"])
    assert list(chunked) == list(whole) and chunked["layers.0.self_attn.attn_weights"].shape == (1, 4, 8, 8)
    for name in whole:
        np.testing.assert_allclose(chunked[name], whole[name], rtol=1e-5, atol=1e-6)


def test_a_chunked_runs_estimate_counts_what_it_holds_for_every_prompt_position():
    """In chunks, what grows with the prompt is its cache and its token ids and positions (the lone
    layer's input is made a chunk at a time: tests/model/test_chunked_prefill.py)."""
    plan = prepare(RunSpec(layer=0, prompt_len=2**15, attn="absorb", chunk=4096))
    parts = {n.what: n.bytes for n in estimate(plan)}
    assert parts["the prompt's token ids and positions"] == 2**15 * (32 + 8 + 8 + 8)
    assert parts["the cache of 1 layer"] == 2**15 * 576  # tiny's latent 128 and rope key 16, float32
    longer = {n.what: n.bytes for n in estimate(prepare(RunSpec(layer=0, prompt_len=2**16, attn="absorb", chunk=4096)))}
    assert longer["one layer's tensors"] == parts["one layer's tensors"]  # a chunk's, whatever the prompt
