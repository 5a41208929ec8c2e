"""A run, a tensor, a picture and a diff display themselves in a notebook with the terminal's rows."""

import html
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.terminal import on_terminal
from rich.console import Console

import stepper
from stepper.errors import StepperError
from stepper.views import diff_table, kda_state, notebook, routing_map
from stepper.views.sinks import TensorRows

ROOT = Path(__file__).resolve().parents[2]


def visible(page: str) -> str:
    """The text a browser shows of an exported <pre> block."""
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def terminal(renderable) -> str:
    console = Console(file=io.StringIO(), width=160, no_color=True, highlight=False, markup=False, soft_wrap=True)
    console.print(renderable)
    return console.file.getvalue()


@pytest.fixture(scope="module")
def run():
    return stepper.run("tiny", ids=[1, 2, 3], keep=["*k_pe", "topk*", "layers.1.*attn_weights"])


def test_a_run_shows_a_line_per_step_and_layer_not_every_tensor(run):
    shown = visible(run._repr_html_()).splitlines()
    assert shown == [
        "<stepper.Run tiny: 8 tensors kept of 104, prompt [1, 2, 3], generated []>",
        "layer 0 (dense)     1 kept  self_attn.k_pe",
        "layer 1 (MoE)       4 kept  self_attn.k_pe, self_attn.attn_weights, mlp.gate.topk_idx, mlp.gate.topk_weight",
        "layer 2 (MoE)       3 kept  self_attn.k_pe, mlp.gate.topk_idx, mlp.gate.topk_weight",
        ('run["NAME"] a tensor · run.show(NAME) its row · run.picture("attention"|"routing"|"hist", NAME) · '
        "run.names every name"),
    ]
    v4 = stepper.run("tiny-v4", ids=[1, 2, 3], keep=["*comb", "*chosen"])  # its own pictures, as its run draws them
    assert visible(v4._repr_html_()).splitlines()[-1].startswith('run["NAME"] a tensor · run.show(NAME) its row · '
                                                                 'run.picture("hc"|"reach"|"hist", NAME)')


def test_a_long_run_shows_its_first_steps_and_layers_within_the_width():
    run = stepper.run("tiny", ids=[1, 2, 3], decode=6)  # 7 steps x (model + 3 layers) = 28 lines
    shown = visible(run._repr_html_()).splitlines()
    assert len(shown) == 1 + notebook.SCOPES + 2 and shown[-2] == "... 4 more steps and layers"
    assert shown[notebook.SCOPES] == "decode4 · layer 2 (MoE)      32 kept  " + shown[notebook.SCOPES][38:]
    assert max(map(len, shown)) == notebook.WIDTH and shown[2].endswith("…")  # cut at the width, said so
    assert len(run._repr_html_()) < 10_000


def test_a_tensor_and_a_picture_show_as_in_the_terminal(run):
    view = run.show("layers.1.self_attn.k_pe")
    rows = TensorRows(Console(file=io.StringIO()), run.config)
    expected = terminal(rows.render(run.event("layers.1.self_attn.k_pe")))
    assert repr(view) == expected.rstrip("\n") and visible(view._repr_html_()).strip() == expected.strip()
    routing = run.picture("routing", "layers.1.mlp.gate.topk_idx")
    drawn = terminal(routing_map.routing_map(run["layers.1.mlp.gate.topk_idx"], run["layers.1.mlp.gate.topk_weight"],
                                             32))
    assert visible(routing._repr_html_()).strip() == drawn.strip()
    assert repr(run.picture("routing", "layers.1.mlp.gate.topk_weight")) == repr(routing)  # either, as --show takes
    with pytest.raises(StepperError, match="picture: routing draws a mlp.gate.topk_idx or a mlp.gate.topk_weight, "
                                           "and layers.1.self_attn.k_pe is not one"):
        run.picture("routing", "layers.1.self_attn.k_pe")


def test_routing_is_drawn_from_the_router_not_the_indexer():
    run = stepper.run("tiny-v32", ids=[1, 2, 3], keep="*topk*")
    with pytest.raises(StepperError, match="layers.1.self_attn.indexer.topk_idx is not one"):
        run.picture("routing", "layers.1.self_attn.indexer.topk_idx")
    assert "experts used" in repr(run.picture("routing", "layers.1.mlp.gate.topk_weight"))


