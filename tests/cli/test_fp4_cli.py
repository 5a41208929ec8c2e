"""The FP4 formats and DeepSeek-V4's published layout through the command line: `stepper fp8 --fp4`
(the 16 e2m1 codes, one packed byte), `stepper fp8 --weight` on a V4 checkpoint (an FP4 group bit
by bit, an FP8 block with its E8M0 scale), `stepper inspect` listing a V4 checkpoint and every
problem of its grids, and bad input as one line naming the file, the tensor and what was expected."""

import json
import re

import ml_dtypes
import numpy as np
import pytest
from helpers.cli import one_line, stepper
from helpers.terminal import on_terminal
from helpers.v4_published import CONFIG, stored_tensors, write_shards, write_tiny_v4

EXPERT = "layers.1.ffn.experts.0.w1.weight"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("v4cli") / "tiny-v4"
    return folder, write_tiny_v4(folder)


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    """A V4 checkpoint with one of each problem the grids can have."""
    stored, _ = stored_tensors(CONFIG, 0)
    nan = stored["layers.1.ffn.experts.0.w2.scale"].copy()
    nan.view(np.uint8)[3, 0] = 0xFF
    folder = tmp_path_factory.mktemp("v4bad") / "bad-v4"
    write_tiny_v4(folder, changed={
        "layers.1.ffn.experts.0.w1.scale": stored["layers.1.ffn.experts.0.w1.scale"][:, :1].copy(),  # grid [32, 1]
        "layers.2.ffn.experts.1.w2.weight": np.zeros((64, 8), np.int8),  # FP4 bytes of [64, 16] expected
        "layers.0.attn.wq_b.scale": np.ones((1, 1), np.float32),  # F32, not F8_E8M0
        "layers.1.ffn.experts.0.w2.scale": nan,
    })
    return folder


def test_the_16_codes():
    out = stepper("fp8", "--fp4")
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("  0x")]
    assert len(lines) == 16 and lines[7].split()[:6] == ["0x7", "0", "11", "1", "normal", "+6.0"]
    records = json.loads(stepper("fp8", "--fp4", "--json").stdout)
    expected = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    assert [r["value"] for r in records] == expected.tolist()
    assert [r["bits"] for r in records][9] == "1 00 1"


def test_one_byte_low_nibble_first():
    out = stepper("fp8", "--fp4", "0x2F")
    assert out.returncode == 0, out.stderr
    low, high = out.stdout.splitlines()[1:3]
    assert "input 2k:" in low and low.rstrip().endswith("= -6.0")
    assert "input 2k+1:" in high and high.rstrip().endswith("= 1.0")
    record = json.loads(stepper("fp8", "--fp4", "--json", "--", "-105").stdout)  # 0x97 as I8 stores it
    assert (record["hex"], record["low"]["value"], record["high"]["value"]) == ("0x97", 6.0, -0.5)
    assert "not one byte" in one_line(stepper("fp8", "--fp4", "300"))
    assert one_line(stepper("fp8", "--fp4", "--int4")) == "stepper: error: --int4 and --fp4 are two formats: give one"


def test_an_fp4_group_bit_by_bit(tiny):
    folder, values = tiny
    out = stepper("fp8", "--weight", EXPERT, "--model", folder, "--block", "3,1", "--json")
    assert out.returncode == 0, out.stderr
    group = json.loads(out.stdout)
    assert (group["dtype"], group["shape"], group["inputs"]) == ("FP4", [32, 64], [32, 64])
    assert group["values"] == values[EXPERT][3, 32:64].tolist()  # ml_dtypes' decoding of the same bytes
    assert group["scale"] == 2.0 ** (group["scale_byte"] - 127)
    first = group["bytes"][0]
    assert [first["low"]["value"] * group["scale"], first["high"]["value"] * group["scale"]] == group["values"][:2]
    shown = stepper("fp8", "--weight", EXPERT, "--model", folder, "--block", "3,1")
    byte = group["scale_byte"]
    assert shown.returncode == 0 and f"scale byte 0x{byte:02X} = 2^({byte} - 127)" in shown.stdout
    nibble_lines = [line.split() for line in shown.stdout.splitlines() if line.startswith("    in ")]
    assert len(nibble_lines) == 32 and [line[1] for line in nibble_lines] == [str(i) for i in range(32, 64)]
    low = nibble_lines[0]  # in 32  low  CCCC = s ee m  value  -> weight
    assert low[2] == "low" and int(low[3], 2) == first["low"]["code"] and float(low[-1]) == group["values"][0]
    assert one_line(stepper("fp8", "--weight", EXPERT, "--model", folder, "--block", "3,2")).endswith(
        "has rows 0..31 and groups 0..1 of 32 inputs")


