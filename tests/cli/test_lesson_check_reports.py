"""`stepper lesson check` with deliberately wrong exercises: every failure is reported on the
learner's own function and on inputs a learner can relate to (the byte, the weight, the tensor
the call makes), never on stepper's internal calls (tiles of a weight with the 2^-120 rebias as
their scales)."""

from __future__ import annotations

import re

import pytest

from stepper.lessons import check
from stepper.lessons.schema import find_lesson

# lesson, a change to its solution that makes one exercise wrong, and what the report must say
WRONG = [
    ("tour", ("return e / np.sum(e, axis=axis, keepdims=True)",
              "return e / (np.sum(e, axis=axis, keepdims=True) + 0.01)"),
     ["softmax differs on call 1 of softmax in the run, which makes layers.0.self_attn.attn_weights",
      "inputs: x [1, 4, 7, 7] float32"]),
    ("rmsnorm", ("return weight * (x *", "return (x *"),
     ["rms_norm differs on call 1 of rms_norm in the run, which makes layers.0.input_layernorm",
      "inputs: x [1, 7, 320] float32, weight [320] float32, eps 1e-06"]),
    ("fp8", ("subnormal = np.ldexp(mantissa / F32(8), -6)", "subnormal = np.zeros_like(mantissa)"),
     ["decode differs on all 256 codes 0x00..0xFF", "first difference at [0, 1]: expected 0.001953125, got 0",
      "the byte there is 0x01 = 0 0000 001 (subnormal): (-1)^0 * 2^(1-7) * (1/8) = 0.001953125",
      "dequantize differs on the weight model.layers.0.self_attn.q_a_proj.weight: codes [192, 320], scale_inv [2, 3]",
      "times its block's scale_inv[0, 1] = "]),
    ("fp8", ("values[(codes & 0x7F) == 0x7F] = np.nan", "pass"),
     ["decode differs on all 256 codes", "at [7, 15]: expected nan, got 480 (NaN where there should be one",
      "the byte there is 0x7F = 0 1111 111 (nan)"]),
    ("fp8", ("full = np.repeat(np.repeat(scales, block[0], axis=0), block[1], axis=1)[:out_dim, :in_dim]",
             "full = np.repeat(np.repeat(scales, block[1], axis=1), block[0], axis=0)[:out_dim, :in_dim].T.T * 1.5"),
     ["✓ decode matches", "dequantize differs on the weight model.layers.0.self_attn.q_a_proj.weight",
      "times its block's scale_inv[0, 0] = "]),
    ("rope-yarn", ("exponent = np.arange(0, dim, 2, dtype=F32) / F32(dim)",
                   "exponent = np.arange(0, dim, 2, dtype=F32) / F32(dim + 2)"),
     ["rope_inv_freq differs on call 1 of rope_inv_freq in the run, computed before embed is emitted",
      "inputs: dim 16, theta 50000.0, yarn Yarn(factor=32.0"]),
    ("rope-yarn", ("[even * cos - odd * sin, odd * cos + even * sin]",
                   "[even * cos + odd * sin, odd * cos - even * sin]"),
     ["apply_rope differs on call 1 of apply_rope in the run, which makes layers.0.self_attn.q_pe_rope"]),
    ("decode-cache", ("past = s - t", "past = 0"),
     [("causal_mask differs on call 4 of causal_mask in the run, computed before "
      "decode0.layers.0.self_attn.attn_scores is emitted"),
      "inputs: t 1, s 6"]),
    ("mla-latent", ("compressed_kv = kv_a[..., : cfg.kv_lora_rank]",
                    "compressed_kv = kv_a[..., 1 : cfg.kv_lora_rank + 1]"),
     ["the run with your latent differs", "layers.0.self_attn.compressed_kv differs (the first"]),
    ("absorption", ("weights.reshape(B, H * T, -1), latents)", "weights.reshape(B, H * T, -1) * 0.5, latents)"),
     ["the run with your absorbed differs", "layers.0.self_attn.attn_output_latent differs (the first"]),
    ("moe-routing", ("weights = weights * np.float32(cfg.routed_scaling_factor)", "weights = weights"),
     ["the run with your route differs", "layers.1.mlp.gate.topk_weight differs (the first"]),
    ("sparse-attention", ("head_weights[:, :, h, None] * (np.maximum(dots, 0) * scale)",
                          "np.maximum(head_weights[:, :, h, None] * dots * scale, 0)"),  # relu after the weight
     ["index_scores differs on call 1 of index_scores in the run, which makes layers.0.self_attn.indexer.index_scores",
      "inputs: q [1, 8, 8, 32] float32, keys [1, 8, 32] float32, head_weights [1, 8, 8] float32"]),
    ("compressed-attention", ("weights /= np.sum(weights, axis=2, keepdims=True)",
                              "weights /= np.sum(weights, axis=3, keepdims=True)"),  # a softmax over the channels
     ["gated_pool differs on call 1 of gated_pool in the run, which makes layers.1.attn.compressor.slot_weights",
      "array 1 of the 2 it returns:", "inputs: slots_kv [1, 9, 8, 32] float32, slots_gate [1, 9, 8, 32] float32"]),
    # After 20 rounds rows first or columns first converge alike, and hc_eps 1e-6 moves little: the
    # run's matrices pass both mistakes, the hand-made cases catch them
    ("hyper-connections", ("comb = comb / (comb.sum(axis=columns, keepdims=True) + eps)  # [..., n, n]",
                           "comb = comb / (comb.sum(axis=rows, keepdims=True) + eps)  # [..., n, n]"),  # rows first
     ["sinkhorn differs on comb [[1, 3], [1, 1]], iters 1, hc_eps 0",
      "first difference at [0, 0]: expected 0.5, got 0.25", "inputs: comb [2, 2] float32, iters 1, hc_eps 0.0"]),
    ("hyper-connections", ("eps = np.float32(hc_eps)", "eps = np.float32(0)"),  # hc_eps left out of the sums
     ["sinkhorn differs on comb [[1, 3], [1, 1]], iters 1, hc_eps 0.5", "expected 0.40000001, got 0.5"]),
    # a tensor the stub's docstring names, not emitted: the stub has no emit(...) calls to keep
    ("many-models", ('    emit("mlp.gate.group_mask", group_mask)\n', ""),
     ["tensor 61: your run emitted layers.1.mlp.gate.topk_idx where the reference emits layers.1.mlp.gate.group_mask",
      "(emit the tensors the stub names, in its order)"]),
    # V2's group-limited router (tiny-v2-groups.json, the lesson's own config): the top-k over all experts,
    # groups ranked by their worst expert, or by V3's top-2 sums
    ("three-routers", ("        choice = keep_groups(choice, group_max, cfg, emit)\n",
                       "        keep_groups(choice, group_max, cfg, emit)\n"),
     ["the run with your route differs (model tiny-v2-groups.json, 7 tokens at positions 0..6)",
      "layers.1.mlp.gate.topk_idx differs (the first"]),
    ("three-routers", ("group_max = choice.reshape(choice.shape[0], cfg.n_group, -1).max(axis=-1)",
                       "group_max = choice.reshape(choice.shape[0], cfg.n_group, -1).min(axis=-1)"),
     ["the run with your route differs (model tiny-v2-groups.json", "layers.1.mlp.gate.group_max differs"]),
    ("three-routers", ("        choice = keep_groups(choice, group_max, cfg, emit)\n",
                       ("        two = np.sort(choice.reshape(choice.shape[0], cfg.n_group, -1), axis=-1)[..., -2:]\n"
                       "        choice = keep_groups(choice, two.sum(axis=-1), cfg, emit)\n")),
     ["the run with your route differs (model tiny-v2-groups.json", "mlp.gate.group_mask differs (the first"]),
    # a tensor emitted in float64: the report says it was emitted so, not "returned"
    ("three-routers", ('emit("mlp.gate.logits", logits)', 'emit("mlp.gate.logits", logits.astype(np.float64))'),
     ["layers.1.mlp.gate.logits differs", "your run emitted it with dtype float64, expected float32"]),
    # hc_eps kept in the first columns' sums but left out of the rounds': 1e-6 in the run moves nothing
    ("hyper-connections", ("comb = comb / (comb.sum(axis=rows, keepdims=True) + eps)",
                           "comb = comb / comb.sum(axis=rows, keepdims=True)"),
     ["sinkhorn differs on comb [[1, 3], [1, 1]], iters 2, hc_eps 0.5"]),
]


