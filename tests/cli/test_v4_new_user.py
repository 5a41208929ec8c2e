"""DeepSeek-V4 as a new user meets it (issue #32): what `stepper run --model tiny-v4` and its neighbours print
reads right, and bad input gets one line."""

from __future__ import annotations

import json
import re

import numpy as np
from helpers.cli import refused, stepper

from stepper.catalog import singular


def test_a_dim_of_size_one_names_its_noun_in_the_singular():
    assert singular("positions") == "position"
    assert singular("compressed entries") == "compressed entry"
    assert singular("entries a query attends") == "entry a query attends"
    assert singular("windows closed this step") == "window closed this step"
    assert singular("window slots (2m, m = 4)") == "window slot (2m, m = 4)"
    assert singular("mlp hidden") == "mlp hidden"
    out = stepper("run", "--model", "tiny-v4", "--layer", "1").stdout  # 7 positions: one CSA window (m = 4) closed
    shapes = set(re.findall(r"\[B=1 batch[^\]]*\]", out))
    assert "[B=1 batch, T=7 positions, Ec=1 compressed entry]" in shapes
    assert "[B=1 batch, T=7 positions, Kq=1 entry a query attends]" in shapes
    assert not [s for s in shapes if "entrie," in s or "entrie]" in s or "=1 entries a query attend]" in s]


def test_the_header_names_each_kind_of_layer_as_its_first_line_does():
    lines = stepper("run", "--model", "tiny-v4").stdout.splitlines()
    assert "(1 sliding, 2 CSA, 1 HCA;" in lines[0]
    costs = [line for line in lines[1:4] if line.startswith("cache per position per layer: ")]
    assert [c.split(" B (")[1].split(";")[0] for c in costs] == ["sliding", "CSA, m = 4", "HCA, m = 16"]
    assert costs[2].startswith("cache per position per layer: 8 B (HCA, m = 16; +4,736 B whatever the length)")


def test_fp8_weight_of_a_v4_preset_shows_what_its_synth_checkpoint_stores(tmp_path):
    assert stepper("synth", "--model", "tiny-v4", "--out", tmp_path / "v4").returncode == 0
    for name in ("layers.1.ffn.experts.0.w1.weight", "layers.1.attn.wq_a.weight"):  # FP4 group, FP8 block
        preset = stepper("fp8", "--weight", name, "--model", "tiny-v4", "--json")
        written = stepper("fp8", "--weight", name, "--model", tmp_path / "v4", "--json")
        assert preset.returncode == written.returncode == 0, preset.stderr
        shown, stored = json.loads(preset.stdout), json.loads(written.stdout)
        assert shown.pop("source") == "synthetic weights of tiny-v4, seed 0"
        assert stored.pop("source").startswith("checkpoint ")
        assert shown == stored
    screen = stepper("fp8", "--weight", "layers.1.ffn.experts.0.w1.weight", "--model", "tiny-v4").stdout
    assert screen.startswith("layers.1.ffn.experts.0.w1.weight  FP4 e2m1 [32, 64]  groups of 32  synthetic weights of "
                             "tiny-v4, seed 0")
    missing = refused(stepper("fp8", "--weight", "layers.9.attn.wq_a.weight", "--model", "tiny-v4"))
    assert missing.startswith("synthetic weights of tiny-v4, seed 0: no tensor named 'layers.9.attn.wq_a.weight'")


def test_a_compress_ratios_list_too_short_is_one_line_naming_its_length(tmp_path):
    folder = tmp_path / "v4"
    assert stepper("synth", "--model", "tiny-v4", "--out", folder).returncode == 0
    config = json.loads((folder / "config.json").read_text())
    config["compress_ratios"] = config["compress_ratios"][:2]  # 4 layers + 1 MTP block need 5
    (folder / "config.json").write_text(json.dumps(config))
    assert refused(stepper("inspect", folder)) == (
        "config.json: field 'compress_ratios' has 2 entries, none for layer 2 (expected one per layer, then one per "
        "multi-token-prediction block)")
    assert refused(stepper("run", "--model", folder)).endswith(
        "config.json: field 'compress_ratios' must have 5 entries (num_hidden_layers 4 + num_nextn_predict_layers 1), "
        "got 2")


def test_the_hc_picture_heads_and_sums_each_column_under_its_values():
    out = stepper("run", "--model", "tiny-v4", "--layer", "0", "--show", "hc", "--only", "hc_attn.comb", "--plain")
    lines = out.stdout.splitlines()
    top = next(i for i, line in enumerate(lines) if line.lstrip().startswith("to 0"))
    heads, rows, sums = lines[top], lines[top + 1:top + 5], lines[top + 5]
    assert [r[:6] for r in rows] == ["from 0", "from 1", "from 2", "from 3"] and sums.startswith("col sum")

    def ends(line: str, pattern: str) -> list[int]:
        return [m.end() for m in re.finditer(pattern, line)][:4]

    columns = ends(heads, r"to \d")
    assert len(columns) == 4
    for row in rows:
        assert ends(row, r"\d\.\d{3}") == columns, (heads, row)
    assert ends(sums, r"\d\.\d{4}") == columns, (heads, sums)


