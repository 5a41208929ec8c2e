"""Long contexts from the command line: --attn auto chooses by the estimated memory and says so;
--cache-len's header says the cache is synthetic; a run that cannot fit says so in one line."""

from typer.testing import CliRunner

from stepper.cli import memory, run
from stepper.cli.main import app
from stepper.cli.names import planned_names
from stepper.session import RunSpec, prepare


def invoke(*args):
    return CliRunner().invoke(app, list(args))


def estimate(plan):
    return memory.needs(plan, planned_names(plan), "--prompt-len")


def test_auto_keeps_the_naive_prefill_when_it_fits_and_says_so():
    plan = prepare(RunSpec(prompt_len=20, decode=1))
    chosen, why = memory.choose_attn(plan, estimate, 2**40)
    assert chosen is plan
    assert why.startswith("--attn auto: naive prefill, absorbed decode (the run needs about ")
    fixed = prepare(RunSpec(attn="naive"))
    assert memory.choose_attn(fixed, estimate, 1) == (fixed, None)  # only auto chooses


def test_auto_goes_absorbed_when_the_naive_caches_would_not_fit():
    plan = prepare(RunSpec(model="kimi-k2", layer=1, prompt_len=1, cache_len=131071))
    naive = sum(n.bytes for n in estimate(plan))
    absorbed = sum(n.bytes for n in estimate(prepare(RunSpec(model="kimi-k2", layer=1, prompt_len=1, cache_len=131071,
                                                               attn="absorb"))))
    assert naive > 10 * 2**30 > 2 * 2**30 > absorbed  # 10.7 GB of per-head keys and values at 128K positions
    chosen, why = memory.choose_attn(plan, estimate, 4 * 2**30)
    assert chosen.spec.attn == "absorb"
    assert why == (f"--attn auto: absorbed throughout: with the naive prefill's per-head keys and values the run "
                   f"would need about {memory.gib(naive)}, absorbed about {memory.gib(absorbed)}, and 4.0 GiB is available")


def test_the_header_says_the_cache_is_synthetic_and_the_prompt_follows_it():
    result = invoke("run", "--layer", "0", "--cache-len", "5000", "--prompt-len", "2", "--decode", "1",
                    "--only", "decode0*attn_weights", "--plain")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].endswith("after a synthetic cache of 5,000 positions (seed 0)")
    assert lines[2].startswith("--attn auto: naive prefill, absorbed decode")
    assert "S=5003 attended positions" in result.output
    assert "at positions 5000.." in lines[-1]


def test_a_long_prompt_that_cannot_fit_is_refused_in_one_line_before_it_starts(monkeypatch):
    monkeypatch.setattr(run, "available_bytes", lambda: 2**30)
    result = invoke("run", "--prompt-len", "100000", "--chunk", "0")  # (auto would run it in chunks: test_chunk_option)
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and result.output.startswith("stepper: error: this run would need about ")
    assert "1.0 GiB is available; lower it with --prompt-len" in result.output


def test_a_run_showing_long_attention_says_its_statistics_take_a_while(monkeypatch):
    monkeypatch.setattr(run, "LONG_VALUES", 10**6)
    args = ["run", "--layer", "0", "--prompt-len", "1100", "--plain"]  # 4 heads x 1100 x 1100: made in tiles
    shown = invoke(*args, "--only", "*attn_weights")
    assert shown.exit_code == 0, shown.output
    assert shown.output.splitlines()[3] == ("note: the attention scores and weights shown hold 4.8e+06 values, summarised "
                                            "a tile at a time: their exact statistics take a while (--only can leave "
                                            "them out)")
    assert "note:" not in invoke(*args, "--only", "*k_pe").output


def test_a_patch_of_attention_made_in_tiles_is_one_line():
    result = invoke("run", "--layer", "0", "--prompt-len", "1100", "--patch", "attn_scores=x*0.5", "--plain")
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == (
        "stepper: error: --patch attn_scores: layers.0.self_attn.attn_scores [1, 4, 1100, 1100] is made a tile at a "
        "time (a long attention) and never held, so it cannot be patched")
