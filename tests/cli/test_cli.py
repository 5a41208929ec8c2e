"""The command line as a user meets it: output, JSON Lines, dumps, and bad input (exit 2, one line)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import typer.main
from helpers.cli import stepper
from safetensors.numpy import load_file

from stepper import catalog
from stepper.families import derive
from stepper.presets import preset
from stepper.seams.trace import unphased


def in_a_process(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stepper", *args], check=False, capture_output=True, text=True,
                          timeout=120)


def catalogued_names(attn: str = "naive") -> set[str]:
    """The names a run of the default model emits on this attention path (its layers' as their code
    emits them, families.derive; the global ones), each catalogued."""
    cfg, cat = preset("tiny"), catalog.load()
    layers = {e["name"] for layer in range(cfg.num_hidden_layers) for e in cat.layer_sequence(cfg, layer, attn)}
    assert all(cat.entry(name) is not None for name in layers)
    return layers | set(derive.global_names(cfg, ("embed", "rope_cos", "rope_sin", "norm", "logits")))


def catalogued_naive_names() -> set[str]:
    return catalogued_names("naive")


def key_of(name: str) -> str:
    name = unphased(name)
    return name.split(".", 2)[2] if name.startswith("layers.") else name


def test_run_shows_the_latent_tensors_with_named_shapes():
    out = in_a_process("run", "--plain")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for key in ("self_attn.compressed_kv", "self_attn.k_pe ", "self_attn.k_nope"):
        assert f"layers.1.{key}" in text
    assert "layers.1.self_attn.compressed_kv  [B=1 batch, T=7 positions, 128 kv latent]  float32" in text
    assert "min " in text and "absmax " in text and "corners " in text
    assert "\x1b[" not in text  # --plain: no colour codes


def test_json_lines_hold_every_catalogued_name_and_true_statistics():
    out = stepper("run", "--json", "--ids", "5,6,7,8")
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert catalogued_naive_names() <= {key_of(r["name"]) for r in records}
    kv = next(r for r in records if r["name"] == "layers.1.self_attn.compressed_kv")
    assert kv["shape"] == [1, 4, 128] and kv["named_shape"] == "[B=1 batch, T=4 positions, 128 kv latent]"
    scores = next(r for r in records if r["name"] == "layers.0.self_attn.attn_scores")
    assert scores["stats"]["inf"] == 4 * 6  # 4 heads x the 6 masked (future) entries of a 4x4 causal mask
    weights = next(r for r in records if r["name"] == "layers.0.self_attn.attn_weights")
    assert weights["stats"]["sum"] == pytest.approx(4 * 4, rel=1e-5)  # every softmax row sums to 1


def test_json_lines_with_pictures_keep_stdout_json():
    """--show's pictures go to stderr with --json: stdout stays one JSON object a line."""
    out = stepper("run", "--json", "--ids", "5,6,7,8", "--show", "routing,hist", "--only", "*mlp.gate.*")
    assert out.returncode == 0, out.stderr
    names = [json.loads(line)["name"] for line in out.stdout.splitlines()]
    assert "layers.1.mlp.gate.topk_idx" in names
    assert "layers.1.mlp.gate.topk_idx" in out.stderr  # a picture's title


def test_dump_holds_every_tensor_in_order(tmp_path):
    path = tmp_path / "run.safetensors"
    out = stepper("run", "--plain", "--decode", "2", "--start-pos", "4094", "--dump", str(path))
    assert out.returncode == 0, out.stderr
    tensors = load_file(str(path))
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    order = json.loads(header["__metadata__"]["order"])
    assert set(order) == set(tensors) and order[0] == "prefill.embed" and order[-1] == "decode1.logits"
    assert catalogued_naive_names() <= {key_of(n) for n in order if n.startswith("prefill.")}
    absorbed = catalogued_names("absorb")
    for phase in ("decode0", "decode1"):  # by default decode steps attend over the latent cache
        assert absorbed <= {key_of(n) for n in order if n.startswith(phase + ".")}
    assert tensors["prefill.layers.1.mlp.gate.topk_idx"].dtype == np.int64
    # the decode step's first token is the greedy choice of the prefill
    generated = json.loads(header["__metadata__"]["generated"])
    assert generated[0] == int(np.argmax(tensors["prefill.logits"][0, -1]))

    again = stepper("run", "--plain", "--dump", str(path))
    assert again.returncode == 2 and "file exists; pass --force" in again.stderr
    assert load_file(str(path)).keys() == tensors.keys()  # untouched