@pytest.mark.parametrize("name, change, said", WRONG, ids=[f"{w[0]}-{i}" for i, w in enumerate(WRONG)])
def test_a_wrong_exercise_is_reported_on_the_learners_function_and_inputs(tmp_path, name, change, said):
    lesson = find_lesson(name)
    solution = lesson.solution.read_text()
    assert change[0] in solution, "the change must apply to the solution as it is"
    wrong = tmp_path / f"{name}.py"
    wrong.write_text(solution.replace(change[0], change[1]))
    report = check.check(lesson, wrong)
    text = "\n".join(f"{'✓' if o.ok else '✗'} {o.title}\n" + "\n".join(o.detail) for o in report.outcomes)
    assert not report.passed, text
    for line in said:
        assert line in text, text
    assert "e-39" not in text and not re.search(r"scale_inv \[1, 3\]", text), "no call with the rebias as its scales"
    assert "just before" not in text


def test_the_calls_checked_are_labelled_by_what_they_make():
    """Each captured call names the tensor it makes when its result is emitted as it is, and
    otherwise says what the run emitted after it; decode and dequantize are checked on whole
    weights with their own scales."""
    spec = find_lesson("tour").exercise.runs[0]
    labels = [c.label for c in check.captured(spec, ("softmax",))["softmax"]]
    assert labels and all(re.fullmatch(r"call \d+ of softmax in the run, which makes "
                                       r"layers\.\d\.self_attn\.attn_weights", s)
                          for s in labels), labels
    for call in check.weight_calls(find_lesson("fp8").exercise.runs[0], "dequantize"):
        codes, scale_inv, block = call.args
        assert scale_inv.shape == (-(-codes.shape[0] // block[0]), -(-codes.shape[1] // block[1]))
        assert scale_inv.min() > 2.0**-100, "real block scales, not the 2^-120 rebias"
        assert call.label.startswith(f"the weight {call.kwargs['name']}: codes {list(codes.shape)}")


def test_the_report_wraps_at_80_columns_between_words_on_a_terminal_and_not_through_a_pipe(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from stepper.cli.main import app
    from tests.helpers.terminal import on_terminal

    monkeypatch.setenv("STEPPER_DATA_DIR", str(tmp_path / "data"))
    wrong = tmp_path / "fp8.py"
    wrong.write_text(find_lesson("fp8").solution.read_text().replace(*WRONG[2][1]))
    screen = on_terminal("lesson", "check", "fp8", "--file", wrong, "--plain", columns=80)
    assert screen.code == 1
    lines = screen.text.replace(str(wrong), "fp8.py").splitlines()
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    assert "    2^(1-7) * (1/8) = 0.001953125" in lines, "a wrapped detail line stays indented, its arithmetic whole"
    assert "(1/8) = 0.001953125" in " ".join(screen.text.split()), "wrapped between words, not inside one"
    piped = CliRunner().invoke(app, ["lesson", "check", "fp8", "--file", str(wrong), "--plain"], env={"COLUMNS": "80"})
    assert piped.exit_code == 1
    assert any(line.startswith("    the byte there is 0x01") and line.endswith("(1/8) = 0.001953125")
               for line in piped.stdout.splitlines()), "through a pipe a detail line is whole"


def test_the_hand_made_index_scores_case_is_what_its_label_says():
    """Worked by hand: query 0 (position 1) sees keys 0 and 1; its head 1 has weight -0.5 and
    relu(q . k1) = 2.5, so its score at key 1 is -1.25 / sqrt(2); a relu after the weight would
    give 0 there."""
    import numpy as np

    from stepper.lessons.overrides import reference

    (call,) = check.index_score_calls()
    got = reference("index_scores")(*call.args)
    r = 2 ** -0.5
    expected = np.array([[[1 * r, -1.25 * r, -np.inf], [4.5 * r, 0.25 * r, 0.0]]], np.float32)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_an_exercise_that_changes_its_arguments_in_place_passes_and_leaves_the_run_alone(tmp_path):
    """A right sinkhorn written with `/=` on its argument divides the run's own comb_softmax, which
    the run has already shown: the run check blamed that tensor (a tensor the learner never made)
    while the function check, on copies, passed. Each call gets its arrays as copies."""
    lesson = find_lesson("hyper-connections")
    solution = lesson.solution.read_text()
    change = ("comb = comb / (comb.sum(axis=columns, keepdims=True) + eps)",
              "comb /= comb.sum(axis=columns, keepdims=True) + eps")
    assert change[0] in solution, "the change must apply to the solution as it is"
    mine = tmp_path / "in_place.py"
    mine.write_text(solution.replace(*change))
    report = check.check(lesson, mine)
    text = "\n".join(f"{'✓' if o.ok else '✗'} {o.title}\n" + "\n".join(o.detail) for o in report.outcomes)
    assert report.passed, text


def test_a_right_v2_router_in_float64_with_its_own_group_mask_passes(tmp_path):
    """Lesson 10's check runs V2's group-limited router (its tiny-v2-groups.json): a right router
    computed in float64 and cast back, with the group mask made by another formula (argpartition,
    ties aside), passes."""
    lesson = find_lesson("three-routers")
    solution = lesson.solution.read_text()
    changes = [
        ("logits = linear(x.astype(np.float32), gate.astype(np.float32))  # [N, E]",
         "logits = (x.astype(np.float64) @ gate.astype(np.float64).T).astype(np.float32)"),
        (("    group_mask = np.zeros_like(group_scores)\n"
         "    np.put_along_axis(group_mask, top_k(group_scores, cfg.topk_group), np.float32(1), axis=1)  # [N, G]\n"),
         ("    cut = -np.sort(-group_scores, axis=1)[:, cfg.topk_group - 1:cfg.topk_group]\n"
         "    group_mask = (group_scores >= cut).astype(np.float32)\n")),
    ]
    for old, new in changes:
        assert old in solution, "the change must apply to the solution as it is"
        solution = solution.replace(old, new)
    mine = tmp_path / "f64.py"
    mine.write_text(solution)
    report = check.check(lesson, mine)
    text = "\n".join(f"{'✓' if o.ok else '✗'} {o.title}\n" + "\n".join(o.detail) for o in report.outcomes)
    assert report.passed, text
    assert "tiny-v2-groups.json" in text


def test_a_lesson_config_file_must_be_in_the_lessons_folder(tmp_path):
    import shutil

    from stepper.errors import StepperError
    from stepper.lessons.schema import load_lesson

    folder = tmp_path / "10-routers"
    shutil.copytree(find_lesson("three-routers").folder, folder)
    toml = folder / "lesson.toml"
    toml.write_text(toml.read_text().replace('model = "tiny-v2-groups.json"', 'model = "../tiny-v2-groups.json"'))
    with pytest.raises(StepperError, match=r"lesson.toml: \[exercise\] runs\[1\]: 'model' '../tiny-v2-groups.json': "
                                           r"a config file must be in the lesson's folder"):
        load_lesson(folder)
