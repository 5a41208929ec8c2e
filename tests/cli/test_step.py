"""`stepper step` driven through piped commands, asserting on the text it prints."""

import re
import subprocess
from html import unescape

import numpy as np
import pytest
from helpers.cli import stepper

from stepper.seams.trace import Recorder
from stepper.session import RunSpec, run


def step(*args: str, commands: str = "") -> subprocess.CompletedProcess:
    return stepper("step", "--plain", *args, stdin=commands)


@pytest.fixture(scope="module")
def tensors():
    rec = Recorder()
    run(RunSpec(), [rec])
    return rec.tensors()


def stops(out: str) -> list[str]:
    """The breadcrumbs of the stops, in order."""
    return [line for line in out.splitlines() if " › " in line]


def test_next_steps_one_tensor_at_a_time():
    out = step(commands="n\nn\nq\n").stdout
    assert stops(out)[:3] == ["model › embed", "model › latent attention › rope_cos",
                              "model › latent attention › rope_sin"]
    assert "(stepper) n" in out and "n next (Enter)" in out


def test_breakpoint_hits_the_right_tensor_every_layer():
    out = step("--break", "compressed_kv", commands="c\nc\nq\n").stdout
    assert stops(out) == [
        "layer 0 (dense) › latent attention › compressed_kv",
        "layer 1 (MoE) › latent attention › compressed_kv",
        "layer 2 (MoE) › latent attention › compressed_kv",
    ]
    assert "layers.1.self_attn.compressed_kv  [B=1 batch, T=7 positions, 128 kv latent]" in out
    assert "passed)" in out  # the tensors run through between stops are counted


def test_break_and_delete_from_the_prompt():
    out = step(commands="b topk_idx\nc\nd topk_idx\nc\n").stdout
    assert stops(out) == ["model › embed", "layer 1 (MoE) › MoE router › mlp.gate.topk_idx"]
    assert "breakpoints: none" in out


def test_until_stops_where_asked():
    out = step("--until", "layers.2.mlp.gate.topk_weight", commands="q\n").stdout
    assert stops(out) == ["layer 2 (MoE) › MoE router › mlp.gate.topk_weight"]
    out = step(commands="u attn_weights\nu attn_weights\nq\n").stdout
    assert stops(out)[1:] == ["layer 0 (dense) › latent attention › attn_weights",
                              "layer 1 (MoE) › latent attention › attn_weights"]


def test_print_slices_show_the_right_values(tensors):
    out = step("--until", "layers.1.self_attn.k_pe", commands="p self_attn.k_pe[0,0,:2,:3] 5\nq\n").stdout
    expected = tensors["layers.1.self_attn.k_pe"][0, 0, :2, :3]
    block = out[out.index("layers.1.self_attn.k_pe[0,0,:2,:3]"):]
    assert "[2x3]" in block.splitlines()[0]
    printed = [float(v) for line in block.splitlines()[1:3] for v in line.replace("[", " ").replace("]", " ").split()]
    np.testing.assert_allclose(printed, expected.ravel(), atol=1e-5)


def test_brackets_in_a_row_are_taken_in_turn_as_numpy_takes_them(tensors):
    """`p embed[0][1][:3]` is embed[0][1][:3], not embed[:3] under that label; an index out of
    range names the tensor's shape; a slice of a slice works in x too."""
    out = step("--until", "layers.1.self_attn.k_pe",
               commands="p embed[0][1][:3] 6\np embed[0][9]\nx k_pe[0][0] kv_a[0][:, 128:]\nq\n").stdout
    expected = tensors["embed"][0][1][:3]
    line = out.splitlines()[out.splitlines().index("embed[0][1][:3]  [3]  float32") + 1]
    assert line == "[" + " ".join(f"{v:.6f}" for v in expected) + "]"
    assert "bad slice [0][9] for shape [1, 7, 320]: index 9 is out of bounds for axis 0 with size 7" in out
    assert f"max |a - b| = 0 · max |b| = {np.abs(tensors['layers.1.self_attn.k_pe']).max():.4g}" in out


