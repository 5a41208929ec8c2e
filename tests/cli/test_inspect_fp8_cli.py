"""`stepper inspect` and `stepper fp8` as a user meets them: listings, statistics, the code table,
one byte, one block of a weight, and bad input (exit 2, one line)."""

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from helpers.cli import stepper

from stepper.presets import preset
from stepper.views import inspect, inspect_stats
from stepper.views.summary import stats
from stepper.weights.checkpoint import Checkpoint
from stepper.weights.safetensors_reader import SafetensorsFile
from stepper.weights.safetensors_writer import Entry, write_safetensors
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.synth_checkpoint import synth_checkpoint

KV = "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"  # [144, 320]: scales [2, 3], partial blocks


def ok(*args: str) -> str:
    out = stepper(*args)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return synth_checkpoint(SyntheticWeights(preset("tiny"), seed=0), tmp_path_factory.mktemp("inspect") / "tiny")


def sections(text: str) -> dict[str, list[str]]:
    """Listing lines under each heading (a heading is a rule: title, then ─ to the end)."""
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.rstrip().endswith("──"):
            current = line.split(" ─")[0].strip()
            out[current] = []
        elif current is not None and line.startswith("  "):
            out[current].append(line)
    return out


def row(lines: list[str], label: str) -> list[str]:
    found = [line.split() for line in lines if line.split()[0] == label]
    assert len(found) == 1, (label, lines)
    return found[0]


def headers(ckpt: Path) -> dict[str, tuple[str, int]]:
    """name -> (dtype, nbytes), read straight from the shards."""
    infos = {}
    for shard in sorted(ckpt.glob("*.safetensors")):
        infos.update({t.name: (t.dtype, t.nbytes) for t in SafetensorsFile(shard).tensors.values()})
    return infos


# -- inspect ----------------------------------------------------------------------------------


def test_inspect_lists_each_layer_with_fp8_scale_grids_and_folded_experts(ckpt):
    text = ok("inspect", "--plain", str(ckpt))
    groups = sections(text)
    assert list(groups) == [
        "model", "layer 0 (dense) · model-00002-of-00005.safetensors",
        "layer 1 (MoE) · model-00003-of-00005.safetensors", "layer 2 (MoE) · model-00004-of-00005.safetensors",
    ]
    layer1 = groups["layer 1 (MoE) · model-00003-of-00005.safetensors"]
    # 144 x 320 one-byte codes plus 2 x 3 float32 scales = 46104 bytes
    assert row(layer1, "self_attn.kv_a_proj_with_mqa.weight") == ["self_attn.kv_a_proj_with_mqa.weight", "F8_E4M3",
                                                                  "[144,", "320]", "45.0", "KiB", "scales", "[2,", "3]"]
    # 32 experts x (96 x 320 codes + 1 x 3 scales) = 983424 bytes = 960.4 KiB, on one row
    assert row(layer1, "mlp.experts.{0..31}.gate_proj.weight") == [
        "mlp.experts.{0..31}.gate_proj.weight", "F8_E4M3", "[96,", "320]", "x32", "960.4", "KiB", "scales", "[1,", "3]"]
    assert row(layer1, "mlp.gate.weight")[1:4] == ["BF16", "[32,", "320]"]
    assert row(layer1, "mlp.gate.e_score_correction_bias")[1:3] == ["F32", "[32]"]
    assert not any("experts.5." in line or "_scale_inv" in line for lines in groups.values() for line in lines)
    assert [line.split()[0] for line in groups["model"]] == ["model.embed_tokens.weight", "model.norm.weight",
                                                             "lm_head.weight"]
    assert "mlp.gate_proj.weight" in {line.split()[0] for line in groups["layer 0 (dense) · "
                                                                         "model-00002-of-00005.safetensors"]}

    footer = text.splitlines()[-1]  # counts every tensor, its scales included, and every byte
    infos = headers(ckpt)
    total = sum(n for _, n in infos.values())
    assert footer.startswith(f"{len(infos)} tensors, {total / 2**20:.1f} MiB · dtypes: ")
    fp8_weights = sum(d == "F8_E4M3" for d, _ in infos.values())
    assert (f"F8_E4M3 {fp8_weights} (" in footer
            and f"{fp8_weights} scale tensors shown in their F8_E4M3 weight's row" in footer)
    assert f"BF16 {sum(d == 'BF16' for d, _ in infos.values())} (" in footer
    assert f"F32 {sum(d == 'F32' for d, _ in infos.values())} (" in footer
    assert footer.endswith("the weights' values not read: --stats reads them and names any NaN or infinity")


