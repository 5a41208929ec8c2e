"""A tokenizer file's settings are bounded before they run, and what the tokenizer libraries raise
(a Rust panic too) is one line: `stepper run --prompt` on a checkpoint whose tokenizer.json pads
every prompt to 10^8 tokens, truncates with an overlap near its length, holds more tokens than
stepper reads, cannot encode the prompt (no unknown token, a regex past Oniguruma's retry limit),
or nests 100,000 deep."""

import copy
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cli import one_line, stepper
from helpers.files import linked

from stepper import text
from stepper.presets import preset
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.synth_checkpoint import synth_checkpoint

ROOT = Path(__file__).resolve().parents[2]
WORDS = {
    "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
    "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
    "model": {"type": "WordLevel", "vocab": {"a": 0, "b": 1, "[UNK]": 2}, "unk_token": "[UNK]"},
}
FIXED = {"strategy": {"Fixed": 10**8}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
         "pad_type_id": 0, "pad_token": "a"}


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    return synth_checkpoint(SyntheticWeights(preset("tiny"), seed=0), tmp_path_factory.mktemp("tok") / "w")


def checkpoint(weights: Path, folder: Path, tokenizer: dict | str) -> Path:
    """The tiny checkpoint's files (linked) with this tokenizer.json."""
    linked(weights, folder)
    (folder / "tokenizer.json").write_text(tokenizer if isinstance(tokenizer, str) else json.dumps(tokenizer))
    return folder


def changed(**fields) -> dict:
    raw = copy.deepcopy(WORDS)
    for key, value in fields.items():
        *parents, last = key.split("__")
        inner = raw
        for parent in parents:
            inner = inner[parent]
        inner[last] = value
    return raw


def in_a_process(*args: str) -> subprocess.CompletedProcess:
    """`python -m stepper ARGS` with its address space limited to 3 GB: a tokenizer that made 10^8
    ids (about 8 GB in the library) fails there instead of taking the machine's memory."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))

    env = {**os.environ, "PYTHONPATH": str(ROOT), "RUST_BACKTRACE": "1"}
    return subprocess.run([sys.executable, "-m", "stepper", *args], capture_output=True, text=True, timeout=300,
                          env=env, preexec_fn=limit, check=False)


def test_the_file_as_written_runs(weights, tmp_path):
    folder = checkpoint(weights, tmp_path / "c", WORDS)
    out = stepper("run", "--model", str(folder), "--prompt", "a b zzz", "--plain", "--only", "embed")
    assert out.returncode == 0, out.stderr
    assert "prompt: 3 tokens from tokenizer.json: 0 a · 1 b · 2 [UNK]" in out.stdout


@pytest.mark.parametrize(("padding", "says"), [
    (FIXED, "padding.strategy.Fixed is 100000000 tokens; stepper takes at most 1048576"),
    ({**FIXED, "strategy": "BatchLongest", "pad_to_multiple_of": 10**8},
     "padding.pad_to_multiple_of is 100000000 tokens; stepper takes at most 1048576"),
], ids=["fixed", "multiple"])
def test_a_padding_to_10_8_tokens_is_refused_before_the_library_pads(weights, tmp_path, padding, says):
    folder = checkpoint(weights, tmp_path / "c", changed(padding=padding))
    line = one_line(in_a_process("run", "--model", str(folder), "--prompt", "a b", "--plain"))
    assert line == f"stepper: error: {folder / 'tokenizer.json'}: {says} (every prompt would be made that long)"


def test_a_stride_near_the_truncation_length_is_refused(weights, tmp_path):
    truncation = {"direction": "Right", "max_length": 1000, "strategy": "LongestFirst", "stride": 999}
    folder = checkpoint(weights, tmp_path / "c", changed(truncation=truncation))
    line = one_line(stepper("run", "--model", str(folder), "--prompt", "a b"))
    assert line.endswith("tokenizer.json: truncation.stride is 999; at most half of max_length (1000), or a long "
                         "prompt overflows into about as many pieces as it has tokens")


def test_more_tokens_than_stepper_reads_are_refused(weights, tmp_path, monkeypatch):
    monkeypatch.setattr(text, "MAX_VOCAB", 2)
    folder = checkpoint(weights, tmp_path / "c", WORDS)
    line = one_line(stepper("run", "--model", str(folder), "--prompt", "a b"))
    assert line.endswith("tokenizer.json: 3 tokens; stepper reads at most 2")


def test_a_prompt_or_a_file_past_its_bound_is_one_line(weights, tmp_path, monkeypatch):
    folder = checkpoint(weights, tmp_path / "c", WORDS)
    monkeypatch.setattr(text, "MAX_PROMPT_CHARS", 8)
    line = one_line(stepper("run", "--model", str(folder), "--prompt", "a b a b a"))
    assert line == "stepper: error: the prompt has 9 characters; stepper encodes at most 8"
    monkeypatch.setattr(text, "MAX_FILE_BYTES", 100)
    size = (folder / "tokenizer.json").stat().st_size
    line = one_line(stepper("run", "--model", str(folder), "--prompt", "a b"))
    assert line.endswith(f"tokenizer.json: {size} bytes; a tokenizer file stepper reads is at most 100")


def test_an_unknown_token_the_vocabulary_lacks_is_one_line(weights, tmp_path):
    folder = checkpoint(weights, tmp_path / "c", changed(model__unk_token="[NONE]"))
    line = one_line(stepper("run", "--model", str(folder), "--prompt", "a zzz"))
    assert line == (f"stepper: error: {folder / 'tokenizer.json'}: encoding the prompt failed "
                    "(Exception: WordLevel error: Missing [UNK] token from the vocabulary)")


def test_a_panic_in_the_library_is_one_line_and_its_handlers_lines_are_not_shown(weights, tmp_path):
    split = {"type": "Split", "pattern": {"Regex": "(.*a){12}x"}, "behavior": "Isolated", "invert": False}
    folder = checkpoint(weights, tmp_path / "c", changed(pre_tokenizer=split))
    line = one_line(in_a_process("run", "--model", str(folder), "--prompt", "a" * 40, "--plain"))
    assert line == (f"stepper: error: {folder / 'tokenizer.json'}: encoding the prompt failed "
                    "(PanicException: Onig: Regex search error: retry-limit-in-match over)")


def test_a_tokenizer_json_nested_100000_deep_is_one_line(weights, tmp_path):
    folder = checkpoint(weights, tmp_path / "c", '{"model": ' + "[" * 100_000 + "]" * 100_000 + "}")
    line = one_line(stepper("run", "--model", str(folder), "--prompt", "a b"))
    assert line.startswith(f"stepper: error: {folder / 'tokenizer.json'}: not a tokenizer.json the tokenizers library "
                           "can read (Exception: recursion limit exceeded")