def test_digits_and_history_counts_out_of_range_are_refused_and_the_session_goes_on():
    out = step(commands="p embed[0,0,:1] 100000\np embed 99999999999999999999\np embed[0, 0, :3] -1\nh -1\n"
                        "h x\nh 0\np embed[0, 0, :2] 16\nq\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("p NAME DIGITS: digits after the point must be 0 to 16, got ") == 3
    assert out.stdout.count("h N lists the latest N tensors (h alone: 20), e.g. h 50") == 3  # h 0 listed them all
    assert "embed[0, 0, :2]  [2]  float32" in out.stdout


def test_a_large_tensor_prints_its_first_lines_and_how_to_see_the_rest():
    """NumPy elides only axes longer than 8: Kimi Linear's [1, 4, 7, 32, 32] state per token would
    be about 500 lines; p prints 60 and names a slice."""
    out = step("--model", "tiny-kimi-linear", "--until", "state_per_token", commands="p state_per_token\nq\n").stdout
    block = out[out.index("layers.0.self_attn.state_per_token  [1x4x7x32x32]"):].splitlines()
    ends = next(i for i, line in enumerate(block) if line.startswith("... "))
    assert ends == 61 and re.fullmatch(r"\.\.\. \d+ more lines: print a slice, e\.g\. p state_per_token\[0, 0, 0\]",
                                       block[ends])


def test_history_keeps_earlier_tensors_inspectable(tensors):
    out = step("--until", "layers.2.output", commands="p layers.0.self_attn.q_pe[0,1,2,0] 6\nh 3\nq\n").stdout
    assert f"{tensors['layers.0.self_attn.q_pe'][0, 1, 2, 0]:.6f}" in out
    assert "layers.2.mlp_output" in out  # in the last 3 of the history


def test_explain_shows_the_catalogue_text():
    out = step("--until", "compressed_kv", commands="e\ne kv_cmpr\nq\n").stdout
    assert "This latent is what Multi-head Latent Attention caches" in out
    assert "formula" in out and "modeling_deepseek.py" in out


def test_where_shows_done_current_and_pending():
    out = step("--until", "layers.1.self_attn.kv", commands="w\nq\n").stdout
    tree = out[out.index("layer 1 (MoE)\n") if "layer 1 (MoE)\n" in out else out.index("(stepper) w"):]
    assert "✓ self_attn.compressed_kv" in tree and "▶ self_attn.kv" in tree and "· mlp.gate.topk_idx" in tree


def test_compare_two_tensors(tensors):
    out = step("--until", "layers.0.output", commands="x layers.0.attn_residual layers.0.hidden_states\nq\n").stdout
    a, b = tensors["layers.0.attn_residual"], tensors["layers.0.hidden_states"]
    biggest, scale = np.abs(a - b).max(), np.abs(b).max()
    assert f"max |a - b| = {biggest:.4g} · max |b| = {scale:.4g} · max |a - b| / max |b| = {biggest / scale:.4g}" in out
    assert f"entries that differ: {int((a != b).sum())} of {a.size}" in out


def test_compare_slices_of_tensors(tensors):
    """x takes NumPy slices on either side (with spaces inside the brackets): the latent is the
    first kv_lora_rank columns of kv_a, so the two agree exactly; a shape mismatch says to slice."""
    out = step("--until", "layers.1.self_attn.k_pe",
               commands="x compressed_kv kv_a[..., :128]\nx kv_a[0, :, 128:] k_pe[0, 0]\nx compressed_kv "
                        "kv_a\nq\n").stdout
    kv_a, k_pe = tensors["layers.1.self_attn.kv_a"], tensors["layers.1.self_attn.k_pe"]
    assert "a = layers.1.self_attn.compressed_kv  [1, 7, 128]\nb = layers.1.self_attn.kv_a[..., :128]" in out
    assert f"max |a - b| = 0 · max |b| = {np.abs(kv_a[..., :128]).max():.4g}" in out
    assert f"max |a - b| = 0 · max |b| = {np.abs(k_pe).max():.4g} · max |a - b| / max |b| = 0" in out
    assert "cannot compare shapes [1, 7, 128] and [1, 7, 144]: slice one" in out


def test_bad_commands_and_bad_slices_print_help_and_go_on():
    out = step(commands="frobnicate\np embed[0,99,0]\np embed[0,:x]\np nosuch\nn\nq\n")
    assert out.returncode == 0
    text = out.stdout
    assert "unknown command 'frobnicate'" in text and text.count("n next (Enter)") >= 2
    assert "bad slice [0,99,0] for shape [1, 7, 320]" in text
    assert "bad slice [0,:x]" in text
    assert "no tensor 'nosuch' in this run (h lists those seen)" in text
    assert stops(text)[-1] == "model › latent attention › rope_cos"  # the n after the errors still worked


def test_a_bad_slice_of_thousands_of_characters_is_told_cut():
    """The refusal repeated the slice whole: 5,000 indices made a line of 10,000 characters."""
    zeros, ones = ",".join(["0"] * 5000), "1" * 5000
    out = step(commands=f"p embed[{zeros}]\np embed[{ones}\nq\n").stdout
    assert f"bad slice [{zeros[:59]}... for shape [1, 7, 320]: too many indices for array\n" in out
    assert f"bad slice 'embed[{ones[:54]}...': expected NAME[i, a:b, ...]\n" in out


def test_pictures_in_step():
    out = step("--until", "layers.1.mlp.gate.topk_weight",
               commands="s attention\ns routing\ns hist\ns scales self_attn.kv_a_proj_with_mqa.weight\nq\n").stdout
    assert "head 0" in out and "[2, 3]" in out


def test_routing_names_the_router_it_draws_and_attention_draws_only_attention_weights():
    """In a decode step before its router, s routing draws the prefill's and says so; s attention
    of a tensor that is not attention weights is refused, pointing at s hist."""
    out = step("--decode", "1", "--layers", "1:2", "--break", "decode0.*attn_weights",
               commands="s routing\ns attention layers.1.self_attn.q_pe\nq\n").stdout
    assert ("prefill.layers.1.mlp.gate.topk_idx · mlp.gate.topk_weight (the latest router seen; decode0's comes "
            "later in its step)") in out.splitlines()
    assert ("s attention draws attention weights (self_attn.attn_weights, each row summing to 1), not "
            "decode0.layers.1.self_attn.q_pe: s hist layers.1.self_attn.q_pe draws any tensor's values") in out
    assert "head 0" not in out


def test_commands_file_and_end_of_input(tmp_path):
    script = tmp_path / "cmds.txt"
    script.write_text("b attn_weights\nc\n")
    out = step("--commands", str(script), commands="")
    assert out.returncode == 0 and stops(out.stdout)[-1] == "layer 0 (dense) › latent attention › attn_weights"
    assert "end of commands: quitting" in out.stdout


def test_export_html_contains_every_row(tmp_path):
    html = tmp_path / "session.html"
    out = step("--until", "layers.0.self_attn.q", "--export", str(html), commands="n\nn\nq\n")
    assert out.returncode == 0, out.stderr
    text = unescape(re.sub(r"<[^>]+>", "", html.read_text()))  # the page's text, without its markup
    for name in ("layers.0.self_attn.q", "layers.0.self_attn.q_nope", "layers.0.self_attn.q_pe"):
        assert f"{name}  [B=1 batch, 4 heads, T=7 positions" in text


def test_every_example_of_the_help_runs():
    """`?` and `help CMD` show examples; each one is a working command (the ones that resume the run
    are left out: they would leave the stop)."""
    from stepper.views.debugger import TABLE

    resuming = {"n", "c", "u", "q"}
    examples = [e for command in TABLE if command.names[0] not in resuming for e in command.examples]
    helps = [f"help {command.names[0]}" for command in TABLE]
    out = step("--decode", "1", "--until", "decode0.layers.1.output",
               commands="\n".join([*examples, *helps, "?", "q"]) + "\n")
    assert out.returncode == 0, out.stderr
    for error in ("unknown command", "no tensor", "bad slice", "cannot compare", "matches no tensor", "no command",
                  "show what?", "s scales needs", "no stored weights"):
        assert error not in out.stdout, error
    for command in TABLE:
        assert f"\n{command.usage}" in out.stdout  # help CMD's first line
    assert "a = decode0.layers.1.self_attn.compressed_kv  [1, 1, 128]" in out.stdout
    assert "breakpoints: layers.2.*" in out.stdout and out.stdout.count("e.g. ") >= 2 * len(TABLE)


def test_s_attention_shows_the_indexers_kept_positions_beside_the_weights_on_v32():
    """On DeepSeek-V3.2, `s attention` also draws, for each query, the positions the indexer kept
    (█), dropped (×) and the future (·), as the run's own mask says, beside head 0's weights."""
    rec = Recorder()
    run(RunSpec(model="tiny-v32", prompt_len=8), [rec])
    mask = rec.tensors()["layers.1.self_attn.indexer.mask"][0]  # [T, S]
    out = step("--model", "tiny-v32", "--prompt-len", "8", "--until", "layers.1.self_attn.attn_weights",
               commands="s attention\nq\n").stdout
    assert "layers.1.self_attn.attn_weights · indexer" in out and "indexer kept" in out and "head 0" in out
    lines = out.splitlines()
    grid = lines[lines.index(next(x for x in lines if x.startswith("indexer kept"))) + 2:][:8]
    for t, row in enumerate(grid):
        marks = row.split()[1:9]
        expected = ["█" if mask[t, s] == 0 else "×" if s <= t else "·" for s in range(8)]
        assert row.split()[0] == str(t) and marks == expected, (t, row)
    assert (mask[-1] == -np.inf).sum() > 0, "the last query dropped some positions (else no test)"


def test_s_attention_at_the_indexer_says_the_weights_come_next_and_v3_draws_no_indexer():
    out = step("--model", "tiny-v32", "--until", "layers.0.self_attn.indexer.topk_idx",
               commands="s attention\nu attn_weights\ns attention\nq\n").stdout
    assert "they come after the indexer: u attn_weights, then s attention" in out
    assert out.count("indexer kept") == 1
    assert "indexer kept" not in step("--until", "layers.0.self_attn.attn_weights", commands="s attention\nq\n").stdout


def test_s_attention_in_a_v32_decode_step_labels_the_query_by_its_position():
    out = step("--model", "tiny-v32", "--prompt-len", "6", "--decode", "1",
               "--until", "decode0.layers.0.self_attn.attn_weights", commands="s attention\nq\n").stdout
    lines = out.splitlines()
    row = lines[lines.index(next(x for x in lines if x.startswith("indexer kept"))) + 2]
    assert row.split()[0] == "6" and row.split().count("█") == 4, row  # position 6 keeps index_topk = 4 of 7
    assert "(the last, at position 6: 4)" in out


def test_the_debugger_lists_only_the_pictures_the_model_makes():
    """An MLA run's help names MLA's pictures; asked for another family's, it says whose it is."""
    out = stepper("step", "--model", "tiny", "--plain", stdin="s\ns hc\ns state\nq\n")
    assert out.returncode == 0 and "Traceback" not in out.stdout + out.stderr
    assert "s show attention|routing|hist|scales [NAME]" in out.stdout
    assert "show what? s attention | s routing | s hist [NAME] | s scales WEIGHT\n" in out.stdout
    assert ("s hc draws how DeepSeek-V4's residual streams mix (hc_attn.comb), a tensor this model does not emit: its "
            "pictures are s attention, s routing, s hist, s scales") in out.stdout
    assert "s state draws Kimi Linear's delta-rule state (self_attn.state), a tensor this model does not emit" in (
        out.stdout)
    kda = stepper("step", "--model", "tiny-kimi-linear", "--plain", stdin="s\nq\n")  # no FP8 weights: no scales
    assert "show what? s attention | s routing | s hist [NAME] | s state [NAME]\n" in kda.stdout


def test_a_stops_pictures_are_those_run_show_takes_for_the_model():
    """Kimi Linear's stops offered s scales, which its BF16 weights cannot draw (run --show scales is
    refused); s scales named a weight its KDA layer does not have."""
    out = stepper("step", "--model", "tiny-kimi-linear", "--plain", "--break", "self_attn.state",
                  stdin="s scales\ns scales self_attn.q_proj.weight\nhelp s\nq\n").stdout
    assert " · s show attention|routing|hist|state [NAME] · " in out and "scales|" not in out
    why = "model tiny-kimi-linear stores no FP8 weights, so there is no block-scale grid to draw"
    assert out.count(f"s scales: {why}\n") == 2 and "kv_a_proj_with_mqa" not in out
    assert "draw a picture: attention, routing, hist or state. " in out and "e.g. s scales" not in out
    run_said = stepper("run", "--model", "tiny-kimi-linear", "--show", "scales").stderr
    assert run_said == f"stepper: error: --show scales: {why}\n"  # as run --show says it
    dense = stepper("step", "--model", "tiny-minicpm3", "--plain", stdin="s routing\nq\n").stdout  # no router
    assert " · s show attention|hist [NAME] · " in dense
    assert "s routing: model tiny-minicpm3 has no router: every layer's MLP is dense\n" in dense


def test_s_scales_without_a_weight_names_one_of_the_layer_it_stopped_at():
    out = step("--until", "layers.1.self_attn.q", commands="s scales\nq\n").stdout
    assert "s scales needs a weight, e.g. s scales self_attn.q_a_proj.weight\n" in out


def test_the_hints_of_a_refused_command_name_the_models_own_tensors():
    """A DeepSeek-V4 run's x and set hints named MLA's compressed_kv, kv_a and attn_weights; they give
    the examples its help gives. An MLA model's latent is sliced at its own kv_lora_rank."""
    v4 = stepper("step", "--model", "tiny-v4", "--plain", stdin="x streams\nset = \nhelp x\nq\n").stdout
    assert "compare takes two tensors or slices: x A B, e.g. x attn.kv attn.kv_rope\n" in v4
    assert "set takes NAME[slice] = value, e.g. set attn.weights[0, 0, -1] = 0 or set [..., 3] = x*2\n" in v4
    assert "compressed_kv" not in v4 and "attn_weights" not in v4
    kda = stepper("step", "--model", "tiny-kimi-linear", "--plain", "--until", "layers.3.self_attn.kv",
                  stdin="x kv\nx compressed_kv kv_a[..., :64]\nq\n").stdout
    assert "compare takes two tensors or slices: x A B, e.g. x compressed_kv kv_a[..., :64]\n" in kda
    assert "a = layers.3.self_attn.compressed_kv  [1, 7, 64]" in kda and "cannot compare" not in kda


def test_a_tensor_with_no_finite_value_says_so_beside_its_counts():
    out = step("--until", "layers.0.self_attn.attn_weights", commands="set attn_weights = 1e400\nq\n").stdout
    assert "    no finite values  nan 0  inf 196" in [line.rstrip() for line in out.splitlines()]
    assert "min nan" not in out


def test_breadcrumbs_keep_the_module_that_tells_two_tensors_apart():
    from stepper.views.debugger import crumb

    assert [crumb(k) for k in ("self_attn.k_pe", "attn.indexer.chosen", "attn.chosen", "attn.indexer.compressor.kv",
                               "ffn.shared_experts.clamp_counts", "sub1.self_attn.q", "embed")] == \
        ["k_pe", "indexer.chosen", "chosen", "indexer.compressor.kv", "shared_experts.clamp_counts", "q", "embed"]


def test_where_at_a_model_tensor_marks_it_current_and_lists_only_the_models_own():
    out = step(commands="w\nn\nw\nq\n")
    assert out.returncode == 0, out.stderr
    assert "└── ▶ embed" in out.stdout and "├── ✓ embed\n└── ▶ rope_cos" in out.stdout


def test_break_and_until_examples_name_a_layer_and_a_tensor_the_model_has():
    """b, d and u's examples at layer 2 and the router's choice, where the model has them: a 2-layer
    model's at its last layer, a model with no router's at the latent; each example breaks where it says."""
    for model, layer_example, tensor_example in (("tiny-longcat", "b layers.1.*", "b mlp.gate.topk_idx"),
                                                  ("tiny-minicpm3", "b layers.2.*", "b self_attn.compressed_kv"),
                                                  ("tiny", "b layers.2.*", "b mlp.gate.topk_idx")):
        told = step("--model", model, commands="help b\nhelp u\nq\n").stdout
        examples = [line.split("e.g. ", 1)[1].strip() for line in told.splitlines() if "e.g. " in line]
        assert examples[:2] == [tensor_example, layer_example], (model, examples)
        out = step("--model", model, commands=f"{tensor_example}\n{layer_example}\nc\nc\nq\n").stdout
        assert "matches no tensor" not in out and out.count("breakpoints: ") == 2, (model, out[-600:])