def test_footer_lists_a_short_prompt_whole_and_cuts_a_long_one():
    short = stepper("run", "--plain", "--ids", "5,6,7", "--only", "logits").stdout
    assert "prompt [5, 6, 7] at positions 0.." in short
    ids = list(range(100, 140))
    long = stepper("run", "--plain", "--ids", ",".join(map(str, ids)), "--only", "logits").stdout
    footer = long.strip().splitlines()[-1]
    assert "prompt [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, … 136, 137, 138, 139] (40 tokens)" \
        in footer
    assert "112" not in footer and "135" not in footer


def test_only_and_layer_select_tensors():
    out = stepper("run", "--json", "--layer", "2", "--only", "*k_pe*")
    names = [json.loads(line)["name"] for line in out.stdout.splitlines()]
    assert names == ["layers.2.self_attn.k_pe", "layers.2.self_attn.k_pe_rope"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "gpt-9"], "unknown model 'gpt-9'"),
        (["--layer", "3"], "layer 3 out of range: model tiny has layers 0..2"),
        (["--layers", "1:9"], "layers 1:9 out of range"),
        (["--ids", "1,2,1000"], "token id 1000 out of range: model tiny has vocab_size 1000"),
        (["--ids", "1,x"], "--ids expects comma-separated integers"),
        (["--ids", "1", "--prompt-len", "3"], "give --ids or --prompt-len, not both"),
        (["--start-pos", "-1"], "--start-pos must be >= 0, got -1"),
        (["--start-pos", "131070"], "exceed max_position_embeddings"),
        (["--only", "nothing*"], "--only nothing*: matches no tensor of this run"),
        (["--dump", "out.npz"], "must end in .safetensors"),
        (["--layer", "abc"], "--layer must be an integer, got 'abc'"),
        (["--bogus"], "No such option: --bogus"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, message):
    out = stepper("run", *args)
    assert out.returncode == 2
    assert message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_a_process_exits_2_with_one_line():
    """The cases above run in the test process; here two of them as a real `python -m stepper`."""
    for args, message in ((["--model", "gpt-9"], "unknown model 'gpt-9'"), (["--bogus"], "No such option: --bogus")):
        out = in_a_process("run", *args)
        assert out.returncode == 2 and message in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_the_command_in_the_test_process_prints_what_the_process_prints():
    for args in (["run", "--plain", "--ids", "5,6,7", "--only", "*k_pe*"], ["run", "--layer", "7"], ["explain"]):
        here, there = stepper(*args), in_a_process(*args)
        assert (here.returncode, here.stdout, here.stderr) == (there.returncode, there.stdout, there.stderr), args


def test_two_runs_print_the_same():
    """What the machine has left free changes from run to run; a run that fits well does not name it."""
    first, second = in_a_process("run", "--plain", "--decode", "1"), in_a_process("run", "--plain", "--decode", "1")
    assert first.returncode == 0 and (first.stdout, first.stderr) == (second.stdout, second.stderr)
    assert ("--attn auto: naive prefill, absorbed decode (the run needs about 8 MiB, under half the memory "
            "available)") in first.stdout
    assert " available" not in first.stdout.replace("under half the memory available", "")


def test_a_use_file_that_cannot_load_is_one_line_and_no_header(tmp_path):
    for command in ("run", "step"):
        out = stepper(command, "--plain", "--use", "nonexist.py", cwd=tmp_path)
        assert (out.returncode, out.stdout, out.stderr) == (2, "",
                                                            "stepper: error: nonexist.py: no such file\n"), command


