"""`--prompt TEXT` as a user meets it: the checkpoint's tokenizer makes the ids, and the tokens'
texts stand where ids do (the header, decode headings, the routing map's rows, the attention
heat map's axes, the debugger's p), in run, step, fixtures export and lesson start."""

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers import cli as command_line
from helpers.tokenizer_files import write_tiktoken_model, write_tokenizer_json

from stepper.presets import preset
from stepper.seams.trace import Recorder
from stepper.session import RunSpec, execute, prepare, run
from stepper.text import load_tokenizer
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.synth_checkpoint import synth_checkpoint

PROMPT = "hello world, the fox"


def stepper(*args: str, stdin: str | None = None, pre: str | None = None) -> subprocess.CompletedProcess:
    """`stepper ARGS` in the test process (helpers.cli), or with `pre` run first in a process of its
    own (e.g. to hide a library)."""
    if pre is None:
        return command_line.stepper(*args, stdin=stdin or "")
    code = f"import sys; {pre}; from stepper.cli.main import main; sys.argv = ['stepper', *{list(args)!r}]; main()"
    return subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120,
                          input=stdin)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    """A tiny checkpoint with a tokenizer.json, and the same weights with a Kimi tiktoken.model."""
    folder = synth_checkpoint(SyntheticWeights(preset("tiny"), seed=0), tmp_path_factory.mktemp("prompt") / "hf")
    write_tokenizer_json(folder)
    kimi = folder.parent / "kimi"
    shutil.copytree(folder, kimi)
    (kimi / "tokenizer.json").unlink()
    write_tiktoken_model(kimi)
    return folder


def ids_of(folder: Path, text: str) -> list[int]:
    return load_tokenizer(folder).encode(text)


def test_a_text_prompt_runs_as_its_ids(ckpt):
    ids = ids_of(ckpt, PROMPT)
    assert len(ids) == 6 and ids[0] == 0
    by_text, by_ids = Recorder(), Recorder()
    result = run(RunSpec(model=str(ckpt), prompt=PROMPT, decode=1), [by_text])
    run(RunSpec(model=str(ckpt), ids=tuple(ids), decode=1), [by_ids])
    assert result.prompt == tuple(ids)
    assert by_text.tensors().keys() == by_ids.tensors().keys()
    for name, array in by_ids.tensors().items():
        np.testing.assert_array_equal(by_text.tensors()[name], array, err_msg=name)
    plan = prepare(RunSpec(model=str(ckpt), prompt=PROMPT))
    assert plan.tokens.labels() == ["<bos>", "hello", "␣world", ",", "␣the", "␣fox"]


def test_the_routing_map_and_heat_map_show_the_tokens(ckpt):
    out = stepper("run", "--model", str(ckpt), "--plain", "--prompt", PROMPT, "--decode", "1", "--show",
                  "routing,attention",
                  "--only", "*layers.1.mlp.gate.topk_*", "--only", "*layers.1.self_attn.attn_weights")
    assert out.returncode == 0, out.stderr
    ids = ids_of(ckpt, PROMPT)
    assert f"prompt: 6 tokens from tokenizer.json: {ids[0]} <bos> · {ids[1]} hello · {ids[2]} ␣world" in out.stdout
    prefill, decode = out.stdout.split("decode0 · token 6 ")
    routing = prefill.split("tok\\e")[1]
    for row in ("0 <bos> ", "1 hello ", "2 ␣world ", "3 , ", "4 ␣the ", "5 ␣fox "):
        assert f"\n{row.rjust(9)}" in routing, row  # each row starts with its token
    heat = prefill.split("head 0")[1].split("keys s:")[0]
    assert " 1 hello █" in heat.replace("░", "█").replace("▒", "█").replace("▓", "█")
    assert "keys s: 0 <bos> · 1 hello · 2 ␣world · 3 , · 4 ␣the · 5 ␣fox" in prefill
    assert "keys s: 0 <bos> · 1 hello · 2 ␣world · 3 , · 4 ␣the · 5 ␣fox · 6 " in decode  # the decode step's key 6
    generated = json.loads(out.stdout.split("generated ")[1].split("]")[0] + "]")
    tok = load_tokenizer(ckpt)
    assert out.stdout.rstrip().endswith(repr(tok.decode(generated)))  # the text the decode step generated


def test_a_kimi_tiktoken_prompt_shows_its_tokens(ckpt):
    kimi = ckpt.parent / "kimi"
    ids = ids_of(kimi, "[BOS]中文English混合")
    assert ids[0] == 320  # the first special id, right after the 320 ranked tokens
    out = stepper("run", "--model", str(kimi), "--plain", "--prompt", "[BOS]中文English混合", "--decode", "1",
                  "--only", "*layers.1.mlp.gate.topk_idx", "--show", "routing")
    assert out.returncode == 0, out.stderr
    assert f"prompt: {len(ids)} tokens from tiktoken.model: 320 [BOS] · " in out.stdout
    header = out.stdout.split("\n")[2]
    assert " · 69 E · 110 n · 103 g · " in header  # the training text had no English after 中文: byte tokens
    assert header.count(" · ") == 16 and " · … · " in header  # 19 tokens: the first 12, …, the last 4
    assert f"({len(ids)} tokens) at positions 0.." in out.stdout
    assert f"decode0 · token {len(ids)} " in out.stdout