def test_inspect_experts_option_shows_every_expert(ckpt):
    groups = sections(ok("inspect", "--plain", "--experts", "--only", "*layers.2.mlp.experts.*", str(ckpt)))
    (lines,) = groups.values()
    assert len(lines) == 3 * 32
    assert row(lines, "mlp.experts.31.up_proj.weight")[1:9] == ["F8_E4M3", "[96,", "320]", "30.0", "KiB", "scales",
                                                                "[1,", "3]"]


def test_inspect_json_stats_equal_summary_stats_of_the_decoded_tensor(ckpt):
    out = ok("inspect", "--json", "--stats", "--only", "*layers.1.*", "--only", "model.norm.weight", str(ckpt))
    *lines, last = map(json.loads, out.splitlines())
    assert last == {"problems": []}  # the checkpoint is sound
    records = {r["name"]: r for r in lines}
    names = [n for n in headers(ckpt)
             if (".layers.1." in n or n == "model.norm.weight") and not n.endswith("_scale_inv")]
    assert sorted(records) == sorted(names)  # one object per tensor, experts unfolded, scales inside their weight
    source = Checkpoint(ckpt)
    for name in (KV, "model.layers.1.mlp.experts.7.down_proj.weight", "model.layers.1.mlp.gate.weight",
                 "model.norm.weight"):
        assert records[name]["stats"] == stats(source.get(name)).as_dict(), name
    kv = records[KV]
    assert kv["stats_of"] == "dequantized" and kv["group"] == "layer 1 (MoE)" and kv["layer"] == 1
    assert kv["scale_inv"] == {"name": KV + "_scale_inv", "dtype": "F32", "shape": [2, 3], "nbytes": 24,
                               "shard": "model-00003-of-00005.safetensors"}
    assert kv["shape"] == [144, 320] and kv["nbytes"] == 144 * 320 and kv["problems"] == []


def test_statistics_read_in_row_batches_agree_with_the_whole_tensor(ckpt, monkeypatch):
    # kv_a_proj: 2 batches of whole FP8 row blocks; embedding: 334
    monkeypatch.setattr(inspect_stats, "BATCH_VALUES", 1000)
    source = inspect.open_source(ckpt)
    for tensor in inspect.collect(source, [KV, "model.embed_tokens.weight"], []):
        chunked = inspect_stats.tensor_stats(source, tensor, lambda n: None)
        whole = stats(Checkpoint(ckpt).get(tensor.name))
        assert (chunked.min, chunked.max, chunked.absmax, chunked.nan, chunked.inf, chunked.finite) == (
            whole.min, whole.max, whole.absmax, whole.nan, whole.inf, whole.finite)
        assert chunked.mean == pytest.approx(whole.mean, rel=1e-9, abs=1e-15)
        assert chunked.std == pytest.approx(whole.std, rel=1e-9) and chunked.sum == pytest.approx(whole.sum, rel=1e-9)