def test_every_attn_option_shows_the_paths_it_takes():
    from stepper.cli.main import app

    def commands(group, path=()):
        for name, sub in getattr(group, "commands", {}).items():
            yield from commands(sub, (*path, name)) if hasattr(sub, "commands") else [((*path, name), sub)]

    metavars = {path: p.metavar for path,
                c in commands(typer.main.get_command(app)) for p in c.params if "--attn" in p.opts}
    assert metavars == {("run",): "naive|absorb|auto", ("step",): "naive|absorb|auto", ("tree",): "naive|absorb",
                        ("fixtures", "export"): "naive|absorb|auto"}
    assert "--attn naive|absorb " in stepper("tree", "--help", env={"COLUMNS": "200"}).stdout


@pytest.mark.parametrize("command", [["run"], ["step"], ["explain"], ["tree"], ["fixtures", "export"]])
def test_model_help_lists_every_preset_the_commands_take(command):
    from stepper.presets import PRESETS, V4_PRESETS

    helped = stepper(*command, "--help", env={"COLUMNS": "80"})
    assert helped.returncode == 0, helped.stderr
    joined = " ".join(helped.stdout.split())
    listed = re.search(r"Preset \(([^)]*)\)", joined).group(1).split(", ")
    assert listed == [*PRESETS, *V4_PRESETS] and "tiny-v4" in listed


@pytest.mark.parametrize("command", [["run"], ["step"], ["explain"], ["tree"], ["fixtures", "export"], ["fixtures",
                                     "verify"], ["lesson", "watch"], ["lesson", "start"], ["diff"], ["inspect"]])
def test_help_breaks_no_name_after_a_hyphen(command):
    """click broke lines after any hyphen: `tiny-kimi-` / `linear`, `--allow-` / `missing`."""
    helped = stepper(*command, "--help", env={"COLUMNS": "80"})
    assert helped.returncode == 0 and max(map(len, helped.stdout.splitlines())) <= 80
    assert not re.search(r"\w-\n", helped.stdout), helped.stdout


@pytest.mark.parametrize("group", [[], ["fixtures"], ["lesson"], ["cache"]])
def test_each_command_s_line_in_the_help_is_whole_at_80_columns(group):
    """click cuts a command's summary to the width left and ends it with "...": 'Run the model on a
    prompt and print every named tensor in...'. Each line of the commands' list is a whole sentence."""
    helped = stepper(*group, "--help", env={"COLUMNS": "80"})
    rows = helped.stdout.split("Commands:\n")[1].splitlines()
    assert helped.returncode == 0 and len(rows) >= 2
    assert all(len(row) <= 80 and row.endswith((".", ")")) and not row.endswith("...") for row in rows), rows


def test_help_imports_no_number_formats_and_no_reference_libraries():
    """`stepper --help` (and a command's) imports what it shows: not ml_dtypes (most of a second),
    torch or transformers, which the commands import where they use them."""
    code = ("import contextlib, io, runpy, sys\n"
            "sys.argv = ['stepper', *sys.argv[1:]]\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            "    runpy.run_module('stepper', run_name='__main__')\n"
            "print(' '.join(sorted({m.partition('.')[0] for m in sys.modules})))")
    for args in (["--help"], ["run", "--help"], ["inspect", "--help"]):
        loaded = set(subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True,
                                    timeout=120).stdout.split())
        assert "stepper" in loaded and "typer" in loaded, args
        assert not loaded & {"ml_dtypes", "torch", "transformers"}, args


def test_malformed_config_json_exits_2(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "kimi_k2", "hidden_size": 64')
    out = stepper("run", "--model", str(tmp_path))
    assert out.returncode == 2 and "config.json: not valid JSON" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name, what", [("model-00001-of-00002.safetensors", "a .safetensors file"),
                                        ("model.safetensors.index.json", "a checkpoint's index")])
