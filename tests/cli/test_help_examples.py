"""Every example a command's --help gives works as given, on the tiny model: the command lines it
shows (`stepper fp8 --int4 0x89ABCDEF`) and the values its options and arguments offer as examples
('*k_pe*', compressed_kv, 'run --attn naive'). README's and docs/' command lines are run by
test_readme_commands; the debugger's own help by test_step.
"""

from __future__ import annotations

import re

import pytest
import typer.main
from helpers.cli import stepper

from stepper.cli.main import app

WEIGHT = "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"
PLACEHOLDERS = {"NAME": WEIGHT}  # what a user puts in place of a shown command line's placeholder

# An example value of an option or argument, as the help shows it, and a command line that gives it
EXAMPLES = [
    (("run",), "e.g. '*k_pe*'", ["run", "--only", "*k_pe*"]),
    (("run",), "(e.g. a --dump)", ["run", "--layer", "1", "--input", "dumped.safetensors"]),
    *[(("run",), "EXPR of its tensor x: 0, x*0.5, x+1e-3, x[..., 7]=0",
       ["run", "--patch", f"layers.1.self_attn.k_pe={expr}"]) for expr in ("0", "x*0.5", "x+1e-3", "x[..., 7]=0")],
    (("step",), "(e.g. compressed_kv)", ["step", "--break", "compressed_kv"]),
    (("diff",), "a run in quotes: 'run --attn naive' ('run': the default run)", ["diff", "run", "run --attn naive"]),
    *[(("explain",), shown, ["explain", name]) for shown, name in [
        ("(layers.1.self_attn.k_pe, k_pe)", "layers.1.self_attn.k_pe"), ("(layers.1.self_attn.k_pe, k_pe)", "k_pe"),
        ("a glob ('*gate*')", "*gate*"), ("a word of names (topk)", "topk"),
        ("(model.layers.1.self_attn.q_a_proj.weight:", "model.layers.1.self_attn.q_a_proj.weight"),
        ("name (kv_cmpr,", "kv_cmpr"), ("model.layers.1.self_attn.kv_a_proj_with_mqa)",
                                        "model.layers.1.self_attn.kv_a_proj_with_mqa")]],
    (("inspect",), "e.g. '*layers.1.*'", ["inspect", "ckpt", "--only", "*layers.1.*"]),
    (("fp8",), f"e.g. {WEIGHT}", ["fp8", "--weight", WEIGHT]),
    (("fp8",), "(DeepSeek-V4: layers.1.ffn.experts.0.w1.weight)",
     ["fp8", "--weight", "layers.1.ffn.experts.0.w1.weight", "--model", "tiny-v4"]),
    (("fp8",), "(also 205 or 0b11001101)", ["fp8", "205"]),
    (("fp8",), "(also 205 or 0b11001101)", ["fp8", "0b11001101"]),
]


def help_of(path: tuple[str, ...]) -> str:
    helped = stepper(*path, "--help", env={"COLUMNS": "80"})
    assert helped.returncode == 0, helped.stderr
    return helped.stdout


def command_paths(group, path=()):
    for name, sub in getattr(group, "commands", {}).items():
        yield from command_paths(sub, (*path, name)) if hasattr(sub, "commands") else [(*path, name)]


def shown_command_lines() -> list[str]:
    """The command lines the help texts show: a line of its own, `stepper COMMAND ...`, then what it does."""
    paths = list(command_paths(typer.main.get_command(app)))
    line = re.compile(rf"^ +(stepper (?:{'|'.join(sorted({p[0] for p in paths}))})\b.*?)(?: {{2,}}|$)", re.MULTILINE)
    return [m[1] for path in paths for m in line.finditer(help_of(path))]


@pytest.fixture
def folder(tmp_path):
    """What the examples read: the tiny model's checkpoint (ckpt) and a run's dump."""
    assert stepper("synth", "--out", tmp_path / "ckpt").returncode == 0
    assert stepper("run", "--dump", tmp_path / "dumped.safetensors").returncode == 0
    return tmp_path


def test_every_command_line_the_help_shows_runs(tmp_path):
    shown = shown_command_lines()
    assert "stepper fp8 --int4 0x89ABCDEF" in shown and "stepper fp8 --weight NAME" in shown
    for line in shown:
        args = [PLACEHOLDERS.get(word, word) for word in line.split()[1:]]
        out = stepper(*args, "--plain", cwd=tmp_path)
        assert out.returncode == 0, (line, out.stderr)


@pytest.mark.parametrize("path, shown, args", EXAMPLES, ids=lambda x: x if isinstance(x, str) else None)
def test_every_example_value_the_help_gives_works(folder, path, shown, args):
    assert shown in " ".join(help_of(path).split()), "the help no longer gives this example"
    out = stepper(*args, "--plain", cwd=folder)
    assert out.returncode == 0 and out.stdout, out.stderr