def test_the_debugger_points_a_v4_run_at_its_own_pictures():
    commands = "u layers.3.ffn.gate.weights\ns attention\ns routing layers.3.ffn.gate.topk_idx\ns hc\ns routing\nq\n"
    out = stepper("step", "--model", "tiny-v4", "--plain", stdin=commands)
    assert out.returncode == 0 and "Traceback" not in out.stdout + out.stderr
    assert "no tensor 'self_attn.attn_weights' seen yet" not in out.stdout
    assert ("s attention draws MLA's attention weights over positions (self_attn.attn_weights), a tensor "
            "DeepSeek-V4 does not emit: its pictures are s reach (what a query attends), s hc (how the residual "
            "streams mix), s routing, s hist") in out.stdout
    assert out.stdout.count("layers.3.ffn.gate.topk_idx · weights: score-routed") == 2  # named, and at the router
    assert "col sum" in out.stdout  # s hc still draws
    assert any(" · s show reach|hc|routing|hist [NAME] · " in line for line in out.stdout.splitlines())
    assert "attention|routing" not in out.stdout


def test_a_v4_lesson_stop_names_the_pictures_it_has():
    import io

    from rich.console import Console

    from stepper.lessons.schema import find_lesson
    from stepper.lessons.walk import walk
    from stepper.views.debugger import CommandSource

    out = io.StringIO()
    console = Console(file=out, width=200, no_color=True, highlight=False, markup=False, soft_wrap=True)
    walk(find_lesson("compressed-attention"), console, CommandSource(console, io.StringIO("\n\n\nq\n"), False))
    helps = [line for line in out.getvalue().splitlines() if line.startswith("Enter: next stop")]
    assert helps and all(" · s reach|hc|routing|hist · " in line for line in helps), helps


def test_explain_of_another_familys_tensor_shows_it_and_names_the_model_that_emits_it():
    """A tensor of a family of other streams is shown as one of the same streams is
    (tests/cli/test_explain.py): its entry with that family's tiny sizes, under a line naming it."""
    out = stepper("explain", "attn.chosen", "--plain")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("model tiny does not emit it: a tensor of tiny-v4's, shown with its sizes "
                                 "(stepper explain attn.chosen --model tiny-v4)\n\nattn.chosen\n")
    out = stepper("explain", "layers.1.self_attn.k_pe", "--model", "tiny-v4", "--plain")
    assert out.returncode == 0 and out.stdout.startswith(
        "model tiny-v4 does not emit it: a tensor of tiny's, shown with its sizes (stepper explain self_attn.k_pe "
        "--model tiny)\n\nself_attn.k_pe\n")
    assert "rope (rope dims = 16)" in out.stdout  # tiny's rope dims, not V4's 8
    q_pe = stepper("explain", "q_pe", "--model", "tiny-v4", "--plain")  # a short name too
    assert q_pe.returncode == 0 and q_pe.stdout.startswith("model tiny-v4 does not emit it: a tensor of tiny's")
    assert refused(stepper("explain", "nosuch", "--model", "tiny-v4")) == (
        "no tensor named 'nosuch' in the catalogue (stepper tree lists them)")
    own = stepper("explain", "attn.chosen", "--model", "tiny-v4").stdout
    assert own.startswith("attn.chosen\n") and "does not emit" not in own
    debugger = stepper("step", "--plain", "--model", "tiny-v4", stdin="e self_attn.k_pe\ne attn.kv#2\nq\n").stdout
    assert ("(stepper) e self_attn.k_pe\nmodel tiny-v4 does not emit it: a tensor of tiny's, shown with its sizes "
            "(stepper explain self_attn.k_pe --model tiny)\nself_attn.k_pe\n") in debugger  # the debugger's e, alike
    assert "rope (rope dims = 16)" in debugger and "attn.kv#2 is inference's layers.{i}.attn.kv#2" in debugger


def test_a_lone_hash_layer_on_given_streams_says_whose_token_ids_route_it(tmp_path):
    from pathlib import Path

    from safetensors.numpy import load_file

    fixture = Path(__file__).resolve().parents[2] / "fixtures" / "tiny-v4-windows"
    golden = load_file(fixture / "tensors.safetensors")  # prefill.layers.1.streams is layer 1's input
    ids = json.loads((fixture / "manifest.json").read_text())["inputs"]["prompt_ids"]
    run = ("run", "--model", fixture / "weights", "--layer", "1", "--input", fixture / "tensors.safetensors")
    guessed = stepper(*run, "--dump", tmp_path / "guessed.safetensors")
    assert guessed.stdout.splitlines()[0].endswith(
        "layer 1 alone on " + str(fixture / "tensors.safetensors") + ", its hash routing on token ids drawn from the "
        "seed (--ids gives the tokens of those streams)")
    given = stepper(*run, "--ids", ",".join(map(str, ids)), "--dump", tmp_path / "given.safetensors")
    assert "hash routing" not in given.stdout.splitlines()[0]
    want = golden["prefill.layers.1.ffn.gate.hash_idx"]
    assert np.array_equal(load_file(tmp_path / "given.safetensors")["layers.1.ffn.gate.hash_idx"], want)
    assert not np.array_equal(load_file(tmp_path / "guessed.safetensors")["layers.1.ffn.gate.hash_idx"], want)