def test_a_checkpoints_shard_or_index_given_as_the_model_names_the_directory(tmp_path, name, what):
    (tmp_path / name).write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    for command in ("run", "tree"):
        out = stepper(command, "--model", tmp_path / name)
        assert out.returncode == 2 and out.stderr == (
            f"stepper: error: {tmp_path / name}: {what}, not a config.json; give the checkpoint's directory "
            "(config.json, its index and shards)\n")


def test_config_json_model_runs_with_synthetic_weights(tmp_path):
    from stepper.presets import preset

    raw = preset("tiny").to_hf()
    raw["num_hidden_layers"] = 2
    (tmp_path / "config.json").write_text(json.dumps(raw))
    out = stepper("run", "--json", "--model", str(tmp_path / "config.json"), "--prompt-len", "2")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1])["name"] == "logits"


def test_a_folder_named_as_a_preset_is_named_when_the_preset_runs_instead(tmp_path):
    """`--local-dir kimi-k2` then `--model kimi-k2`: the preset runs, and a note says so."""
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(preset("tiny").to_hf()))
    note = "stepper: note: 'tiny' is the preset (synthetic weights), not the folder of that name here: write ./tiny " \
           "for that\n"
    for args in (("run", "--layer", "1", "--prompt-len", "2"), ("tree",)):
        said = stepper(*args, "--model", "tiny", cwd=tmp_path)
        assert said.returncode == 0 and said.stderr == note, said.stderr
    for quiet in (("--layer", "1"), ("--model", "./tiny", "--layer", "1")):  # the default, and the folder
        said = stepper("run", *quiet, "--prompt-len", "2", cwd=tmp_path)
        assert said.returncode == 0 and said.stderr == "", said.stderr


def test_fp8_reads_a_preset_as_run_does_where_a_folder_has_its_name(tmp_path):
    """`stepper fp8 --weight W --model kimi-k2` read a folder ./kimi-k2 where run reads the preset:
    it now shows the preset's synthetic weight with run's note; ./kimi-k2 reads the folder."""
    assert stepper("synth", "--model", "tiny-v4", "--out", tmp_path / "kimi-k2").returncode == 0
    weight = "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"
    preset = stepper("fp8", "--weight", weight, "--model", "kimi-k2", "--plain", cwd=tmp_path)
    assert preset.returncode == 0 and preset.stderr.startswith("stepper: note: 'kimi-k2' is the preset"), preset.stderr
    assert "synthetic weights of kimi-k2, seed 0" in preset.stdout.splitlines()[0]
    folder = stepper("fp8", "--weight", "layers.1.ffn.experts.0.w1.weight", "--model", "./kimi-k2", "--plain",
                     cwd=tmp_path)
    assert folder.returncode == 0 and folder.stdout.splitlines()[0].endswith("checkpoint ./kimi-k2"), folder.stderr


def test_explain_accepts_names_globs_and_aliases():
    out = stepper("explain", "kv_cmpr", "--plain")  # llama.cpp's name
    assert out.returncode == 0 and "self_attn.compressed_kv\n" in out.stdout
    assert "kv_lora (kv latent = 128)" in out.stdout and "This latent is what" in out.stdout
    assert "self_attn.compressed_kv" in stepper("explain", "prefill.layers.2.self_attn.compressed_kv").stdout
    assert stepper("explain", "*topk*").stdout.count("mlp.gate.topk_") >= 2
    bad = stepper("explain", "nothing_like_this")
    assert bad.returncode == 2 and "no tensor named 'nothing_like_this'" in bad.stderr


def test_tree_lists_every_tensor_of_a_layer_with_its_shape():
    out = stepper("tree", "--model", "kimi-k2", "--layer", "1", "--plain")
    assert out.returncode == 0
    assert "self_attn.q  [B, 64 heads, T, 192 q/k head dims]" in out.stdout
    assert "mlp.gate.topk_idx  [N, 8 chosen experts]" in out.stdout and "mlp.gate_proj" not in out.stdout
    absorbed = stepper("tree", "--layer", "0", "--attn", "absorb", "--plain").stdout
    assert "self_attn.q_nope_absorbed" in absorbed and "self_attn.key_states" not in absorbed


