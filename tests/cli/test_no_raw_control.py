"""Nothing from a file or a user reaches the terminal raw.

A config string, a path, an .npz tensor name, a lesson file and the debugger's typed commands hold
ESC [2J (clear the screen), NUL, a carriage return, the C1 control CSI (U+009B) and Rich markup.
The commands run in the test process (helpers.cli), writing bytes as into a pipe: plain (no
colour at all: not one byte below 0x20 but newline and tab) and with colour forced (stepper's own
colour codes, SGR sequences, are the only escape sequences allowed). Each command's output must also show the odd
text escaped, where it belongs, and its markup literally.
"""

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import cli as command_line
from safetensors.numpy import load_file, save_file

from stepper.untrusted import shown

REPO = Path(__file__).resolve().parents[2]
ODD = "E\x1b[2J\x00N\rR\x9b[red]x"  # in files
TYPED = "T\x1b[2J\rR\x9b[red]x"  # in arguments, paths and typed lines, which cannot hold NUL
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # every control but newline and tab
SGR = re.compile("\x1b\\[[0-9;]*m")  # a colour or style: stepper's own, when colour is on


def stepper(*args: str, cwd: Path, stdin: str = "", colour: bool = False,
            env: dict | None = None) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of a command, the output checked byte by byte: valid UTF-8 (a
    byte that is not UTF-8 would be a raw one), no control character, and with colour only SGR.
    With colour, a --plain among the arguments is dropped (it turns every style off)."""
    if colour:
        args = tuple(a for a in args if a != "--plain")
    environ = {"FORCE_COLOR": None, "NO_COLOR": None, "TERM": None, "COLUMNS": "80"}
    environ.update(**({"FORCE_COLOR": "1", "TERM": "xterm-256color"} if colour else {}), **(env or {}))
    p = command_line.stepper(*args, cwd=cwd, env=environ, stdin=stdin)  # decoded strictly: a raw non-UTF-8 byte fails
    out, err = p.stdout, p.stderr
    for stream in (out, err):
        bare = SGR.sub("", stream) if colour else stream
        assert CONTROL.findall(bare) == [], f"{args}: raw control characters in {bare!r}"
    if colour:
        assert SGR.search(out + err), f"{args}: colour was forced but none came"
    return p.returncode, SGR.sub("", out), SGR.sub("", err)


@pytest.fixture(scope="module")
def place(tmp_path_factory) -> Path:
    """A folder holding everything odd: a checkpoint whose folder name and config name are odd, an
    --input file, a fixture and a candidate, a lesson."""
    root = tmp_path_factory.mktemp("odd")
    code, out, _ = stepper("synth", "--out", f"ck{TYPED}", cwd=root)
    assert code == 0 and out.startswith(f"wrote {shown('ck' + TYPED)}: 7 files")
    config = root / f"ck{TYPED}" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "_name_or_path": ODD}))
    hidden = np.random.default_rng(0).standard_normal((1, 3, 320)).astype(np.float32)
    save_file({"layers.1.hidden_states": hidden}, str(root / f"in{TYPED}.safetensors"),
              metadata={"note": ODD, ODD: ODD})
    fixture = REPO / "fixtures" / "tiny-prefill-decode"
    (root / f"fx{TYPED}").mkdir()
    for name in ("manifest.json", "tensors.safetensors"):
        shutil.copyfile(fixture / name, root / f"fx{TYPED}" / name)
    tensors = load_file(str(fixture / "tensors.safetensors"))
    odd = {"prefill.embed": tensors["prefill.embed"] + 1, TYPED: tensors["prefill.embed"]}  # a zip's names stop at NUL
    np.savez(root / f"cand{TYPED}.npz", **odd)
    write_lesson(root / "lessons" / "01-odd")
    return root


def write_lesson(folder: Path) -> None:
    folder.mkdir(parents=True)
    toml = json.dumps  # a JSON string is a TOML basic string: \u001b, \u0000, \r and \u009b escaped
    (folder / "lesson.toml").write_text(f"""