def test_inspect_flags_scale_problems_and_names_a_scale_kept_in_another_shard(tmp_path):
    """A hand-made checkpoint: a scale in another shard, a weight without scales, scales without a weight."""
    (tmp_path / "config.json").write_text(json.dumps(preset("tiny").to_hf()))
    src = SyntheticWeights(preset("tiny"))
    kv = src.stored(KV)
    o_proj = src.stored("model.layers.1.self_attn.o_proj.weight")
    first = [Entry(KV, "F8_E4M3", (144, 320), lambda: kv.data),
             Entry("model.layers.1.self_attn.o_proj.weight", "F8_E4M3", (320, 128), lambda: o_proj.data)]
    second = [Entry(KV + "_scale_inv", "F32", (2, 3), lambda: kv.scale_inv),
              Entry("model.layers.1.self_attn.q_b_proj.weight_scale_inv", "F32", (2, 2),
                    lambda: np.ones((2, 2), np.float32))]
    write_safetensors(tmp_path / "a.safetensors", first)
    write_safetensors(tmp_path / "b.safetensors", second)
    weight_map = {e.name: "a.safetensors" for e in first} | {e.name: "b.safetensors" for e in second}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    done = stepper("inspect", "--plain", "--stats", str(tmp_path))
    assert done.returncode == 1 and done.stderr == ""  # problems found: listed, exit 1
    text = done.stdout
    (lines,) = sections(text).values()
    assert row(lines, "self_attn.kv_a_proj_with_mqa.weight")[-3:] == ["scales", "in", "b.safetensors"]
    o_missing = ("'model.layers.1.self_attn.o_proj.weight_scale_inv' is missing: "
                 "the F8_E4M3 weight 'model.layers.1.self_attn.o_proj.weight' needs its block scales")
    orphan = "'model.layers.1.self_attn.q_b_proj.weight' is missing (expected shape [192, 192])"  # in its scale's row
    assert f"    ! {o_missing}" in text.splitlines()  # in its row
    assert row(lines, "self_attn.q_b_proj.weight_scale_inv")[1:4] == ["F32", "[2,", "2]"]
    assert f"    ! {orphan}" in text.splitlines()
    assert "of the bare code values: no usable scales" in text  # o_proj's statistics are of its codes alone
    listing, summary = text.split("\n110 problems:\n")  # layer 1's other tensors are missing too
    assert listing.endswith(" · 110 problems (listed below)")
    partial = "holds only layer 1 of 0..2, no embedding, norm or lm_head: inspect with --layers 1:2, run with --layer 1"
    assert summary.splitlines()[0] == f"  ! {partial}"  # layers 0 and 2 and the globals: one line
    assert f"  ! {o_missing}" in summary.splitlines() and f"  ! {orphan}" in summary.splitlines()
    # the config's other tensors
    assert "'model.layers.1.input_layernorm.weight' is missing (expected shape [320])" in text

    one = stepper("inspect", "--plain", str(tmp_path / "a.safetensors"))  # one shard: no config, no index
    assert one.returncode == 1 and list(sections(one.stdout)) == ["layers.1"]
    kv_missing = (f"'{KV}_scale_inv' is missing: the F8_E4M3 weight '{KV}' needs its block scales")
    o_in_file = o_missing.replace("missing: the", "missing: the", 1)
    assert one.stdout.splitlines()[-4:] == [
        f"a.safetensors is one shard of {tmp_path}: inspect the directory to see scales kept in other shards",
        "2 problems in 1 file:", f"  ! {kv_missing}", f"  ! {o_in_file}"]