@pytest.mark.parametrize(("model", "why"), [
    ("tiny-axk2", "has a gated input norm, and a synthetic cache is drawn from the latents of an RMSNorm'd one"),
    ("tiny-longcat",
     "has two attention sublayers, each with a cache of its own, and a synthetic cache is drawn for one"),
])
def test_a_layer_whose_cache_cannot_be_seeded_says_why(model, why):
    """--cache-len draws a synthetic cache for one MLA attention of an RMSNorm'd input; a layer that is
    not one says so, instead of naming a tensor its checkpoint never had."""
    out = stepper("run", "--model", model, "--layer", "1", "--cache-len", "50", "--plain")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == f"stepper: error: --cache-len 50: layer 1 of {model} {why}; run the layer on a prompt " \
                         "instead (--prompt-len)\n"


@pytest.mark.parametrize(("query", "model", "first"), [
    ("model.layers.1.self_attn.q_a_proj.weight", "tiny", "self_attn.q_a"),
    ("model.layers.1.self_attn.q_a_proj.weight_scale_inv", "tiny", "self_attn.q_a"),
    ("model.layers.1.mlp.gate.weight", "tiny", "mlp.gate.logits"),
    ("model.layers.1.mlp.experts.5.up_proj.weight", "tiny", "mlp.routed_output"),
    ("layers.1.attn.wq_a.weight", "tiny-v4", "attn.q_a"),  # DeepSeek-V4's own name
    ("layers.1.attn.compressor.wkv.weight", "tiny-v4", "attn.compressor.kv"),  # not the attention's own kv_proj
    ("layers.1.ffn.experts.3.w1.weight", "tiny-v4", "ffn.routed_output"),  # not the compressor's gate_proj
    ("model.layers.1.self_attn.A_log", "tiny-kimi-linear", "self_attn.forget_gate"),
])
def test_explain_a_parameter_gives_the_tensors_computed_from_it(query, model, first):
    out = stepper("explain", query, "--model", model, "--plain")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == first


@pytest.mark.parametrize(("query", "model", "said"), [
    ("model.layers.1.self_attn.foo.weight", "tiny", ("layer 1 of tiny has no parameter "
     "'model.layers.1.self_attn.foo.weight'; did you mean model.layers.1.self_attn.o_proj.weight")),
    ("model.layers.1.self_attn.wq_a.weight", "tiny-v4", ("layer 1 of tiny-v4 has no parameter "
     "'model.layers.1.self_attn.wq_a.weight'; did you mean model.layers.1.self_attn.q_a_proj.weight")),
    ("model.layers.1.self_attn.q_a_proj.weight_scale_inv", "tiny-kimi-linear", ("layer 1 of tiny-kimi-linear has "
     "no parameter 'model.layers.1.self_attn.q_a_proj.weight_scale_inv'")),
    ("model.layers.9.self_attn.q_a_proj.weight", "tiny", ("model.layers.9.self_attn.q_a_proj.weight: layer 9 out of "
     "range: model tiny has layers 0..2")),
    ("prefill.layers.9.self_attn.k_pe", "tiny", ("prefill.layers.9.self_attn.k_pe: layer 9 out of range: model tiny "
     "has layers 0..2")),  # as `run --layer 9` says; it answered with k_pe's entry
])
def test_explain_refuses_a_parameter_the_layer_does_not_have(query, model, said):
    """A made-up parameter is not answered by the module around it."""
    out = stepper("explain", query, "--model", model, "--plain")
    assert out.returncode == 2 and out.stdout == "" and out.stderr.startswith(f"stepper: error: {said}")