title = {toml("title " + ODD)}
summary = {toml("summary " + ODD)}
intro = {toml("intro " + ODD)}
outro = {toml("outro " + ODD)}
[run]
model = "tiny"
prompt_len = 3
[exercise]
functions = ["softmax"]
hints = [{toml("hint " + ODD)}]
[[steps]]
stop = "layers.1.self_attn.k_pe"
text = {toml("text " + ODD)}
explain = {toml("explain " + ODD)}
commands = [{toml("p " + ODD)}]
[[steps.predict]]
question = {toml("question " + ODD)}
kind = "choice"
answer = "a"
options = [{{ answer = {toml("one " + ODD)} }}, {{ answer = "two", why = {toml("why " + ODD)} }}]
""")
    (folder / "exercise.py").write_text("def softmax(x, axis=-1):\n    raise NotImplementedError\n")
    (folder / "solution.py").write_text(f"# {ODD}\ndef softmax(x, axis=-1):\n    return x\n")


def test_run_shows_the_config_name_and_the_checkpoint_path_escaped(place):
    for colour in (False, True):
        code, out, _ = stepper("run", "--plain", "--model", f"ck{TYPED}", "--only", "*k_pe", "--show", "hist,scales",
                               cwd=place, colour=colour)
        assert code == 0
        assert out.startswith(f"model {shown(ODD)} (kimi_k2): 3 layers (1 dense), 4 heads, 32 experts top-4 · "
                              f"weights from {shown('ck' + TYPED)} · layers 0..2\n")
        assert "\nlayers.1.self_attn.k_pe\n" in out  # the histogram's title


def test_json_lines_escape_by_themselves(place):
    code, out, _ = stepper("run", "--json", "--model", f"ck{TYPED}", "--only", "*k_pe", cwd=place)
    assert code == 0 and [json.loads(line)["name"] for line in out.splitlines()] == [
        "layers.0.self_attn.k_pe", "layers.1.self_attn.k_pe", "layers.2.self_attn.k_pe"]


def test_a_lone_layer_names_its_input_escaped_and_the_dump_too(place):
    code, out, _ = stepper("run", "--plain", "--layer", "1", "--input", f"in{TYPED}.safetensors", "--only", "*k_pe",
                           "--dump", f"dump{TYPED}.safetensors", cwd=place)
    assert code == 0
    assert f"· layer 1 alone on {shown('in' + TYPED)}.safetensors\n" in out
    assert out.endswith(f"dumped to {shown('dump' + TYPED)}.safetensors\n")


def test_your_exercise_file_is_named_escaped(place):
    shutil.copyfile(REPO / "lessons" / "01-tour" / "solution.py", place / f"use{TYPED}.py")
    code, out, err = stepper("run", "--plain", "--use", f"use{TYPED}.py", "--only", "logits", cwd=place, colour=True)
    assert code == 0 and "\nlogits  [" in out and err == f"using your softmax from use{shown(TYPED)}.py\n"


def test_an_error_shows_what_the_user_typed_escaped(place):
    code, out, err = stepper("run", "--plain", "--only", TYPED, cwd=place)
    assert code == 2
    assert err == f"stepper: error: --only {shown(TYPED)}: matches no tensor of this run\n"
    code, out, err = stepper("explain", TYPED, cwd=place)
    assert (code, out) == (2, "")
    assert err == f"stepper: error: no tensor of model tiny matches '{shown(TYPED)}' (stepper tree lists them)\n"


def test_tree_and_fp8_name_the_model_escaped(place):
    code, out, _ = stepper("tree", "--plain", "--model", f"ck{TYPED}", cwd=place, colour=True)
    assert code == 0 and out.startswith(f"{shown(ODD)}: layer 0 (dense), naive attention\n")
    weight = "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"
    code, out, _ = stepper("fp8", "--plain", "--weight", weight, "--model", f"ck{TYPED}", cwd=place)
    assert code == 0 and out.startswith(f"{weight}  F8_E4M3 [144, 320]  scales [2, 3] (128x128 blocks)  "
                                        f"checkpoint {shown('ck' + TYPED)}\n")


DEBUGGER = [f"p {TYPED}", f"b {TYPED}", f"e {TYPED}", f"x {TYPED} k_pe", f"s hist {TYPED}", f"s scales {TYPED}",
            TYPED, "q"]


@pytest.mark.parametrize("colour", [False, True])
def test_the_debugger_echoes_and_answers_escaped(place, colour):
    code, out, _ = stepper("step", "--plain", "--model", f"ck{TYPED}", "--break", "*k_pe", cwd=place, colour=colour,
                           stdin="\n".join(DEBUGGER) + "\n")
    assert code == 0
    for line in DEBUGGER:
        assert f"\n(stepper) {shown(line)}\n" in out
    t = shown(TYPED)
    for answer in (f"bad slice '{t}': expected NAME[i, a:b, ...]", f"b {t}: matches no tensor of this run",
                   f"no tensor '{t}' in this run (h lists those seen)", f"unknown command '{t}'"):
        assert f"\n{answer}\n" in out
    explained = f"no tensor of model {shown(ODD)} matches '{t}' (stepper tree lists them)"  # `[` makes it a glob
    assert f"\n{explained}\n" in out


@pytest.mark.parametrize("suffix", [".html", ".svg", ".txt"])
def test_the_recorded_session_holds_no_control_character(place, suffix):
    export = place / f"session{suffix}"
    code, _, err = stepper("step", "--model", f"ck{TYPED}", "--break", "*k_pe", "--export", str(export), "--force",
                           cwd=place, colour=True, stdin=f"p {TYPED}\nq\n")
    assert code == 0 and err == f"session recorded to {export}\n"
    text = export.read_text(encoding="utf-8")
    assert CONTROL.findall(text) == []
    escaped = shown(ODD).replace("&", "&amp;").replace("<", "&lt;") if suffix == ".html" else shown(ODD)
    if suffix != ".svg":  # an SVG places each run of text on its own, with spaces as &#160;
        assert f"model {escaped} (kimi_k2)" in text


def test_fixtures_verify_shows_file_and_tensor_names_escaped(place):
    code, out, _ = stepper("fixtures", "verify", f"fx{TYPED}", f"cand{TYPED}.npz", "--problems", cwd=place,
                           colour=True)
    assert code == 1
    assert out.startswith(f"fx{shown(TYPED)} vs cand{shown(TYPED)}.npz\n")
    assert f"\n1 candidate names not recognised: {shown(TYPED)}\n" in out
    assert "\nfirst divergence: prefill.embed: " in out


def test_a_lesson_file_is_shown_escaped(place):
    env = {"STEPPER_LESSONS_DIR": str(place / "lessons"), "STEPPER_DATA_DIR": str(place / "data")}
    code, out, _ = stepper("lesson", "list", "--plain", cwd=place, env=env, colour=True)
    assert code == 0 and f"\n 1  odd     title {shown(ODD)}  ·       ·" in out
    code, out, _ = stepper("lesson", "start", "odd", "--workspace", f"ws{TYPED}", cwd=place, env=env,
                           stdin=f"b\n{TYPED}\n\n\n")
    assert code == 0
    for text in ("title", "intro", "text", "explain", "outro"):
        assert shown(f"{text} {ODD}") in out
    assert f"predict: question {shown(ODD)}\na) one {shown(ODD)}   b) two\n" in out
    assert f"\nyour prediction> {shown(TYPED)}\n" in out
    assert f"\n✗ why {shown(ODD)}\n" in out and f"\n→ the answer: one {shown(ODD)}\n" in out
    assert f"\n(stepper) p {shown(ODD)}\n" in out
    code, out, _ = stepper("lesson", "hint", "odd", cwd=place, env=env)
    assert (code, out) == (0, f"hint 1 of 1: hint {shown(ODD)}\n")
    code, out, _ = stepper("lesson", "solution", "odd", "--give-up", cwd=place, env=env, colour=True)
    read = ODD.replace("\r", "\n")  # Python reads a lone \r in a text file as a newline
    assert code == 0 and f"# {shown(read, lines=True)}\n" in out


def test_lesson_check_shows_what_your_exercise_said_escaped(place):
    env = {"STEPPER_LESSONS_DIR": str(place / "lessons"), "STEPPER_DATA_DIR": str(place / "data")}
    (place / f"bad{TYPED}.py").write_text(f"def softmax(x, axis=-1):\n    raise ValueError({ODD!r})\n")
    code, out, _ = stepper("lesson", "check", "odd", "--file", f"bad{TYPED}.py", cwd=place, env=env, colour=True)
    assert code == 1
    assert out.startswith(f"checking bad{shown(TYPED)}.py · lesson 1, odd: title {shown(ODD)}\n✗ softmax fails on ")
    assert f"ValueError: {shown(ODD)}" in " ".join(out.split())  # the detail wraps at the width, between words


def test_fixtures_export_names_its_folder_escaped(place):
    code, out, _ = stepper("fixtures", "export", f"out{TYPED}", "--prompt-len", "2", cwd=place, colour=True)
    assert code == 0
    assert f"\nwrote out{shown(TYPED)}: " in "\n" + out


def test_bench_lines_are_shown_escaped(monkeypatch, capsys):
    """What the bench says (paths of its work folder, the machine's name) reaches the screen escaped."""
    from stepper.bench import ceilings, figures, runner
    from stepper.cli.bench import bench_command

    def run_all(workdir, with_torch, say, *scenarios):
        say(f"writing {workdir}")
        say("a progress line long enough to pass the 80 columns a pipe is given by default, and kept whole there")
        return [figures.Figure(name="decode", value=0.25, unit="s", note=f"in {workdir}, " + "noted " * 20)]

    monkeypatch.setattr(runner, "run_all", run_all)
    monkeypatch.setattr(ceilings, "machine", lambda: f"cpu {TYPED}")
    bench_command(workdir=Path(f"w{TYPED}"), torch=False, int4=False, as_json=False)
    out = capsys.readouterr().out
    assert CONTROL.findall(out) == [] and "[red]x" in out
    assert f"writing w{shown(TYPED)}" in out and f"machine: cpu {shown(TYPED)}" in out and f"in w{shown(TYPED)}" in out
    lines = out.splitlines()  # through a pipe, each line whole
    assert "· a progress line long enough to pass the 80 columns a pipe is given by default, and kept whole there" \
        in lines
    noted = "noted " * 19 + "noted"
    assert any(line.startswith("decode: 0.25 s") and line.rstrip().endswith(noted) for line in lines), lines
