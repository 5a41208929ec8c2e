"""Long contexts from the command line: --attn auto chooses by the estimated memory and says so;
--cache-len's header says the cache is synthetic; a run that cannot fit says so in one line."""

from typer.testing import CliRunner

from stepper import planning
from stepper.cli import run
from stepper.cli.main import app
from stepper.errors import StepperError
from stepper.planning import memory
from stepper.planning.names import planned_names
from stepper.session import RunSpec, prepare


def invoke(*args):
    return CliRunner().invoke(app, list(args))


def estimate(plan):
    return memory.needs(plan, planned_names(plan), "--prompt-len")


def total(plan) -> int:
    return sum(n.bytes for n in estimate(plan))


def test_auto_keeps_the_naive_prefill_when_it_fits_and_says_so_without_the_live_figure():
    plan = prepare(RunSpec(prompt_len=20, decode=1))
    for available in (2**40, 2**35):  # what the machine has left changes from run to run; the line does not
        chosen, why = memory.choose_attn(plan, estimate, available)
        assert chosen is plan
        assert why == (f"--attn auto: naive prefill, absorbed decode (the run needs about {memory.gib(total(plan))}, "
                       "under half the memory available)")
    assert memory.choose_attn(prepare(RunSpec()), estimate, None)[1] == (
        f"--attn auto: naive prefill (the run needs about {memory.gib(total(prepare(RunSpec())))}, the memory "
        "available is not known)")
    fixed = prepare(RunSpec(attn="naive"))
    assert memory.choose_attn(fixed, estimate, 1) == (fixed, None)  # only auto chooses


def test_auto_runs_naive_only_with_half_the_memory_available_to_spare():
    """The margin: the naive prefill where its estimate is at most half of what is available (the
    estimate is not exact, other programs grow), else absorbed, the figure that decided named."""
    plan = prepare(RunSpec(model="kimi-k2", layer=1, prompt_len=4096))
    naive, absorbed = total(plan), total(prepare(RunSpec(model="kimi-k2", layer=1, prompt_len=4096, attn="absorb")))
    assert naive > absorbed > 2**30
    assert memory.choose_attn(plan, estimate, 2 * naive)[0] is plan
    chosen, why = memory.choose_attn(plan, estimate, 2 * naive - 1)
    assert chosen.spec.attn == "absorb" and chosen.spec.prompt_len == 4096
    assert why == (f"--attn auto: absorbed throughout: naive the run would need about {memory.gib(naive)}, over half "
                   f"the {memory.gib(2 * naive - 1)} available; absorbed it needs about {memory.gib(absorbed)}")
    assert memory.choose_attn(plan, estimate, naive)[0].spec.attn == "absorb"  # it fits, but not comfortably


def test_a_prefill_over_a_longer_synthetic_cache_runs_absorbed_whatever_the_memory():
    """As a decode step: the naive path would expand all 131K cached positions to per-head keys
    and values (20.6 GiB for Kimi K2, 64 MiB of it the seeded weights kept made; absorbed 0.6 GiB)."""
    spec = RunSpec(model="kimi-k2", layer=1, prompt_len=1, cache_len=131000, decode=1)
    naive, absorbed = total(prepare(spec)), total(prepare(RunSpec(**{**spec.__dict__, "attn": "absorb"})))
    assert naive > 20 * 2**30 and absorbed < 2**30
    for available in (None, 2**30, 2**50):
        chosen, why = memory.choose_attn(prepare(spec), estimate, available)
        assert chosen.spec.attn == "absorb"
        assert why == ("--attn auto: absorbed throughout: the prefill's 1 position attends over a cache of 131,000, "
                       f"as a decode step does; naive it would need about {memory.gib(naive)}, absorbed it needs about "
                       f"{memory.gib(absorbed)}")


def test_the_readme_long_context_command_says_it_runs_absorbed_and_why(monkeypatch):
    """The command line of docs/usage.md (long contexts), stopped where the layer would start: its header."""
    def stop(plan, sinks):
        raise StepperError(f"stopped before running, attn {plan.spec.attn}")

    monkeypatch.setattr(planning.session, "execute", stop)
    monkeypatch.setattr(memory, "available_bytes", lambda: 2**50)  # plenty: memory is not why
    result = invoke("run", "--model", "kimi-k2", "--layer", "1", "--cache-len", "131000", "--prompt-len", "1",
                    "--decode", "1", "--only", "*attn_weights", "--plain")
    lines = result.output.splitlines()
    assert lines[1].startswith("attention absorb ·")
    assert lines[2].startswith("--attn auto: absorbed throughout: the prefill's 1 position attends over a cache of "
                               "131,000, as a decode step does; naive it would need about 20.6 GiB, absorbed it needs "
                               "about ")
    assert lines[-1] == "stepper: error: stopped before running, attn absorb"


def test_the_header_says_the_cache_is_synthetic_and_the_prompt_follows_it():
    result = invoke("run", "--layer", "0", "--cache-len", "5000", "--prompt-len", "2", "--decode", "1",
                    "--only", "decode0*attn_weights", "--plain")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].endswith("after a synthetic cache of 5,000 positions (seed 0)")
    assert lines[2].startswith("--attn auto: absorbed throughout: the prefill's 2 positions attend over a cache of "
                               "5,000")
    assert "S=5003 attended positions" in result.output
    assert "at positions 5000.." in lines[-1]


def test_a_long_prompt_that_cannot_fit_is_refused_in_one_line_before_it_starts(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda: 2**30)
    result = invoke("run", "--prompt-len", "100000", "--chunk", "0")  # (auto would run it in chunks: test_chunk_option)
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and result.output.startswith("stepper: error: this run would need about ")
    assert "1.0 GiB is available; lower it with --prompt-len" in result.output


def test_a_run_showing_long_attention_says_its_statistics_take_a_while(monkeypatch):
    monkeypatch.setattr(run, "LONG_VALUES", 10**6)
    args = ["run", "--layer", "0", "--prompt-len", "1100", "--plain"]  # 4 heads x 1100 x 1100: made in tiles
    shown = invoke(*args, "--only", "*attn_weights")
    assert shown.exit_code == 0, shown.output
    assert shown.output.splitlines()[3] == ("note: the attention scores and weights shown hold 4.8e+06 values, "
                                            "summarised "
                                            "a tile at a time: their exact statistics take a while (--only can leave "
                                            "them out)")
    assert "note:" not in invoke(*args, "--only", "*k_pe").output


def test_a_patch_of_attention_made_in_tiles_is_one_line():
    result = invoke("run", "--layer", "0", "--prompt-len", "1100", "--patch", "attn_scores=x*0.5", "--plain")
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == (
        "stepper: error: patch attn_scores: layers.0.self_attn.attn_scores [1, 4, 1100, 1100] is made a tile at a "
        "time (a long attention) and never held, so it cannot be patched: patch the queries or keys it is made from, "
        "or run a shorter prompt, whose attention is held whole")


def test_sizes_are_written_in_the_largest_unit_they_reach_never_as_zero():
    assert [memory.gib(n) for n in (0, 12, 300 * 2**10, 21 * 2**20 + 5, int(20.5 * 2**30))] == [
        "0 B", "12 B", "300 KiB", "21 MiB", "20.5 GiB"]
    line = invoke("run", "--plain", "--layer", "0", "--prompt-len", "1").output.splitlines()[2]
    assert line.startswith("--attn auto: naive prefill (the run needs about ") and " 0 MiB" not in line