def test_a_small_tensor_shows_every_value_and_an_empty_one_says_it_has_none():
    out = stepper("run", "--ids", "1,2,3", "--decode", "1", "--plain", "--only", "decode0.layers.1.mlp.gate.topk_idx")
    corners = [line.split()[1:] for line in out.stdout.splitlines() if line.strip().startswith("corners")]
    assert len(corners) == 1 and len(corners[0]) == 4 and "…" not in corners[0]  # a token's four experts, once each
    out = stepper("run", "--model", "tiny-v4", "--plain", "--only", "layers.2.attn.chosen")  # HCA: no entry closed yet
    rows = out.stdout.splitlines()
    at = next(i for i, line in enumerate(rows) if line.startswith("layers.2.attn.chosen"))
    assert "Kq=0 entries" in rows[at] and rows[at + 1] == "    no values: a dimension of size 0"


@pytest.mark.parametrize("model", ["tiny-minicpm3", "tiny-youtu"])
def test_routing_of_a_model_without_a_router_says_so(model):
    out = stepper("run", "--model", model, "--show", "routing")
    assert out.returncode == 2 and out.stderr == (f"stepper: error: --show routing: model {model} has no router: "
                                                  "every layer's MLP is dense\n")


def test_a_run_refusing_many_weights_lists_the_first_ten_and_says_what_so_many_mean(tmp_path):
    folder = tmp_path / "ck"
    assert stepper("synth", "--model", "tiny", "--out", folder).returncode == 0
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "n_routed_experts": 64}))  # the weights hold 32
    out = stepper("run", "--model", folder, "--plain")
    lines = out.stderr.splitlines()
    assert out.returncode == 2 and lines[0].endswith("problem(s) with the weights of this run:") and len(lines) == 12
    assert lines[-1].startswith("  ... and ") and lines[-1].endswith(
        "more (stepper inspect lists every one; this many usually means config.json does not describe these weights)")


def test_options_naming_a_file_where_a_folder_belongs_are_one_line(tmp_path):
    mine = tmp_path / "notes.txt"
    mine.write_text("precious")
    out = stepper("--cache-dir", mine, "cache", "ls")
    assert out.returncode == 2 and out.stderr == f"stepper: error: --cache-dir {mine}: is a file, not a folder\n"
    out = stepper("fixtures", "export", tmp_path / "fx", "--prompt-len", "4", "--weights-dir", mine)
    assert out.returncode == 2 and out.stderr.endswith(f"--weights-dir {mine}: is a file, not a folder (the shared "
                                                       "weights' folder)\n")
    assert mine.read_text() == "precious" and not (tmp_path / "fx").exists()
    folder = tmp_path / "photos"  # a folder of the user's, not a run's weights: refused before anything is written
    folder.mkdir()
    out = stepper("fixtures", "export", tmp_path / "fx", "--prompt-len", "4", "--weights-dir", folder)
    assert out.returncode == 2 and out.stdout == "" and out.stderr == (
        f"stepper: error: --weights-dir {folder}: is not a folder of a run's weights (it has no config.json); "
        "give a new folder's name or one an export wrote\n")
    assert not (tmp_path / "fx").exists()


@pytest.mark.parametrize(("model", "quant", "said"), [
    ("tiny-kimi-linear", "fp8", ("--quant fp8: model tiny-kimi-linear (kimi_linear) is written in BF16 only, as it is "
                                "published: use --quant bf16")),
    ("tiny-minicpm3", "int4", ("--quant int4: model tiny-minicpm3 has no routed experts, the weights INT4 stores "
                              "(Kimi-K2-Thinking's layout): use --quant bf16 or fp8")),
])
def test_synth_refuses_a_format_the_model_has_no_weights_for(model, quant, said, tmp_path):
    out = stepper("synth", "--model", model, "--quant", quant, "--out", tmp_path / "ck")
    assert out.returncode == 2 and out.stderr == f"stepper: error: {said}\n" and not (tmp_path / "ck").exists()


