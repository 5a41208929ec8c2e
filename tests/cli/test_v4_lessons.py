"""The two DeepSeek-V4 lessons (compressed-attention, hyper-connections): the facts their
predictions quote agree with the run's tensors and with values worked by hand, the claims their
texts make hold on the run, and their exercises are checked on hand-made inputs whose outputs are
worked out below. (The walk, the lint, the stub failing and the solution passing bit for bit are
tests/cli/test_lessons.py's, over every lesson.)"""

from __future__ import annotations

import numpy as np
import pytest

from stepper.lessons import check, facts
from stepper.lessons.context import Context
from stepper.lessons.overrides import reference
from stepper.lessons.schema import find_lesson
from stepper.seams.trace import Recorder
from stepper.session import RunSpec, prepare, run


def tensors(spec: RunSpec) -> tuple[Context, dict[str, np.ndarray]]:
    recorder = Recorder()
    run(spec, [recorder])
    seen = recorder.tensors()
    return Context(prepare(spec), seen), seen


@pytest.fixture(scope="module")
def prompt():
    """The compressed-attention lesson's run: 38 tokens, so 9 CSA and 2 HCA windows closed."""
    return tensors(find_lesson("compressed-attention").run)


def test_the_keys_a_query_sees_follow_the_formula_at_every_position_and_layer(prompt):
    """v4_keys (from the config: min(p + 1, window) + the entries closed by p, at most index_topk on
    a CSA layer) against what each query of the run attended: its scores that are not -inf, its
    picks that are not -1, its weights that are not 0."""
    ctx, seen = prompt
    T = seen["layers.0.attn.scores"].shape[2]
    for layer, kind in enumerate(("sliding", "CSA", "HCA", "CSA")):
        scope = f"layers.{layer}"
        counted = facts.compute("keys_per_token", ctx, [scope])
        formula = [facts.compute("v4_keys", ctx, ["", str(layer), str(p)]) for p in range(T)]
        assert counted == formula, kind
        weights = seen[f"{scope}.attn.weights"][0]  # [H, T, S_q]
        assert ((weights != 0).sum(axis=-1) == np.array(formula)).all(), kind
        if kind != "sliding":
            m = 4 if kind == "CSA" else 16
            made = [(p + 1) // m for p in range(T)]
            entries = [facts.compute("entries_seen", ctx, [scope, str(p)]) for p in range(T)]
            assert entries == [min(n, 4) if kind == "CSA" else n for n in made], kind
    assert facts.compute("keys_seen", ctx, ["layers.1", "-1"]) == 8 + 4  # window 8, index_topk 4 of 9 entries
    assert facts.compute("keys_seen", ctx, ["layers.2", "-1"]) == 8 + 38 // 16
    assert facts.compute("keys_seen", ctx, ["layers.2", "15"]) == 8 + 1  # entry 0 closes with position 15


def test_the_formula_holds_in_decode_steps_that_close_windows():
    """A prompt of 14 and three steps at positions 14, 15, 16: position 15 closes a CSA window
    (positions 12-15) and the first HCA one (0-15); each step's one query attends what the formula
    says for its position."""
    ctx, seen = tensors(RunSpec(model="tiny-v4", prompt_len=14, decode=3, seed=2))
    for step, p in enumerate((14, 15, 16)):
        for layer in range(4):
            scope = f"decode{step}.layers.{layer}"
            assert facts.compute("keys_seen", ctx, [scope, "0"]) == facts.compute(
                "v4_keys", ctx, ["", str(layer), str(p)]), (scope, p)
    assert seen["decode1.layers.2.attn.chosen"][0, 0].tolist() == [0]  # HCA's entry 0, made in this step
    assert seen["decode0.layers.2.attn.chosen"].shape[-1] == 0  # none before it


def test_full_size_counts_worked_by_hand():
    """V4-Flash at the last position of a 1048576 context: a window of 128; CSA keeps 512 of the
    262144 entries; HCA keeps all 1048576 / 128 = 8192. Layers 0 and 1 are sliding only."""
    ctx = Context(prepare(RunSpec(model="tiny-v4", prompt_len=2)))
    keys = [facts.compute("v4_keys", ctx, ["deepseek-v4-flash", str(layer), "1048575"]) for layer in range(4)]
    assert keys == [128, 128, 128 + 512, 128 + 8192]
    assert facts.compute("v4_keys", ctx, ["deepseek-v4-flash", "2", "5"]) == 6 + 1  # 6 window slots, entry 0
    assert facts.compute("v4_keys", ctx, ["deepseek-v4-flash", "3", "126"]) == 127  # no HCA window closed yet


def test_the_newest_entries_and_the_kept_ones_differ_in_the_lesson(prompt):
    """The lesson's wrong answer (the newest entries) is not its right answer, and the indexer's
    choice is its four best scores."""
    ctx, seen = prompt
    scores = seen["layers.1.attn.indexer.scores"][0, -1]  # [Ec]
    assert facts.compute("recent_entries", ctx, ["layers.1", "-1"]) == [5, 6, 7, 8]
    kept = sorted(seen["layers.1.attn.indexer.chosen"][0, -1].tolist())
    assert kept == sorted(np.argsort(-scores)[:4].tolist()) and kept != [5, 6, 7, 8]
    assert np.sort(scores)[-4] - np.sort(scores)[-5] > 0.05, "no near tie for the learner to guess at"


def test_the_sink_share_is_the_sigmoid_of_the_two_logits(prompt):
    """Position 0 of a sliding layer sees its own key and the sink: share = 1 / (1 + e^(s - z))."""
    _, seen = prompt
    s, z = seen["layers.0.attn.scores"][0, :, 0, -2], seen["layers.0.attn.scores"][0, :, 0, -1]  # [H] each
    np.testing.assert_allclose(seen["layers.0.attn.sink_mass"][0, :, 0], 1 / (1 + np.exp(s - z)), rtol=1e-6)
    weights = seen["layers.1.attn.weights"][0, :, -1].sum(axis=-1)  # [H]
    np.testing.assert_allclose(weights, 1 - seen["layers.1.attn.sink_mass"][0, :, -1], rtol=1e-5)


def test_the_hyper_connection_claims_hold_on_the_run():
    """What the hyper-connections lesson says, on its run: layer 0's streams are equal copies; the
    collapse is (sum pre) e there; stream k after the attention is e + post_k y; in every layer the
    streams' sum grows by (sum post) y (comb's rows sum to 1); comb's rows and columns sum to 1."""
    ctx, seen = tensors(find_lesson("hyper-connections").run)
    e = seen["layers.0.streams"][0, :, 0]  # [T, d]
    assert all(np.array_equal(seen["layers.0.streams"][0, :, k], e) for k in range(4))
    pre, post = seen["layers.0.hc_attn.pre"][0], seen["layers.0.hc_attn.post"][0]  # [T, n]
    np.testing.assert_allclose(seen["layers.0.hc_attn.collapsed"][0], pre.sum(-1)[:, None] * e, rtol=1e-5)
    y = seen["layers.0.attn_output"][0]  # [T, d]
    np.testing.assert_allclose(seen["layers.0.attn_streams"][0], e[:, None] + post[..., None] * y[:, None],
                               rtol=1e-4, atol=1e-4)
    for layer in range(4):
        for site, before, out, after in (("hc_attn", "streams", "attn_output", "attn_streams"),
                                         ("hc_ffn", "attn_streams", "ffn_output", "ffn_streams")):
            grown = seen[f"layers.{layer}.{after}"][0].sum(1) - seen[f"layers.{layer}.{before}"][0].sum(1)  # [T, d]
            written = seen[f"layers.{layer}.{site}.post"][0].sum(-1)[:, None] * seen[f"layers.{layer}.{out}"][0]
            np.testing.assert_allclose(grown, written, rtol=1e-4, atol=1e-4)
            comb = seen[f"layers.{layer}.{site}.comb"]
            np.testing.assert_allclose(comb.sum(-1), 1, atol=1e-5)
            np.testing.assert_allclose(comb.sum(-2), 1, atol=1e-5)
    before = seen["layers.0.hc_attn.comb_softmax"][0, 0]
    assert np.abs(before.sum(0) - 1).max() > 0.1, "the columns need Sinkhorn in this run (else the lesson says nothing)"
    table = facts.compute("comb_table", ctx, ["layers.0.hc_attn.comb_softmax", "0"]).splitlines()
    assert [float(v) for v in table[-1].split()[1:]] == pytest.approx(before.sum(0), abs=1e-4)
    assert [float(line.split()[-1]) for line in table[1:-1]] == pytest.approx(before.sum(1), abs=1e-4)
    assert [float(v) for v in table[1].split()[2:-1]] == pytest.approx(before[0], abs=1e-4)


def test_the_hand_made_exercise_cases_are_what_their_labels_say():
    """Worked by hand. gated_pool: channel 0's gates 0 and ln 3 give weights 1/4 and 3/4, so
    1/4 x 1 + 3/4 x 3 = 2.5; channel 1's -inf slot gets 0, so the pool is the other slot's -2.
    sinkhorn of [[1, 3], [1, 1]]: the columns (sums 2, 4) give [[1/2, 3/4], [1/2, 1/4]]; a second
    round's rows (sums 5/4, 3/4) give [[2/5, 3/5], [2/3, 1/3]], its columns (16/15, 14/15)
    [[3/8, 9/14], [5/8, 5/14]]; with hc_eps 1/2 the first columns are over 5/2 and 9/2, [[2/5, 2/3],
    [2/5, 2/9]], a second round's rows over 47/30 and 101/90, its columns over 10555/9494 and 10667/9494. Gates
    1000, 1001 weigh like 0, 1: 1 / (1 + e) and e / (1 + e); -1000, -1001 the other way round."""
    one, large, none = check.gated_pool_calls()
    weights, pooled = reference("gated_pool")(*one.args)
    np.testing.assert_allclose(weights[0, 0], [[0.25, 0.0], [0.75, 1.0]], rtol=1e-6)
    np.testing.assert_allclose(pooled[0, 0], [2.5, -2.0], rtol=1e-6)
    weights, pooled = reference("gated_pool")(*large.args)
    e = np.e
    np.testing.assert_allclose(weights[0, 0], [[1 / (1 + e), e / (1 + e)], [e / (1 + e), 1 / (1 + e)]], rtol=1e-6)
    np.testing.assert_allclose(pooled[0, 0], [(1 + 3 * e) / (1 + e), (10 * e - 2) / (1 + e)], rtol=1e-6)
    weights, pooled = reference("gated_pool")(*none.args)
    assert weights.shape == (1, 0, 8, 4) and pooled.shape == (1, 0, 4)
    expected = [[[0.5, 0.75], [0.5, 0.25]], [[3 / 8, 9 / 14], [5 / 8, 5 / 14]], [[0.4, 3 / 4.5], [0.4, 1 / 4.5]],
                [[2424 / 10555, 4040 / 10667], [3384 / 10555, 1880 / 10667]]]
    for call, want in zip(check.sinkhorn_calls(), expected, strict=True):
        got = reference("sinkhorn")(*call.args)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("name, drawn", [
    ("compressed-attention", ["(stepper) s reach", "layers.1.attn.chosen: the query at position 37",
                              "12 keys: the window's 8 tokens (positions 30..37) + 4 of the 9 visible entries"]),
    ("hyper-connections", ["(stepper) s hc", "position 5 of 0..5: row j says where stream j goes", "col sum"]),
])
def test_the_walk_draws_v4_pictures_at_its_stops(name, drawn):
    """The debugger's `s reach` and `s hc`, run by the lessons' commands, draw the run's own
    pictures (views.v4_pictures) at the stop."""
    import io

    from rich.console import Console

    from stepper.lessons.walk import right_answers, walk
    from stepper.views.debugger import CommandSource

    lesson, out = find_lesson(name), io.StringIO()
    console = Console(file=out, width=200, no_color=True, highlight=False, markup=False, soft_wrap=True)
    walked = walk(lesson, console, CommandSource(console, io.StringIO("\n".join(right_answers(lesson)) + "\n"), False))
    assert walked.finished
    for line in drawn:
        assert line in out.getvalue(), line


def test_the_v4_pictures_refuse_other_tensors_in_one_line(tmp_path):
    from tests.helpers.cli import stepper

    script = tmp_path / "commands.txt"
    script.write_text("u layers.0.self_attn.attn_weights\ns reach\ns reach self_attn.attn_weights\n"
                      "s hc self_attn.attn_weights\nq\n")
    done = stepper("step", "--model", "tiny", "--plain", "--commands", script, cwd=tmp_path)
    assert done.stdout.count("s reach draws what a DeepSeek-V4 query attends (attn.chosen), a tensor this model "
                             "does not emit: its pictures are s attention, s routing, s hist, s scales") == 2  # MLA
    assert ("s hc draws how DeepSeek-V4's residual streams mix (hc_attn.comb), a tensor this model does not "
            "emit") in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    script.write_text("u layers.0.attn.q_a\ns reach layers.0.attn.q_a\ns hc layers.0.attn.q_a\nq\n")
    done = stepper("step", "--model", "tiny-v4", "--plain", "--commands", script, cwd=tmp_path)
    assert "s reach draws a DeepSeek-V4 layer's attn.chosen, not layers.0.attn.q_a" in done.stdout
    assert "s hc draws a DeepSeek-V4 layer's hc_attn.comb or hc_ffn.comb, not layers.0.attn.q_a" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