def test_a_diff_shows_its_rows_growth_and_first_difference(run):
    other = stepper.run("tiny", ids=[1, 2, 3], keep=["*k_pe", "topk*", "layers.1.*attn_weights"],
                        patch=stepper.force_experts(2, [0, 1, 2, 3]))
    d = stepper.diff(run, other)
    shown = visible(d._repr_html_())
    assert terminal(diff_table.render(d)).strip() == shown.strip()  # the notebook's: the whole table
    assert terminal(d).strip() == terminal(diff_table.render(d, 160)).strip()  # rich.print(d): fitted to its width
    assert "first difference: layers.2.mlp.gate.topk_idx" in shown and "differs from mlp.gate.topk_idx" in shown
    assert repr(d).startswith("<stepper.Diff 8 tensors: 6 same, 0 close, 2 differ; first difference "
                              "layers.2.mlp.gate.topk_idx")


def test_the_example_in_docs_runs(tmp_path):
    page = tmp_path / "example.html"
    out = subprocess.run([sys.executable, str(ROOT / "docs" / "api_example.py"), str(page)], capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert "zeroing expert" in out.stdout and "first difference prefill.layers.1.mlp.gate.topk_weight" in out.stdout
    text = visible(page.read_text(encoding="utf-8"))
    assert "prefill.layers.1.self_attn.compressed_kv  [B=1 batch, T=4 positions, 128 kv latent]" in text
    assert ("experts used" in text and "head 0" in text
            and "first difference: prefill.layers.1.mlp.gate.topk_weight" in text)


def test_a_display_keeps_its_lines_whole_on_a_narrow_page_and_wraps_a_long_caption_at_the_width(run):
    """JupyterLab's output area wraps a <pre>'s lines (white-space: pre-wrap; word-break: break-all),
    which broke a routing grid or a diff's table mid-row on a page narrower than its 160 columns:
    each display's <pre> keeps its lines whole and scrolls sideways. A caption (Kimi Linear's state
    picture's, 314 characters) wraps between words, as on a terminal (under its table, at the table's width)."""
    kimi = stepper.run("tiny-kimi-linear", ids=[17, 40, 99, 3], keep="layers.0.self_attn.*")
    state = kimi.picture("state", "layers.0.self_attn.state")
    shown = [run, run.show("layers.1.self_attn.k_pe"), run.picture("routing", "layers.1.mlp.gate.topk_idx"), state,
             stepper.diff(run, run)]
    for page in (s._repr_html_() for s in shown):
        style = dict(rule.split(":") for rule in re.findall(r'<pre style="([^"]*)"', page)[0].split(";"))
        assert (style["white-space"], style["overflow-x"]) == ("pre", "auto"), style
    lines = visible(state._repr_html_()).splitlines()
    assert max(map(len, lines)) <= notebook.WIDTH and max(map(len, repr(state).splitlines())) <= notebook.WIDTH
    assert " ".join(kda_state.STATISTICS_NOTE.split()) in " ".join(" ".join(lines).split())  # every word, in order


def test_a_display_printed_at_a_python_prompt_fits_its_terminal_as_stepper_run_fits_it():
    """repr(run.picture(...)) or print(run.show(...)) in a Python prompt on an 80-column terminal:
    laid out for 80 columns, its caption wrapped between words (it was laid out for 160, and the
    terminal broke its lines mid-word); to a pipe, 160 columns as before."""
    script = ("import stepper\n"
              "run = stepper.run('tiny', ids=[17, 402, 999, 3], keep='layers.1.mlp.gate.*')\n"
              "print(repr(run.picture('routing', 'layers.1.mlp.gate.topk_idx')))\n")
    screen = on_terminal(columns=80, python=script)
    run = stepper.run("tiny", ids=[17, 402, 999, 3], keep="layers.1.mlp.gate.*")
    drawn = routing_map.routing_map(run["layers.1.mlp.gate.topk_idx"], run["layers.1.mlp.gate.topk_weight"], 32)
    fitted = Console(file=io.StringIO(), width=80, no_color=True, highlight=False, markup=False)
    fitted.print(drawn)
    assert screen.code == 0 and screen.lines == [line.rstrip() for line in fitted.file.getvalue().splitlines()]
    assert any(line.startswith("the router's order") for line in screen.lines)  # the caption's second line
    assert repr(run.picture("routing", "layers.1.mlp.gate.topk_idx")) == notebook.text([drawn]).rstrip("\n")  # a pipe