def test_inspect_shows_metadata_with_its_control_characters_escaped(tmp_path):
    header = json.dumps({"__metadata__": {"note": "\x1b]0;title\x07\x1b[2J"},
                         "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})
    path = tmp_path / "meta.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header.encode() + bytes(4))
    text = ok("inspect", "--plain", str(path))
    assert text.splitlines()[0] == f"file {path} · metadata note=\\x1b]0;title\\x07\\x1b[2J"
    assert not any(c < " " and c != "\n" for c in text)


# -- fp8 --------------------------------------------------------------------------------------


def e4m3(code: int) -> float:
    return float(np.array(code, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64))


def test_fp8_json_lists_the_256_codes_as_ml_dtypes_decodes_them():
    records = json.loads(ok("fp8", "--json"))
    assert [r["code"] for r in records] == list(range(256))
    for r in records:
        expected = e4m3(r["code"])
        assert r["value"] == (None if np.isnan(expected) else expected), r
        assert r["hex"] == f"0x{r['code']:02X}"
        assert r["bits"].replace(" ", "") == f"{r['code']:08b}"
        assert (r["sign"], r["exponent"], r["mantissa"]) == (r["code"] >> 7, (r["code"] >> 3) & 15, r["code"] & 7)
    assert records[0x7E]["value"] == 448.0 and records[0xFE]["value"] == -448.0
    assert [r["code"] for r in records if r["kind"] == "nan"] == [0x7F, 0xFF]
    assert [r["code"] for r in records if r["kind"] == "subnormal"] == [*range(1, 8), *range(0x81, 0x88)]


def test_fp8_table_cells_hold_each_codes_value():
    lines = {line[:4]: line.split()[2:] for line in ok("fp8",
                                                       "--plain").splitlines() if line[:2] == "0x" and line[3] == "_"}
    assert len(lines) == 16 and all(len(cells) == 16 for cells in lines.values())
    for high, cells in lines.items():
        for low, cell in enumerate(cells):
            code = int(high[2], 16) << 4 | low
            expected = e4m3(code)
            if np.isnan(expected):
                assert cell == "NaN"
            elif "/512" in cell:  # subnormals, exactly m/512
                assert float(cell.split("/")[0]) / 512 == expected
            else:
                assert float(cell) == pytest.approx(expected, rel=5e-3, abs=0), (hex(code), cell)
    assert lines["0xC_"][0xD] == "-6.5" and lines["0x7_"][0xE] == "448" and lines["0x8_"][0] == "-0"


def test_fp8_takes_one_byte_apart_from_hex_decimal_or_binary():
    text = ok("fp8", "--plain", "0xCD")
    assert ok("fp8", "--plain", "205") == text == ok("fp8", "--plain", "0b11001101")
    assert "0xCD = 205 = 0b11001101, read as e4m3fn: 1 1001 101" in text
    fields = {line.split()[0]: line.split(None, 1)[1]
              for line in text.splitlines() if line.startswith("  ") and line.split()}
    assert fields["value"] == "-6.5"
    assert fields["exponent"].startswith("1001 = 9") and fields["mantissa"].startswith("101 = 5")
    assert fields["formula"] == "(-1)^1 * 2^(9-7) * (1 + 5/8) = -6.5"


def test_fp8_weight_block_shows_its_scale_partial_size_and_values(ckpt):
    weights = SyntheticWeights(preset("tiny"))
    stored = weights.stored(KV)
    scale = stored.scale_inv[1, 2]
    text = ok("fp8", "--plain", "--weight", KV, "--model", "tiny", "--block", "1,2")
    shown = text.split("scale_inv[1, 2] = ")[1].split()[0]
    assert np.float32(shown) == scale  # printed as the shortest text that reads back as the same float32
    assert "block 1,2: rows 128..143, columns 256..319: partial, 16 x 64 of 128 x 128" in text
    assert "scales [2, 3]" in text

    block = json.loads(ok("fp8", "--json", "--weight", KV, "--model", "tiny", "--block", "1,2"))
    assert block["scale_inv"] == float(scale) and block["size"] == [16, 64] and block["partial"]
    assert block["corner_codes"] == stored.data.view(np.uint8)[128:136, 256:264].tolist()
    assert block["corner_values"] == weights.get(KV)[128:136, 256:264].tolist()
    values = weights.get(KV)[128:144, 256:320]
    assert block["absmax"] == float(np.abs(values).max()) == float(np.float32(448) * scale)  # amax / 448 scaling
    assert sum(block["codes_at_448"].values()) >= 1

    from_dir = json.loads(ok("fp8", "--json", "--weight", KV, "--model", str(ckpt), "--block", "1,2"))
    assert {k: v for k, v in from_dir.items() if k != "source"} == {k: v for k, v in block.items() if k != "source"}


@pytest.mark.parametrize(
    "args, message",
    [
        (["fp8", "0x1FF"], "CODE: '0x1FF' is 511, which is not one byte"),
        (["fp8", "abc"], "CODE: expected a byte as hex 0x00..0xFF, decimal 0..255 or binary"),
        (["fp8", "--weight", "model.layers.1.input_layernorm.weight"], "is BF16 [320], not an FP8 weight"),
        (["fp8", "--weight", "model.layers.9.mlp.up_proj.weight"],
         "no tensor named 'model.layers.9.mlp.up_proj.weight'"),
        (["fp8", "--weight", KV, "--block", "1"], "--block expects R,C"),
        (["fp8", "--block", "1,2"], "--block only goes with --weight NAME"),
        (["inspect", "no/such/dir"], "no/such/dir: no such file or directory"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, message):
    out = stepper(*args)
    assert out.returncode == 2
    assert message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_inspect_only_that_matches_nothing_exits_2(ckpt):
    out = stepper("inspect", str(ckpt), "--only", "*nothing*")
    assert out.returncode == 2 and "--only *nothing* matched no tensor" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_block_out_of_range_names_the_grid():
    out = stepper("fp8", "--weight", KV, "--block", "2,0")
    assert out.stderr.strip() == (
        f"stepper: error: --block 2,0 is outside '{KV}': F8_E4M3 [144, 320] has a 2x3 grid of 128x128 blocks "
        "(rows 0..1, columns 0..2)"
    )


def test_stats_of_float64_values_near_the_largest_are_shown_not_hung(tmp_path):
    """Squares of F64 values past 2**512 overflow float64: the figures stay exact and finite."""
    from safetensors.numpy import save_file

    path = tmp_path / "wide.safetensors"
    save_file({"w": np.array([1e300, -2e300, 3.0]), "top": np.array([1.7976931348623157e308] * 2)}, str(path))
    lines = ok("inspect", "--stats", "--json", str(path)).splitlines()
    rows = {row["name"]: row["stats"] for row in map(json.loads, lines) if "name" in row}
    assert rows["w"]["std"] == pytest.approx(1.2472191289246472e300, rel=1e-15)
    assert rows["w"]["mean"] == pytest.approx(-1e300 / 3, rel=1e-15)
    assert rows["top"]["std"] == 0 and rows["top"]["sum"] is None  # past float64's range: no finite sum
    assert "std 1.247e+300" in ok("inspect", "--stats", "--plain", str(path))
