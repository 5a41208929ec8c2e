"""`--use FILE.py`: whatever a learner's function returns or raises is one line naming the file,
the function and (for a result) what it returned against what was expected; stepper's own
functions pass those checks in every model they run."""

import inspect
from pathlib import Path

import numpy as np
import pytest
from helpers.cli import stepper

from stepper.lessons import check, overrides
from stepper.lessons.schema import find_lesson
from stepper.seams.trace import Recorder
from stepper.session import RunSpec, run


def error_line(out, path: Path) -> str:
    """The one line of the error, after the line saying what was swapped in (exit 2)."""
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("using your ") and "Traceback" not in out.stderr, out.stderr
    return lines[1]


def learner_file(tmp_path: Path, body: str, signature: str = "rms_norm(x, weight, eps)") -> Path:
    path = tmp_path / "mine.py"
    indented = "".join(f"    {line}\n" for line in body.splitlines())
    path.write_text(f"import numpy as np\n\n\ndef {signature}:\n" + indented)
    return path


def used(path: Path) -> str:
    """The error line of a tiny run (3 positions) with the file's function swapped in."""
    return error_line(stepper("run", "--plain", "--only", "logits", "--prompt-len", "3", "--use", str(path)), path)


@pytest.mark.parametrize(("body", "got"), [
    ("return x[..., :-1]", "float32[1, 3, 319]"),
    ("return None", "None"),
    ("return 3", "an int"),
    ("return (x, x)", "a tuple of 2"),
    ("return 'normed'", "a str"),
    ("return x.astype(np.float64)", "float64[1, 3, 320]"),
    ("return (x * 2).astype(np.int32)", "int32[1, 3, 320]"),
], ids=["shape", "None", "int", "tuple", "str", "float64", "ints"])
def test_a_wrong_result_names_the_function_what_it_returned_and_what_was_expected(tmp_path, body, got):
    path = learner_file(tmp_path, body)
    assert used(path) == f"stepper: error: {path}: rms_norm returned {got}; expected an array float32[1, 3, 320]"


def test_a_tuple_and_a_routing_are_checked_field_by_field(tmp_path):
    path = learner_file(tmp_path, "return x[..., :4], x[..., :4]", "latent(x, w, cfg, emit)")
    assert used(path) == (f"stepper: error: {path}: latent returned a tuple whose item 0: float32[1, 3, 4]; "
                          "expected an array float32[1, 3, 128]")
    path = learner_file(tmp_path, "return x[..., :4]", "latent(x, w, cfg, emit)")
    assert used(path) == f"stepper: error: {path}: latent returned float32[1, 3, 4]; expected a tuple of 2 arrays"
    body = ("from stepper.model.router import Routing\n"
            "return Routing(np.zeros((len(x), cfg.num_experts_per_tok)), np.ones((len(x), cfg.num_experts_per_tok), "
            "np.float32))")
    path = learner_file(tmp_path, body, "route(x, gate, bias, cfg, emit)")
    assert used(path) == (f"stepper: error: {path}: route returned a Routing whose topk_idx float64[3, 4]; "
                          "expected an array int64[3, 4]")


@pytest.mark.parametrize(("body", "raised"), [
    ("return np.reshape(x, (7, 13))", "ValueError: cannot reshape array of size 960 into shape (7,13)"),
    ("import json\nreturn json.loads('{')",
     "JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    ("raise ValueError('first\\nsecond \\x1b[2J')", "ValueError: first\\nsecond \\x1b[2J"),
    ("return rms_norm(x, weight, eps)", "RecursionError: maximum recursion depth exceeded"),
    ("raise NotImplementedError('write me')", "NotImplementedError: write me"),
], ids=["numpy", "library", "multi-line", "recursion", "stub"])
def test_what_a_function_raises_is_one_line_with_its_line(tmp_path, body, raised):
    path = learner_file(tmp_path, body)
    line = used(path)
    what = "is not written yet" if "NotImplemented" in raised else "raised"
    assert line.startswith(f"stepper: error: {path} line "), line
    said = line.rpartition(f", in rms_norm: {what} (")[2]  # Python words a recursion's end in more than one way
    assert said == f"{raised})" or raised.startswith("RecursionError") and said.startswith(raised), line
    assert "\x1b" not in line


def test_a_file_raising_while_it_loads_is_one_line(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("import numpy as np\n\nnp.reshape(np.zeros(3), (2, 2))\n\n\ndef rms_norm(x, weight, eps):\n    "
                    "return x\n")
    out = stepper("run", "--plain", "--use", str(path))
    assert out.returncode == 2 and out.stderr == (
        f"stepper: error: {path} line 3: loading it failed: ValueError: cannot reshape array of size 3 into shape "
        "(2,2)\n")
    path.write_text("raise RuntimeError('one\\ntwo')\n")
    out = stepper("run", "--plain", "--use", str(path))
    assert out.stderr == f"stepper: error: {path} line 1: loading it failed: RuntimeError: one\\ntwo\n"


def stand_in(name: str) -> str:
    """A learner's function that calls stepper's own: same signature, same result."""
    signature = inspect.signature(overrides.reference(name))
    plain = signature.replace(parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
                              return_annotation=signature.empty)
    passed = ", ".join(f"{p}={p}" if v.kind == v.KEYWORD_ONLY else p for p, v in plain.parameters.items())
    return f"def {name}{plain}:\n    return REFERENCES[{name!r}]({passed})\n"


MODELS = ["tiny", "tiny-v3", "tiny-int4", "tiny-v2", "tiny-v32"]


@pytest.mark.parametrize("model", MODELS)
def test_stepper_own_functions_pass_the_checks_in_every_model(tmp_path, model):
    path = tmp_path / "all.py"
    stand_ins = "\n\n".join(stand_in(n) for n in overrides.EXERCISES)
    path.write_text("from stepper.lessons.exercises import REFERENCES\n\n\n" + stand_ins)
    spec = RunSpec(model=model, prompt_len=3, decode=1)
    recorder = Recorder()
    with overrides.use([path]) as swapped:
        assert set(swapped) == set(overrides.EXERCISES)
        run(spec, [recorder])
    for event in check.golden(spec):
        assert np.array_equal(recorder.tensors()[event.name], event.array, equal_nan=True), event.name


def test_a_function_the_learners_own_code_calls_counts_as_called(tmp_path):
    """The fp8 solution's dequantize decodes through its own decode: the run uses that decode (no
    note that it was never called), and what goes wrong in it is named after it."""
    solution = find_lesson("fp8").solution
    out = stepper("run", "--plain", "--only", "logits", "--prompt-len", "3", "--use", solution)
    assert out.returncode == 0 and "never called" not in out.stderr, out.stderr
    broken = tmp_path / "fp8.py"
    one_short = "codes = as_codes(codes)[..., 1:]\n"  # decode's first line: a value short in every row
    broken.write_text(solution.read_text().replace("codes = as_codes(codes)\n", one_short, 1))
    assert "fp8.py: decode returned float32[" in used(broken)