def test_an_fp8_block_with_its_e8m0_scale(tiny):
    folder, values = tiny
    out = stepper("fp8", "--weight", "model.layers.2.attn.wo_b.weight", "--model", folder, "--json")
    assert out.returncode == 0, out.stderr
    block = json.loads(out.stdout)
    corner = np.array(block["corner_values"], np.float32)
    np.testing.assert_array_equal(corner, values["layers.2.attn.wo_b.weight"][: corner.shape[0], : corner.shape[1]])
    assert block["scale_grid"] == [1, 1] and block["scale_inv"] == 2.0 ** round(np.log2(block["scale_inv"]))
    assert block["scale_format"] == "F8_E8M0" and 224 <= block["absmax"] / block["scale_inv"] <= 448
    shown = stepper("fp8", "--weight", "layers.2.attn.wo_b.weight", "--model", folder).stdout
    assert f"scale (F8_E8M0)[0, 0] = {np.float32(block['scale_inv'])} = 2^{round(np.log2(block['scale_inv']))}" in shown
    assert "an E8M0 scale is the smallest power of two that brings the block's amax within 448" in shown


def test_inspect_lists_a_sound_v4_checkpoint(tiny):
    folder, _ = tiny
    out = stepper("inspect", folder)
    assert out.returncode == 0, out.stderr
    assert "deepseek_v4 (published layout), 3 layers, 2 routed experts · 3 shards" in out.stdout
    headings = [line.split(" ─")[0] for line in out.stdout.splitlines() if " ───" in line]
    assert headings == ["model", "layer 0 (sliding window; hash-routed)",
                        "layer 1 (CSA: 4 tokens an entry, indexer; score-routed)",
                        "layer 2 (HCA: 128 tokens an entry; score-routed)",
                        "not used (the multi-token-prediction block, mtp.*)"]
    rows = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines() if line.startswith("  ")}
    assert rows["ffn.experts.{0..1}.w1.weight"][:7] == ["FP4", "[32,", "64]", "x2", "2.1", "KiB", "groups"]
    assert rows["attn.wq_a.weight"][:6] == ["F8_E4M3", "[32,", "64]", "2.0", "KiB", "scales"]
    assert "not used (the multi-token-prediction block, mtp.*)" in out.stdout and "mtp.0.norm.weight" in rows


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """`stepper synth --model tiny-v4`: one shard a layer, and a multi-token-prediction block with
    its own routed experts."""
    folder = tmp_path_factory.mktemp("v4synth") / "ck"
    assert stepper("synth", "--model", "tiny-v4", "--out", folder).returncode == 0
    return folder


def test_inspect_folds_the_multi_token_prediction_blocks_experts_as_a_layers(synthetic):
    out = stepper("inspect", synthetic)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines() if line.startswith("  ")}
    assert rows["mtp.0.ffn.experts.{0..15}.w1.weight"][:7] == ["FP4", "[32,", "64]", "x16", "17.0", "KiB", "groups"]
    assert rows["ffn.experts.{0..15}.w2.weight"][:4] == ["FP4", "[64,", "32]", "x16"]
    # through a pipe a heading too long for an 80-column rule is printed whole
    assert "layer 1 (CSA: 4 tokens an entry, indexer; hash-routed) · model-00003-of-00007.safetensors" in (
        out.stdout.splitlines())
    assert not [name for name in rows if re.search(r"experts\.\d", name)]
    assert "mtp.0.ffn.shared_experts.w1.weight" in rows