def test_inspect_stats_lists_weights_holding_nan_as_a_problem(tmp_path):
    """A weight whose FP8 codes include NaN (0x7F) makes every product with it NaN: with --stats,
    whose reading finds it, inspect says so (exit 1), as it does for a NaN scale."""
    folder = tmp_path / "ck"
    assert stepper("synth", "--model", "tiny-v3", "--out", folder).returncode == 0
    name = "model.layers.1.self_attn.q_b_proj.weight"
    shard = folder / json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"][name]
    raw = bytearray(shard.read_bytes())
    size = int.from_bytes(raw[:8], "little")
    start = 8 + size + json.loads(raw[8 : 8 + size])[name]["data_offsets"][0]
    raw[start : start + 64] = b"\x7f" * 64  # the first 64 codes: e4m3's NaN
    shard.write_bytes(bytes(raw))
    assert stepper("inspect", folder).returncode == 0  # from the headers alone: values unread
    out = stepper("inspect", folder, "--stats", "--plain")
    assert out.returncode == 1
    assert f"  ! '{name}' holds 64 NaN and 0 infinite values: every product with them is NaN or infinite" in out.stdout


def test_fixtures_verify_finds_a_repository_fixture_by_name_from_any_folder(tmp_path):
    candidate = Path(__file__).resolve().parents[2] / "fixtures" / "tiny-prefill-decode" / "tensors.safetensors"
    out = stepper("fixtures", "verify", "tiny-prefill-decode", candidate, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.splitlines()[-1].startswith("match: 312 fixture tensors, 312 match")


def test_verify_by_a_naming_without_names_of_the_fixtures_family_says_so(tmp_path):
    from safetensors.numpy import save_file

    candidate = tmp_path / "mine.safetensors"
    save_file({"blk.0.attn_q_a.weight": np.zeros(3, np.float32)}, candidate)
    out = stepper("fixtures", "verify", "tiny-v4-windows", candidate, "--names", "llama.cpp")
    assert out.returncode == 2 and out.stderr == (
        "stepper: error: --names llama.cpp: that naming has no names of deepseek_v4 tensors (stepper fixtures names "
        f"lists each naming's); read {candidate} by another --names\n")


@pytest.mark.parametrize("half, suffix", [("bfloat16", ".safetensors"), ("float16", ".npz")])
def test_verify_of_a_half_precision_port_names_the_tolerances_to_start_with(tmp_path, half, suffix):
    """A port computing in BF16 or FP16 fails from its first tensor at the float32 tolerances: the
    line after the first divergence says so and names the looser ones, unless --rtol or --atol is given."""
    import ml_dtypes
    from safetensors.numpy import save_file

    fixture = Path(__file__).resolve().parents[2] / "fixtures" / "tiny-prefill-decode"
    tensors = load_file(fixture / "tensors.safetensors")
    kind = ml_dtypes.bfloat16 if half == "bfloat16" else np.float16
    halved = {name: (a.astype(kind) if a.dtype == np.float32 else a) for name, a in tensors.items()}
    candidate = tmp_path / f"port{suffix}"
    save_file(halved, candidate) if suffix == ".safetensors" else np.savez(candidate, **halved)
    out = stepper("fixtures", "verify", fixture, candidate, "--plain")
    first = re.search(r"^first divergence: (\S+):", out.stdout, re.MULTILINE)[1]
    assert out.returncode == 1 and out.stdout.splitlines()[-1] == (
        f"{first} is {half} in the candidate, and the tolerances are float32's: a port computing in BF16 or FP16 "
        "needs looser ones, --rtol 2e-2 --atol 1e-2 to start with (fixtures/README.md, Tolerances)")
    looser = stepper("fixtures", "verify", fixture, candidate, "--plain", "--rtol", "2e-2", "--atol", "1e-2")
    assert looser.returncode == 0 and "tolerances are float32's" not in looser.stdout
    halved[first] = tensors[first] + 1  # float32, and wrong: no hint
    save_file(halved, candidate) if suffix == ".safetensors" else np.savez(candidate, **halved)
    assert "tolerances are float32's" not in stepper("fixtures", "verify", fixture, candidate, "--plain").stdout