def test_the_reach_caption_counts_one_key_token_and_entry_in_the_singular():
    def caption(prompt_len: int) -> str:
        out = stepper("run", "--model", "tiny-v4", "--layer", "3", "--prompt-len", prompt_len, "--show", "reach",
                      "--only", "attn.chosen", "--plain").stdout
        return next(line for line in out.splitlines() if " key" in line and "the window's" in line)

    assert caption(1) == ("1 key: the window's 1 token (positions 0..0) + 0 of the 0 visible entries "
                          "((p+1)//m = (0+1)//4)")
    assert caption(4) == ("5 keys: the window's 4 tokens (positions 0..3) + 1 of the 1 visible entry "
                          "((p+1)//m = (3+1)//4)")


def test_the_clamp_counts_say_how_often_the_clamp_bites():
    out = stepper("explain", "ffn.experts.clamp_counts", "--model", "tiny-v4", "--plain").stdout
    assert "How often each routed expert's clamp bites: gate values above L, up values outside [-L, L]" in out


def test_show_of_another_familys_picture_says_which_this_model_draws():
    assert refused(stepper("run", "--model", "tiny-v4", "--show", "attention,hc")) == (
        "--show attention,hc: attention is not drawn for this model; its pictures are hc, reach, routing, hist")
    assert refused(stepper("run", "--show", "reach")) == (
        "--show reach: reach is not drawn for this model; its pictures are attention, routing, hist, scales")
    assert refused(stepper("run", "--model", "tiny-v4", "--show", "nosuch")) == (
        "--show nosuch: unknown picture 'nosuch'; choose from attention, routing, hist, scales, hc, reach, state")


def test_the_api_draws_v4_pictures_as_the_command_line_does():
    import stepper as api

    run = api.run(model="tiny-v4", prompt_len=9, layer=1, decode=1)
    cli = stepper("run", "--model", "tiny-v4", "--prompt-len", "9", "--layer", "1", "--decode", "1",
                  "--show", "hc,reach", "--only", "attn.chosen", "--only", "hc_attn.comb", "--plain").stdout
    for kind, name in (("reach", "prefill.layers.1.attn.chosen"), ("reach", "decode0.layers.1.attn.chosen"),
                       ("hc", "prefill.layers.1.hc_attn.comb")):
        drawn = repr(run.picture(kind, name)).splitlines()
        assert drawn[0].startswith(name) and len(drawn) > 5, drawn  # the picture, not a histogram
        assert all(line in cli.splitlines() for line in drawn[1:] if not line.startswith("RMS")), (kind, name)


def test_a_stream_made_nan_or_infinite_is_drawn_not_a_traceback():
    """A patch that overflows the streams (or `set` to NaN in the debugger) reaches the hc picture:
    its cells and bars are '!' with a legend, the run ends well, the debugger's prompt comes back."""
    out = stepper("run", "--model", "tiny-v4", "--prompt-len", "8", "--plain", "--patch",
                  "embed_streams=x[0,0]=x[0,0]*1e39", "--only", "layers.1.hc_ffn.comb", "--show", "hc")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    lines = out.stdout.splitlines()
    assert "from 0    !   nan !   nan !   nan !   nan  nan" in lines and "! NaN or infinite" in lines
    session = stepper("step", "--model", "tiny-v4", "--prompt-len", "20", "--plain",
                      stdin="set [0,0,0] = nan\nb attn.chosen\nc\ns hc\nq\n")
    assert session.returncode == 0 and "Traceback" not in session.stderr, session.stderr
    assert "! NaN or infinite" in session.stdout and "quit after" in session.stdout.splitlines()[-1]


def test_synth_of_v4_refuses_a_storage_option_saying_what_it_writes(tmp_path):
    for option, value in (("--quant", "int4"), ("--layout", "kimi_k25"), ("--layers", "1")):
        assert refused(stepper("synth", "--model", "tiny-v4", option, value, "--out", tmp_path / "ck")) == (
            f"{option} {value}: model tiny-v4 (deepseek_v4) is written whole and as published (FP8 with E8M0 block "
            f"scales, FP4 routed experts); leave {option} out")
    assert not (tmp_path / "ck").exists()