def test_inspect_at_80_columns_keeps_each_tensor_on_one_line_and_its_scales_under_it(synthetic):
    """The bytes come before the scales, so on a terminal 80 columns wide a tensor without scales is
    one line, and a weight's scales (the longest column) go on under it, never its size."""
    screen = on_terminal("inspect", synthetic, columns=80)
    assert screen.code == 0, screen.text
    lines = screen.lines
    sink = next(line for line in lines if line.startswith("  attn.attn_sink "))
    assert sink.split()[1:] == ["F32", "[4]", "16", "B"]
    i = next(i for i, line in enumerate(lines) if line.startswith("  attn.wq_a.weight "))
    assert lines[i].split()[1:] == ["F8_E4M3", "[32,", "64]", "2.0", "KiB"]
    assert lines[i + 1].split() == ["scales", "[1,", "1]", "F8_E8M0"]
    assert all(len(line) <= 80 for line in lines)


def test_inspect_lists_every_grid_problem(bad):
    out = stepper("inspect", bad)
    assert out.returncode == 1, out.stderr
    listed = out.stdout.split("4 problems in ")[1].splitlines()[1:]
    assert [line.split(": ", 1)[1] for line in listed] == [
        ("'layers.0.attn.wq_b.scale' has dtype F32, expected F8_E8M0 (2^(byte - 127)) for the F8_E4M3 weight "
        "'layers.0.attn.wq_b.weight'"),
        ("'layers.1.ffn.experts.0.w1.scale' has shape [32, 1], expected [32, 2] for the FP4 (I8) weight "
        "'layers.1.ffn.experts.0.w1.weight' [32, 64] (one scale per row and 32 inputs)"),
        ("'layers.2.ffn.experts.1.w2.weight' holds FP4 bytes of shape [64, 8], expected [64, 16] (two codes a byte) "
        "for the [64, 32] weight config.json gives"),
        ("'layers.1.ffn.experts.0.w2.scale' holds 1 NaN scale (byte 0xFF), first at [3, 0]: every weight of its block "
        "would be NaN"),
    ]
    assert all(line.startswith("  ! model-0000") and ".safetensors: '" in line for line in listed)
    problems = json.loads(stepper("inspect", bad, "--json").stdout.splitlines()[-1])["problems"]
    assert len(problems) == 4


@pytest.mark.parametrize("weight, expected", [
    ("layers.1.ffn.experts.0.w1.weight", ("'layers.1.ffn.experts.0.w1.scale' has shape [32, 1], expected [32, 2] for "
                                         "the FP4 (I8) weight 'layers.1.ffn.experts.0.w1.weight' [32, 64]")),
    ("layers.2.ffn.experts.1.w2.weight", ("'layers.2.ffn.experts.1.w2.weight' holds FP4 bytes of shape [64, 8], "
                                         "expected [64, 16] (two codes a byte)")),
    ("layers.0.attn.wq_b.weight", "'layers.0.attn.wq_b.scale' has dtype F32, expected F8_E8M0 (2^(byte - 127))"),
    ("layers.1.ffn.experts.0.w2.weight", "'layers.1.ffn.experts.0.w2.scale' holds 1 scale(s) that are not finite"),
])
def test_bad_input_is_one_line(bad, weight, expected):
    line = one_line(stepper("fp8", "--weight", weight, "--model", bad))
    assert line.startswith(("stepper: error: model-0000", f"stepper: error: {bad}: model-0000")) and expected in line


def test_inspect_one_v4_shard_alone(tmp_path):
    stored, _ = stored_tensors(CONFIG, 0)
    stored["layers.1.ffn.experts.0.w1.scale"] = stored["layers.1.ffn.experts.0.w1.scale"][:, :1].copy()
    write_shards(tmp_path / "v4", stored, 1, index=False)  # every weight beside its scale
    out = stepper("inspect", tmp_path / "v4" / "model-00001-of-00001.safetensors")
    assert out.returncode == 1, out.stderr
    assert out.stdout.split("1 problem in 1 file:")[1].strip() == (
        "! model-00001-of-00001.safetensors: 'layers.1.ffn.experts.0.w1.scale' has shape [32, 1], expected [32, 2] "
        "for the FP4 (I8) weight 'layers.1.ffn.experts.0.w1.weight' [32, 64] (one scale per row and 32 inputs)")
    rows = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines() if line.startswith("  ")}
    assert rows["ffn.experts.{0..1}.w2.weight"][:7] == ["FP4", "[64,", "32]", "x2", "2.1", "KiB", "groups"]


