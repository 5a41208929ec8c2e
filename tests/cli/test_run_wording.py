"""What `stepper run` and `stepper step` say, read as a new user reads it: pictures asked for are
drawn (or refused with the reason), a bare global name is the global, counts agree with their
nouns, and errors name what is wrong."""

import re
from html import unescape

import numpy as np
import pytest
from typer.testing import CliRunner

from stepper.cli.main import app, main
from stepper.seams.trace import Recorder
from stepper.session import RunSpec, run


def stepper(*args: str, stdin: str = ""):
    return CliRunner().invoke(app, list(args), input=stdin)


def recorded(**spec) -> dict[str, np.ndarray]:
    recorder = Recorder()
    run(RunSpec(**spec), [recorder])
    return recorder.tensors()


def picks(out: str) -> list[list[tuple[int, float]]]:
    """The routing map's rows: each token's listed (expert, weight) picks."""
    rows = re.findall(r"^ +\d+ [█▓▒░·]+  (.*)$", out, re.MULTILINE)
    return [[(int(e), float(w)) for e, w in re.findall(r"e(\d+) ([\d.]+)", row)] for row in rows]


@pytest.mark.parametrize("only", ["*topk_idx", "*topk_weight"])
def test_routing_is_drawn_when_either_of_the_router_choices_is_shown(only):
    """Either one of topk_idx / topk_weight shown is enough; to a pipe no pick list is cut at 80 columns."""
    out = stepper("run", "--plain", "--only", only, "--show", "routing")
    assert out.exit_code == 0, out.stderr
    tensors = recorded()
    rows = picks(out.stdout)
    assert len(rows) == 2 * 7  # layers 1 and 2, 7 tokens each
    for layer, first in ((1, 0), (2, 7)):
        idx, weight = tensors[f"layers.{layer}.mlp.gate.topk_idx"], tensors[f"layers.{layer}.mlp.gate.topk_weight"]
        for t in range(7):
            assert [e for e, _ in rows[first + t]] == idx[t].tolist()  # all four, in rank order
            np.testing.assert_allclose([w for _, w in rows[first + t]], weight[t], atol=0.005)
    assert "…" not in "".join(re.findall(r"^ +\d+ [█▓▒░·]+.*$", out.stdout, re.MULTILINE))


def test_a_picture_no_shown_tensor_gives_is_refused_with_the_reason():
    out = stepper("run", "--only", "*k_pe", "--show", "routing")
    assert out.exit_code == 2
    assert ("--show routing: it is drawn from mlp.gate.topk_idx or mlp.gate.topk_weight, and this run shows none"
            in out.stderr)
    out = stepper("run", "--layers", "0:1", "--show", "attention,routing")
    assert out.exit_code == 2 and "--show routing" in out.stderr  # layer 0 is dense: no router
    assert stepper("run", "--only", "*k_pe", "--show", "hist").exit_code == 0


def test_routing_in_the_debugger_before_topk_weight_says_what_to_do():
    out = stepper("step", "--plain", "--until", "layers.1.mlp.gate.topk_idx", stdin="s routing\nq\n")
    assert ("s routing draws layers.1.mlp.gate.topk_idx with its topk_weight, which comes next: n, then s routing"
            in out.stdout)


def test_a_bare_global_name_is_the_global():
    out = stepper("run", "--plain", "--only", "logits", "--decode", "1")
    assert out.exit_code == 0, out.stderr
    names = re.findall(r"^(\S+)  \[", out.stdout, re.MULTILINE)
    assert names == ["prefill.logits", "decode0.logits"]
    assert out.stderr == ""
    layers = re.findall(r"^(\S+)  \[", stepper("run", "--plain", "--only", "mlp.gate.logits").stdout, re.MULTILINE)
    assert layers == ["layers.1.mlp.gate.logits", "layers.2.mlp.gate.logits"]
    globbed = re.findall(r"^(\S+)  \[", stepper("run", "--plain", "--only", "*logits").stdout, re.MULTILINE)
    assert globbed == ["layers.1.mlp.gate.logits", "layers.2.mlp.gate.logits", "logits"]


