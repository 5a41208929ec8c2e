"""Input nested 100,000 deep is one line, never a RecursionError: JSON files (counted before the
parser runs: a --map file, a dump's `order` metadata, a config.json) and patch expressions
(`--patch`, the debugger's `set`, patch= strings in Python)."""

import json
from pathlib import Path

import numpy as np
import pytest
from helpers.cli import one_line, stepper
from safetensors.numpy import save_file

from stepper.errors import StepperError
from stepper.seams.patching import MAX_EXPR, MAX_NESTING, parse_patch
from stepper.untrusted import jsonfile
from stepper.views.dump import DUMP_FORMAT

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "fixtures" / "tiny-prefill-decode"
DEEP_ARRAY = "[" * 100_000 + "]" * 100_000
DEEP_OBJECT = '{"a": ' * 100_000 + "1" + "}" * 100_000
NESTED = f"JSON nested too deeply (more than {jsonfile.MAX_DEPTH} arrays or objects inside one another)"


@pytest.mark.parametrize("text, depth", [
    ("[]", 1), ('{"a": [1, {"b": []}]}', 4), ('["[[[[", "\\"[[", {"]]": 1}]', 2), ("", 0), (DEEP_ARRAY, 100_000),
])
def test_depth_counts_brackets_outside_strings(text, depth):
    assert jsonfile.depth(text) == depth


def test_the_deepest_allowed_parses_and_one_more_is_refused():
    deepest = "[" * jsonfile.MAX_DEPTH + "]" * jsonfile.MAX_DEPTH
    assert jsonfile.parse_json(deepest, "f") == json.loads(deepest)
    with pytest.raises(StepperError, match=r"^f: JSON nested too deeply"):
        jsonfile.parse_json("[" + deepest + "]", "f")


@pytest.mark.parametrize("text", [DEEP_ARRAY, DEEP_OBJECT], ids=["array", "object"])
def test_a_map_file_nested_100000_deep(tmp_path, text):
    (tmp_path / "map.json").write_text(text)
    candidate = tmp_path / "c.safetensors"
    save_file({"model.embed_tokens.weight": np.zeros(2, np.float32)}, candidate)
    line = one_line(stepper("fixtures", "verify", FIXTURE, candidate, "--map", tmp_path / "map.json"))
    assert line == f"stepper: error: --map {tmp_path / 'map.json'}: {NESTED}"


def test_a_dumps_order_nested_100000_deep(tmp_path):
    dump = tmp_path / "a.safetensors"
    save_file({"embed": np.zeros(2, np.float32)}, dump, metadata={"format": DUMP_FORMAT, "order": DEEP_ARRAY})
    line = one_line(stepper("diff", "--plain", str(dump), str(dump)))
    assert line.endswith(f"{dump}: metadata 'order': {NESTED}; expected a JSON list of names")


def test_a_config_nested_100000_deep(tmp_path):
    (tmp_path / "config.json").write_text('{"rope_scaling": ' + DEEP_OBJECT + "}")
    line = one_line(stepper("run", "--model", str(tmp_path), "--plain"))
    assert line == f"stepper: error: {tmp_path / 'config.json'}: {NESTED}"


DEEP_EXPRESSIONS = {
    "brackets": "(" * 100_000 + "x" + ")" * 100_000,
    "signs": "-" * 100_000 + "x",
    "operators": "+".join(["x"] * 100_000),
    "slices": "x[" * 100_000 + "0" + "]" * 100_000,
}


@pytest.mark.parametrize("expr", DEEP_EXPRESSIONS.values(), ids=DEEP_EXPRESSIONS.keys())
def test_a_patch_nested_100000_deep_is_one_line(expr):
    line = one_line(stepper("run", "--plain", "--patch", f"logits={expr}"))
    assert line == (f"stepper: error: --patch logits={expr[:40]}...: {len(expr)} characters; "
                    f"an expression is at most {MAX_EXPR}")


@pytest.mark.parametrize("expr", ["-" * 500 + "x", "+".join(["x"] * 400), "x*(" * 150 + "x" + ")" * 150],
                         ids=["signs", "operators", "products"])
def test_within_the_length_the_nesting_is_bounded(expr):
    with pytest.raises(StepperError) as refused:
        parse_patch(f"logits={expr}")
    assert str(refused.value) == (f"--patch logits={expr[:40]}...: nested more than {MAX_NESTING} deep "
                                  "(brackets, operators, signs)")


def test_the_debuggers_set_nested_100000_deep_is_one_line_and_the_session_goes_on():
    out = stepper("step", "--plain", "--break", "logits", stdin=f"c\nset = {DEEP_EXPRESSIONS['signs']}\nq\n")
    assert out.returncode == 0, out.stderr
    said = [line for line in out.stdout.splitlines() if "an expression is at most" in line]
    expected = f"set layers.2.mlp.gate.logits = {'-' * 40}...: 100001 characters; an expression is at most {MAX_EXPR}"
    assert said == [expected], out.stdout[-3000:]


def test_nesting_within_the_bound_still_patches():
    _, fn = parse_patch("logits=" + "(" * 30 + "x*2" + ")" * 30)
    np.testing.assert_array_equal(fn(np.arange(3, dtype=np.float32), "logits"), [0, 2, 4])