def test_inspect_lists_a_config_a_run_refuses_among_the_problems(tmp_path):
    """inspect lists the tensors from config.json's fields as they are, and checks the fields as a run
    reads them: a field a run refuses is a problem (exit 1) in the run's words."""
    folder = tmp_path / "v4"
    write_tiny_v4(folder, cfg={k: v for k, v in CONFIG.items() if k != "sliding_window"})
    out = stepper("inspect", folder, "--plain")
    assert out.returncode == 1, out.stderr
    assert f"  ! {folder / 'config.json'}: field 'sliding_window' is missing (a run refuses it)" in out.stdout
    run = stepper("run", "--model", folder, "--plain")
    assert run.returncode == 2 and f"{folder / 'config.json'}: field 'sliding_window' is missing" in run.stderr
    shapes = tmp_path / "shapes"  # a field the tensors' shapes need: the config's problem alone, with its path
    write_tiny_v4(shapes)
    (shapes / "config.json").write_text(json.dumps({k: v for k, v in CONFIG.items() if k != "head_dim"}))
    out = stepper("inspect", shapes, "--plain")
    assert out.returncode == 1 and out.stdout.split("1 problem in 1 file:")[1].strip() == (
        f"! {shapes / 'config.json'}: field 'head_dim' is missing (a run refuses it)"), out.stderr  # was config.json:


def test_a_fixture_of_a_v4_checkpoint_folder_names_its_files_and_the_bytes_it_read(synthetic, tmp_path):
    """`fixtures export --model DIR` of a V4 checkpoint: the same tensors as the preset the folder
    was written from, and the checkpoint named (not copied) with the sha256 of each tensor read as
    its shard stores it (FP4 bytes and their E8M0 scales)."""
    from stepper.families.deepseek_v4_checkpoint import V4Checkpoint
    from stepper.fixtures.hashing import sha256_array

    out = stepper("fixtures", "export", tmp_path / "from-folder", "--model", synthetic, "--layer", "1")
    assert out.returncode == 0, out.stderr
    assert stepper("fixtures", "export", tmp_path / "from-preset", "--model", "tiny-v4", "--layer", "1").returncode == 0
    same = stepper("fixtures", "verify", tmp_path / "from-preset", tmp_path / "from-folder" / "tensors.safetensors")
    assert same.returncode == 0 and same.stdout.splitlines()[-1].startswith("match: 63 fixture tensors, 63 match")
    weights = json.loads((tmp_path / "from-folder" / "manifest.json").read_text())["weights"]
    assert weights["kind"] == "checkpoint" and not weights["copied"] and "config.json" in weights["files"]
    checkpoint = V4Checkpoint(synthetic)
    for name in ("model.layers.1.mlp.experts.0.gate_proj.weight", "model.layers.1.self_attn.q_a_proj.weight",
                 "model.layers.1.self_attn.sinks"):
        stored = checkpoint.stored(name)
        assert weights["read"][name]["sha256"] == sha256_array(stored.data)
        if stored.scale_inv is not None:
            assert weights["read"][name]["scale_inv_sha256"] == sha256_array(stored.scale_inv)
    assert weights["read"]["model.layers.1.mlp.experts.0.gate_proj.weight"]["dtype"] == "FP4"


def test_inspect_lists_a_hash_table_entry_a_run_refuses(tmp_path):
    """tid2eid holds an expert id per token: one out of range is refused by a run, and inspect,
    which checks all a run checks, lists it."""
    stored, _ = stored_tensors(CONFIG, 0)
    table = stored["layers.0.ffn.gate.tid2eid"].copy()
    table[5, 1] = CONFIG["n_routed_experts"]
    write_tiny_v4(tmp_path / "v4", changed={"layers.0.ffn.gate.tid2eid": table})
    out = stepper("inspect", tmp_path / "v4")
    assert out.returncode == 1, out.stderr
    assert (f"tensor 'layers.0.ffn.gate.tid2eid': entry [5, 1] is {CONFIG['n_routed_experts']}, expected an expert id "
            f"in 0..{CONFIG['n_routed_experts'] - 1} (1 entry out of range)") in out.stdout