def test_a_layer_alone_says_its_decode_tokens_come_from_the_seed():
    out = stepper("run", "--plain", "--layer", "1", "--decode", "2", "--only", "output")
    assert ("then 2 decode steps on tokens drawn from the seed (a layer alone has no logits to choose them)"
            in out.stdout)
    whole = stepper("run", "--plain", "--decode", "2", "--only", "output")
    assert "drawn from the seed" not in whole.stdout
    assert "with --layer, drawn from the seed" in " ".join(stepper("run", "--help").stdout.split())


def test_counts_agree_with_their_nouns_and_positions_are_a_range():
    out = stepper("run", "--plain", "--only", "embed", "--prompt-len", "1", "--start-pos", "5")
    assert "embed  [B=1 batch, T=1 position, 320 hidden]" in out.stdout
    assert out.stdout.rstrip().endswith("1 tensor · prompt [522] at position 5")
    out = stepper("run", "--plain", "--only", "embed", "--ids", "1,2,3", "--start-pos", "5000")
    assert "2 tensors" not in out.stdout and "prompt [1, 2, 3] at positions 5000..5002" in out.stdout
    step = stepper("step", "--plain", "--break", "rope_cos", stdin="c\n")  # the one tensor passed: embed
    assert "(1 tensor passed)" in step.stdout
    quit_ = stepper("step", "--plain", stdin="q\n")
    assert "quit after 1 tensor\n" in quit_.stdout
    topk = stepper("step", "--plain", "--decode", "1", "--until", "decode0.layers.1.mlp.gate.topk_weight",
                   stdin="s routing\nq\n")
    assert "1 token × top-4" in topk.stdout and "[N=1 token, 4 chosen experts]" in topk.stdout


def test_the_attn_option_shows_its_choices():
    assert "--attn naive|absorb|auto" in CliRunner().invoke(app, ["run", "--help"], terminal_width=200).stdout


@pytest.mark.parametrize(("layers", "message"), [
    ("5:2", "--layers 5:2 is reversed: A:B shows layers A to B-1, so A comes first (--layers 2:5)"),
    ("2:2", "--layers 2:2 is empty: A:B shows layers A to B-1 (--layers 2:3 for layer 2)"),
    ("1:9", "layers 1:9 out of range: model tiny has layers 0..2"),
])
def test_layers_reversed_empty_or_out_of_range_are_told_apart(layers, message):
    out = stepper("run", "--layers", layers)
    assert out.exit_code == 2 and message in out.stderr


@pytest.mark.parametrize(("option", "suggestion"), [
    ("--bogus", ""), ("--prompt-lenn", " (did you mean --prompt-len?)"),
    ("--prompt-le", " (did you mean --prompt or --prompt-len?)"),
    ("--start_pos", " (did you mean --start-pos?)"),
])
def test_an_unknown_option_suggests_only_close_ones(option, suggestion, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["stepper", "run", option])
    with pytest.raises(SystemExit) as ended:
        main()
    assert ended.value.code == 2
    assert capsys.readouterr().err == f"stepper: error: No such option: {option}{suggestion} (see stepper run --help)\n"


def test_the_html_export_wraps_long_lines(tmp_path):
    html = tmp_path / "session.html"
    out = stepper("step", "--plain", "--until", "layers.1.mlp.gate.topk_weight", "--export", str(html), stdin="?\nq\n")
    assert out.exit_code == 0, out.stderr
    page = html.read_text()
    pre = re.search(r"<pre style=\"([^\"]*)\"", page).group(1)
    assert "white-space:pre-wrap" in pre and "overflow-wrap:anywhere" in pre
    text = unescape(re.sub(r"<[^>]+>", "", page))
    assert "(stepper) ?" in text and "e.g. x compressed_kv kv_a[..., :128]" in text


@pytest.mark.parametrize("typed", ["-1", "-0x01", "-2.5"])
def test_a_negative_number_read_as_an_option_is_told_to_go_after_the_double_dash(typed, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["stepper", "fp8", "--fp4", typed])
    with pytest.raises(SystemExit) as ended:
        main()
    assert ended.value.code == 2
    assert capsys.readouterr().err == (f"stepper: error: {typed} was read as an option; a negative number goes after "
                                       f"--: stepper fp8 ... -- {typed} (see stepper fp8 --help)\n")
