"""`--patch NAME=EXPR` in run and step, and the debugger's `set`: the run continues from the changed tensor."""

import io
import json
import subprocess

import numpy as np
from helpers import cli as command_line
from rich.console import Console
from safetensors.numpy import load_file

import stepper
from stepper.seams.patching import expression
from stepper.seams.trace import Recorder
from stepper.session import RunSpec, run
from stepper.views.debugger import CommandSource, Debugger, Quit


def cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return command_line.stepper(*args, stdin=stdin)


def test_run_patch_dumps_the_tensors_of_the_same_patch_through_the_api(tmp_path):
    dump = tmp_path / "p.safetensors"
    out = cli("run", "--plain", "--ids", "3,14,15", "--patch", "layers.1.mlp.gate.topk_idx=x[..., 0]=5",
              "--patch", "*.attn_weights=x*0.5", "--dump", str(dump))
    assert out.returncode == 0, out.stderr
    dumped = load_file(dump)
    assert np.all(dumped["layers.1.mlp.gate.topk_idx"][:, 0] == 5)
    api = stepper.run("tiny", ids=[3, 14, 15], patch=[{"layers.1.mlp.gate.topk_idx": expression("x[..., 0]=5")},
                                                      {"*.attn_weights": lambda x, n: x * np.float32(0.5)}])
    assert set(dumped) == set(api.names)
    for name in api.names:
        np.testing.assert_array_equal(dumped[name], api[name], err_msg=name)
    assert "layers.1.mlp.gate.topk_idx" in out.stdout


def test_a_bad_patch_is_one_line_and_exit_2():
    for patch, message in (("layers.0.mlp.gate.topk_idx=0", "--patch layers.0.mlp.gate.topk_idx: matches no tensor"),
                           ("attn_weights=open('f')", "is not allowed"),
                           ("attn_weights", "expected NAME=EXPR")):
        out = cli("run", "--plain", "--prompt-len", "2", "--patch", patch)
        assert out.returncode == 2 and message in out.stderr, out.stderr
        assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr


def test_step_takes_patch_too():
    out = cli("step", "--plain", "--prompt-len", "2", "--until", "layers.1.self_attn.k_pe", "--patch",
              "layers.1.self_attn.k_pe=0",
              stdin="p\nq\n")
    assert out.returncode == 0, out.stderr
    assert "min 0  max 0  mean 0" in out.stdout


def debugged(commands: list[str], breaks: list[str]) -> dict[str, np.ndarray]:
    """A tiny run stepped through with these commands; the tensors the model continued with."""
    spec = RunSpec(ids=(3, 14, 15))
    console = Console(file=io.StringIO(), width=100, markup=False, highlight=False)
    recorder = Recorder()
    cfg = stepper.run("tiny", prompt_len=1, keep="norm").config
    debugger = Debugger(console, cfg, CommandSource(console, io.StringIO(), False, commands), breakpoints=breaks)
    try:
        run(spec, [debugger, recorder])
    except Quit:
        pass
    return recorder.tensors(), console.file.getvalue()


def test_set_in_the_debugger_is_what_the_model_continues_from():
    tensors, shown = debugged(["set [1, :2] = 0", "set = x*0.5", "c", "q"], ["layers.1.mlp.gate.topk_weight"])
    assert "set layers.1.mlp.gate.topk_weight = x*0.5: the run continues from it" in shown

    def both(weight, name):
        weight[1, :2] = 0
        return weight * np.float32(0.5)

    api = stepper.run("tiny", ids=[3, 14, 15], patch={"layers.1.mlp.gate.topk_weight": both})
    for name in ("layers.1.mlp.gate.topk_weight", "layers.1.mlp.routed_output", "layers.2.output", "logits"):
        np.testing.assert_array_equal(tensors[name], api[name], err_msg=name)


def test_set_refuses_another_tensor_and_a_bad_value_and_goes_on():
    tensors, shown = debugged(["set layers.1.self_attn.q = 0", "set [9] = 0", "set = open", "set", "c"],
                              ["layers.1.self_attn.k_pe"])
    assert "only the tensor the run stopped at (layers.1.self_attn.k_pe) can be set" in shown
    assert ("index 9 is out of bounds" in shown and "'open' is not allowed" in shown
            and "set takes NAME[slice] = value" in shown)
    plain = stepper.run("tiny", ids=[3, 14, 15], keep="logits")
    np.testing.assert_array_equal(tensors["logits"], plain["logits"])  # nothing was set


def test_set_refuses_a_choice_of_no_such_expert_at_once_and_the_session_goes_on():
    """A choice is checked when set, as a --patch of it is: an expert past the layer's, -1 or one
    named twice in a row is refused on the spot, and the run goes on from what it was."""
    tensors, shown = debugged(["set [0, 0] = 99", "set [0, 0] = -1", "set [0, 0] = x[0, 1]", "set [1, 0] = 31", "c"],
                              ["layers.1.mlp.gate.topk_idx"])
    said = "set layers.1.mlp.gate.topk_idx[0, 0] = "
    assert said + "99 names expert 99; the layer has experts 0..31" in shown
    assert said + "-1 names expert -1; the layer has experts 0..31" in shown
    assert said + "x[0, 1] names one of its experts twice in one row" in shown
    plain = stepper.run("tiny", ids=[3, 14, 15], keep="layers.1.mlp.gate.topk_idx")["layers.1.mlp.gate.topk_idx"]
    assert tensors["layers.1.mlp.gate.topk_idx"][0].tolist() == plain[0].tolist()  # none of the three was set
    assert 31 not in plain[1]  # so 31 is a choice row 1 may take
    assert "set layers.1.mlp.gate.topk_idx[1, 0] = 31: the run continues from it" in shown
    assert tensors["layers.1.mlp.gate.topk_idx"][1].tolist() == [31, *plain[1, 1:]]


def test_a_patched_run_says_so_in_its_header_and_on_the_patched_rows():
    out = cli("run", "--plain", "--patch", "layers.1.mlp.gate.topk_idx=x[..., 0]=5", "--only", "*gate.topk_idx")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[2] == ("patched: layers.1.mlp.gate.topk_idx=x[..., 0]=5 (rows marked patched show the new values; the "
                        "run goes on from them)")
    rows = [line for line in lines if line.startswith("layers.")]
    # layer 2's experts are chosen from a patched run, not patched
    assert rows == ["layers.1.mlp.gate.topk_idx  [N=7 tokens, 4 chosen experts]  int64  patched",
                    "layers.2.mlp.gate.topk_idx  [N=7 tokens, 4 chosen experts]  int64"]
    assert lines[lines.index(rows[0]) + 2].startswith("    corners 5 ")
    assert "patched" not in cli("run", "--plain", "--only", "*gate.topk_idx").stdout
    stepped = cli("step", "--plain", "--patch", "layers.1.mlp.gate.topk_idx=x[..., 0]=5", stdin="q\n")
    assert stepped.stdout.splitlines()[2] == lines[2]


def test_json_rows_say_which_tensors_a_patch_replaced():
    out = cli("run", "--json", "--patch", "layers.1.mlp.gate.topk_idx=x[..., 0]=5", "--only", "*gate.topk_idx")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(r["name"], r.get("patched")) for r in rows] == [("layers.1.mlp.gate.topk_idx", True),
                                                           ("layers.2.mlp.gate.topk_idx", None)]
    assert rows[0]["corners"]["first"][0] == 5
