"""What a reviewer trying DeepSeek-V4 met on its surfaces (issue #32): the API's refusals in the API's
words, the debugger's help in the running model's names, counts with their noun's number, and --dump's
name as its help says."""

from __future__ import annotations

import pytest
from helpers.cli import refused, stepper

import stepper as api
from stepper.errors import StepperError


@pytest.mark.parametrize(("kwargs", "args", "in_api", "on_command_line"), [
    ({"chunk": 4}, ("--chunk", "4"), "chunk=4: DeepSeek-V4's prefill runs the whole prompt at once (chunk 0)",
     "--chunk 4: DeepSeek-V4's prefill runs the whole prompt at once (chunk 0)"),
    ({"cache_len": 8}, ("--cache-len", "8"), "cache_len=8 fills one layer's cache: use it with layer=N",
     "--cache-len 8 fills one layer's cache: use it with --layer N"),
])
def test_a_v4_refusal_spells_the_option_as_the_caller_wrote_it(kwargs, args, in_api, on_command_line):
    with pytest.raises(StepperError) as e:
        api.run(model="tiny-v4", **kwargs)
    assert str(e.value) == in_api
    assert refused(stepper("run", "--model", "tiny-v4", *args)) == on_command_line


MLA_WORDS = ("mlp.", "self_attn", "attn_weights", "k_pe", "compressed_kv", "kv_a", "attention", "topk_weight")


def test_the_debugger_s_help_on_a_v4_run_gives_examples_the_run_emits_and_each_works():
    help_ = stepper("step", "--plain", "--model", "tiny-v4", stdin="?\nhelp b\nhelp p\nhelp s\nu\nq\n").stdout
    examples = [line.split("e.g. ", 1)[1].strip() for line in help_.splitlines() if "e.g. " in line]
    assert {"b ffn.gate.topk_idx", "u attn.weights", "p attn.kv[0, :2, :4] 3", "s reach", "s hc",
            "set attn.weights[0, 0, -1] = 0"} <= set(examples)
    told = help_[help_.index("(stepper) ?"):]
    assert not [word for word in MLA_WORDS if word in told], told
    assert "until needs a name or glob, e.g. u attn.weights" in told
    # each example, typed at a point of the run where its tensors have been seen
    script = ["b ffn.gate.topk_idx", "u attn.weights", "p attn.weights[0, 1, -1]", "p attn.kv[0, :2, :4] 3",
              "x attn.kv attn.kv_rope", "e attn.kv_rope", "s hc", "s hist attn.kv", "set attn.weights[0, 0, -1] = 0",
              "c", "s reach", "x attn_streams streams", "d ffn.gate.topk_idx", "u layers.2.ffn_streams", "s routing",
              "q"]
    assert set(examples) - {"b layers.2.*", "d", "e", "h", "h 100", "help x", "?", "n", "c", "w", "q"} <= set(script)
    out = stepper("step", "--plain", "--model", "tiny-v4", stdin="\n".join(script) + "\n").stdout
    answers = out.split("(stepper) ")[1:]
    assert [a.splitlines()[0] for a in answers] == script
    for command, answer in zip(script, answers):
        assert not any(s in answer for s in ("no tensor", "seen yet", "show what", "bad slice", "needs a")), answer
    assert "layers.2.ffn.gate.topk_idx  [N=7 tokens, 4 chosen experts]" in answers[9]
    assert "set layers.0.attn.weights[0, 0, -1] = 0: the run continues from it" in answers[8]


def test_s_scales_on_a_v4_run_is_one_line_naming_the_command_that_shows_its_weights():
    out = stepper("step", "--plain", "--model", "tiny-v4", stdin="s scales attn.wq_a.weight\nq\n")
    assert out.returncode == 0 and "Traceback" not in out.stderr
    assert ("s scales draws an MLA checkpoint's FP8 block scales; a DeepSeek-V4 weight's FP8 block or FP4 group: "
            "stepper fp8 --weight NAME --model MODEL") in out.stdout


def test_diff_counts_one_tensor_in_the_singular():
    one = stepper("diff", "--plain", "run --only layers.0.output", "run --only layers.0.output --seed 1")
    assert one.returncode == 1, one.stderr
    assert (": 1 tensor in both, 0 the same bit for bit, 0 within round-off, 1 differs\n") in one.stdout
    three = stepper("diff", "--plain", "run --only logits", "run --only logits --seed 1").stdout
    assert ": 3 tensors in both, 0 the same bit for bit, 0 within round-off, 3 differ\n" in three


def test_dump_s_help_names_the_extension_the_file_must_have_and_a_name_without_it_is_refused(tmp_path):
    help_ = " ".join(stepper("run", "--help").stdout.split())
    assert "--dump FILE.safetensors Write every shown tensor to this file (its name ends in .safetensors)." in help_
    assert refused(stepper("run", "--only", "logits", "--dump", "out", cwd=tmp_path)) == (
        "--dump out: the file name must end in .safetensors")
    assert list(tmp_path.iterdir()) == []
    assert stepper("run", "--only", "logits", "--dump", "out.safetensors", cwd=tmp_path).returncode == 0
    mine = tmp_path / "mine.safetensors"
    mine.write_bytes(b"a user's file")
    again = refused(stepper("run", "--only", "logits", "--dump", mine.name, "--force", cwd=tmp_path))
    assert again.startswith("--dump mine.safetensors") and mine.read_bytes() == b"a user's file"