def test_the_debuggers_p_names_the_tokens_of_a_token_axis(ckpt):
    commands = "p layers.1.self_attn.attn_weights[0,0,2:4]\np layers.1.mlp.gate.topk_idx\nq\n"
    out = stepper("step", "--model", str(ckpt), "--plain", "--prompt", PROMPT, "--break",
                  "layers.1.mlp.gate.topk_weight",
                  stdin=commands)
    assert out.returncode == 0, out.stderr
    assert "T (positions): 2 ␣world · 3 ," in out.stdout
    assert "S (attended positions): 0 <bos> · 1 hello · 2 ␣world · 3 , · 4 ␣the · 5 ␣fox" in out.stdout
    assert "N (tokens): 0 <bos> · 1 hello · 2 ␣world · 3 , · 4 ␣the · 5 ␣fox" in out.stdout


def test_token_texts_from_the_file_are_escaped(ckpt, tmp_path):
    folder = tmp_path / "esc"
    shutil.copytree(ckpt, folder)
    raw = json.loads((folder / "tokenizer.json").read_text())
    raw["added_tokens"].append({"id": 399, "content": "\x1b[2J", "single_word": False, "lstrip": False, "rstrip": False,
                                "normalized": False, "special": True})
    (folder / "tokenizer.json").write_text(json.dumps(raw))
    out = stepper("run", "--model", str(folder), "--plain", "--prompt", "hi\x1b[2J", "--only", "*topk_idx")
    assert out.returncode == 0, out.stderr
    last = ids_of(folder, "hi\x1b[2J")[-1]
    assert load_tokenizer(folder).piece(last) == "\x1b[2J"  # one token, whose text holds ESC
    assert "\x1b" not in out.stdout and f"{last} \\x1b[2J" in out.stdout


@pytest.mark.parametrize("args, message", [
    (["--prompt", "hi"], "--prompt needs a tokenizer, and model tiny (synthetic weights) has none"),
    (["--prompt", "hi", "--ids", "1"], "give --prompt or --ids, not both"),
    (["--prompt", "hi", "--prompt-len", "3"], "give --prompt or --prompt-len, not both"),
])
def test_a_prompt_that_cannot_be_tokenized_is_one_line(args, message):
    out = stepper("run", *args)
    assert out.returncode == 2 and message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and out.stdout == ""


def test_an_empty_prompt_or_no_tokenizer_is_one_line(ckpt, tmp_path):
    out = stepper("run", "--model", str(ckpt), "--prompt", "")
    assert out.returncode == 2 and "--prompt is empty" in out.stderr
    bare = tmp_path / "bare"
    shutil.copytree(ckpt, bare)
    (bare / "tokenizer.json").unlink()
    out = stepper("run", "--model", str(bare), "--prompt", "hi")
    assert out.returncode == 2 and "no tokenizer.json or tiktoken.model" in out.stderr


def test_without_the_text_extra_prompt_says_what_to_install(ckpt):
    out = stepper("run", "--model", str(ckpt), "--prompt", "hi", pre="sys.modules['tokenizers'] = None")
    assert out.returncode == 2
    assert out.stderr.strip().endswith("""needs the 'tokenizers' library: pip install "stepper[text]\"""")
    assert len(out.stderr.strip().splitlines()) == 1


def test_fixtures_export_records_the_prompts_ids(ckpt, tmp_path):
    out = stepper("fixtures", "export", str(tmp_path / "fx"), "--model", str(ckpt), "--prompt", PROMPT, "--layer", "1")
    assert out.returncode == 0, out.stderr
    manifest = json.loads((tmp_path / "fx" / "manifest.json").read_text())
    assert manifest["export"]["ids"] == ids_of(ckpt, PROMPT)
    out = stepper("fixtures", "export", str(tmp_path / "fx2"), "--prompt", PROMPT)
    assert out.returncode == 2 and "has none" in out.stderr


def test_a_lesson_walks_on_a_text_prompt(ckpt, tmp_path):
    env = {"STEPPER_DATA_DIR": str(tmp_path / "data")}
    out = command_line.stepper("lesson", "start", "moe-routing", "--plain", "--model", str(ckpt), "--prompt", PROMPT,
                               stdin="\n" * 200, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert "The layer's input is [1, 6, 320]" in out.stdout  # the prompt's 6 tokens
    out = command_line.stepper("lesson", "start", "moe-routing", "--plain", "--prompt", PROMPT, stdin="\n" * 200,
                               cwd=tmp_path, env=env)
    assert out.returncode == 2 and out.stderr == (
        "stepper: error: --prompt needs --model DIR, a checkpoint with its tokenizer: lesson moe-routing's model "
        "tiny-v3 has synthetic weights and no tokenizer\n")


def test_a_plan_runs_twice_with_the_same_tokens(ckpt):
    plan = prepare(replace(RunSpec(model=str(ckpt), prompt=PROMPT), decode=2))
    first = execute(plan, [])
    second = execute(plan, [])
    assert first.generated == second.generated and len(plan.tokens.ids) == 6 + 2
