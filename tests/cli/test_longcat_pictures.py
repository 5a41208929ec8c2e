"""LongCat-Flash's layer has two attention sublayers (`layers.N.sub0.self_attn.attn_weights`,
`layers.N.sub1.self_attn.attn_weights`): each is drawn as heat maps, as every MLA layer's attention
weights are, by `run --show`, the debugger's `s attention` and the API's picture()."""

import pytest
from helpers.cli import stepper

import stepper as api

SUBLAYERS = ("layers.0.sub0.self_attn.attn_weights", "layers.0.sub1.self_attn.attn_weights")
HEADS = "head 0         head 1         head 2         head 3"


def heat_map_after(out: str, name: str) -> list[str]:
    """The lines of the picture titled `name` (the title alone on its line, then the heads' maps)."""
    lines = out.splitlines()
    assert name in lines, f"no picture titled {name}:\n{out}"
    at = lines.index(name)
    return lines[at:at + 8]


@pytest.mark.parametrize("only", [["--only", "layers.0.sub*.self_attn.attn_weights"], []])
def test_run_show_attention_draws_both_sublayers_heat_maps(only):
    out = stepper("run", "--model", "tiny-longcat", "--prompt-len", "4", "--show", "attention", "--plain", *only)
    assert out.returncode == 0, out.stderr
    for name in SUBLAYERS:
        drawn = heat_map_after(out.stdout, name)
        assert drawn[1] == HEADS and drawn[2].split() == ["t\\s", "0", "1", "2", "3"] * 4, drawn
        assert drawn[3].split()[0] == "0" and "·" in drawn[3], drawn  # query 0's future keys masked
    assert out.stdout.count("attention weights [B=1, H=4, T=4, S=4]") == (2 if only else 4)  # every sublayer shown


def test_step_s_attention_draws_the_sublayers_weights_it_stopped_at():
    out = stepper("step", "--plain", "--model", "tiny-longcat", "--prompt-len", "4", "--break",
                  "layers.0.sub*.self_attn.attn_weights", stdin=f"s attention\nc\ns attention\ns attention "
                  f"{SUBLAYERS[0]}\nq\n").stdout
    assert "s attention draws attention weights" not in out, out
    for name in SUBLAYERS:
        assert heat_map_after(out, name)[1] == HEADS
    assert out.count("attention weights [B=1, H=4, T=4, S=4]") == 3  # sub0 at its stop, sub1 at its, sub0 by name


def test_the_api_lists_and_draws_the_sublayers_attention():
    run = api.run("tiny-longcat", prompt_len=4)
    assert "attention" in run.pictures()
    for name in SUBLAYERS:
        drawn = repr(run.picture("attention", name)).splitlines()
        assert drawn[0] == name and drawn[1] == HEADS, drawn
    with pytest.raises(api.StepperError, match="attention draws a self_attn.attn_weights"):
        run.picture("attention", "layers.0.sub0.self_attn.q")
