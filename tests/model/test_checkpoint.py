"""Checkpoint directories: stepper's own writer, an independent writer, strict checks, laziness."""

import ctypes
import json
import mmap
import os
import shutil
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from helpers.cli import stepper
from helpers.files import reference_write

from stepper.errors import StepperError
from stepper.presets import preset
from stepper.seams.trace import Recorder
from stepper.session import RunSpec, run
from stepper.weights import checkpoint as checkpoint_module
from stepper.weights.checkpoint import Checkpoint
from stepper.weights.names import is_linear, weight_shapes
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.synth_checkpoint import synth_checkpoint


def tensors_of(spec: RunSpec, weights=None) -> dict[str, np.ndarray]:
    rec = Recorder()
    run(spec, [rec], weights)
    return rec.tensors()


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory) -> Path:
    return synth_checkpoint(SyntheticWeights(preset("tiny"), seed=0), tmp_path_factory.mktemp("synth") / "tiny")


def test_synth_writes_an_hf_layout_fp8_checkpoint(synth_dir):
    index = json.loads((synth_dir / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in synth_dir.glob("*.safetensors"))
    assert len(shards) == 5 and set(index["weight_map"].values()) == set(shards)
    config = json.loads((synth_dir / "config.json").read_text())
    assert config["quantization_config"]["weight_block_size"] == [128, 128]
    ck = Checkpoint(synth_dir)
    dtype = {n: ck.shard_of(n).info(n).dtype for n in index["weight_map"]}
    assert dtype["model.layers.1.self_attn.kv_a_proj_with_mqa.weight"] == "F8_E4M3"
    assert dtype["model.layers.1.self_attn.kv_a_proj_with_mqa.weight_scale_inv"] == "F32"
    assert ck.shard_of("model.layers.1.self_attn.kv_a_proj_with_mqa.weight_scale_inv").info(
        "model.layers.1.self_attn.kv_a_proj_with_mqa.weight_scale_inv").shape == (2, 3)  # [144, 320] in 128-blocks
    for name in ("model.embed_tokens.weight", "model.norm.weight", "model.layers.1.mlp.gate.weight", "lm_head.weight"):
        assert dtype[name] == "BF16", name
    assert dtype["model.layers.1.mlp.gate.e_score_correction_bias"] == "F32"


def test_synth_checkpoint_runs_bit_identically_to_the_preset(synth_dir):
    spec = RunSpec(model="tiny", prompt_len=5, decode=1)
    from_preset = tensors_of(spec)
    from_dir = tensors_of(RunSpec(model=str(synth_dir), prompt_len=5, decode=1))
    assert from_dir.keys() == from_preset.keys()
    for name, array in from_preset.items():
        assert np.array_equal(from_dir[name], array), name


def test_kv_b_decoded_into_reused_memory_is_decoded_again_only_for_another_weight(synth_dir, monkeypatch):
    from stepper.kernels import linear
    from stepper.model.layer_weights import LayerWeights

    calls = []
    real = linear.float32_weight
    monkeypatch.setattr(linear, "float32_weight", lambda w, out: calls.append(w.name) or real(w, out))
    name, scratch = "self_attn.kv_b_proj.weight", {}
    from_file = Checkpoint(synth_dir)
    want = {layer: from_file.matrix(f"model.layers.{layer}.{name}").dequantize() for layer in (0, 1)}
    first = LayerWeights(from_file, 1, scratch).float32(name)
    assert np.array_equal(first, want[1]) and not first.flags.writeable and len(calls) == 1
    assert LayerWeights(from_file, 1, scratch).float32(name) is first and len(calls) == 1  # the same weight: kept
    assert np.array_equal(LayerWeights(from_file, 0, scratch).float32(name), want[0]) and len(calls) == 2
    again = LayerWeights(from_file, 1, scratch).float32(name)  # the memory holds layer 0's now
    assert again is first and np.array_equal(again, want[1]) and len(calls) == 3
    synthetic = SyntheticWeights(preset("tiny"), seed=0)  # no file: no way to tell two weights apart
    for _ in range(2):
        LayerWeights(synthetic, 1, scratch).float32(name)
    assert len(calls) == 5


def test_fp8_block_scales_are_checked_once_per_checkpoint(synth_dir, monkeypatch):
    from stepper.weights import checkpoint as reader

    calls, check = [], reader.check_scale_values
    monkeypatch.setattr(reader, "check_scale_values", lambda *a: calls.append(a[1]) or check(*a))
    name = "model.layers.1.mlp.experts.3.down_proj.weight"
    opened = Checkpoint(synth_dir)
    first, again = opened.matrix(name), opened.matrix(name)
    assert calls == [name + "_scale_inv"]  # asked for at every step, looked at once
    np.testing.assert_array_equal(again.dequantize(), first.dequantize())
    Checkpoint(synth_dir).matrix(name)  # another reader of the folder checks them itself
    assert calls == [name + "_scale_inv"] * 2


@pytest.mark.parametrize("model", ["tiny", "tiny-int4"])
def test_a_layer_stepped_again_decodes_its_bf16_router_and_kv_b_once(model, synth_dir, tmp_path, monkeypatch):
    from stepper.bench.layers import layer_step
    from stepper.kernels import linear
    from stepper.model import Transformer
    from stepper.model import router as router_module

    directory = synth_dir if model == "tiny" else synth_checkpoint(SyntheticWeights(preset(model), seed=0),
                                                                   tmp_path / model)
    decoded, gates = [], []
    real_decode, real_route = linear.float32_weight, router_module.route
    monkeypatch.setattr(linear, "float32_weight", lambda w, out: decoded.append(w.name) or real_decode(w, out))
    monkeypatch.setattr("stepper.model.moe.route", lambda x, gate, *rest: gates.append(gate.copy()) or
                        real_route(x, gate, *rest))
    gate, kv_b = "model.layers.1.mlp.gate.weight", "model.layers.1.self_attn.kv_b_proj.weight"
    step = layer_step(Transformer(Checkpoint(directory)), 1, 1, 8, np.random.default_rng(0))
    outputs = [step() for _ in range(3)]  # three decode steps of layer 1
    assert sorted(decoded) == [gate, kv_b]  # each decoded at the first step (BF16 in tiny-int4), kept for the next two
    stored = Checkpoint(directory).stored(gate)
    assert stored.dtype == "BF16"
    want = stored.data.astype(np.float32)  # ml_dtypes' cast of the stored BF16
    assert len(gates) == 3 and all(np.array_equal(g, want) for g in gates)
    assert all(np.array_equal(out, outputs[0]) for out in outputs)


@pytest.mark.skipif(not hasattr(os, "posix_fadvise") or sys.platform != "linux", reason="needs Linux mincore")
def test_bench_forgets_then_fills_the_page_cache_without_keeping_pages_mapped(synth_dir):
    from helpers.files import resident_pages

    from stepper.bench.checkpoints import fill_page_cache, forget_page_cache

    shards = sorted(synth_dir.glob("*.safetensors"))
    forget_page_cache(synth_dir)
    if any(resident_pages(s).any() for s in shards):
        pytest.skip("this file system keeps pages cached after POSIX_FADV_DONTNEED")
    mapped_before = mapped_bytes_of(shards)
    fill_page_cache(synth_dir)
    assert all(resident_pages(s).all() for s in shards)
    assert mapped_bytes_of(shards) == mapped_before == 0


def mapped_bytes_of(paths: list[Path]) -> int:
    """Bytes of these files this process has mapped (/proc/self/smaps)."""
    from helpers.files import mappings

    names = {str(p) for p in paths}
    return sum(int(m["Rss"][0]) * 1024 for m in mappings() if m["path"] in names)


def test_synth_refuses_to_overwrite_without_force(synth_dir, tmp_path):
    out = stepper("synth", "--out", str(synth_dir))
    assert out.returncode == 2 and "already exists; pass --force" in out.stderr
    target = tmp_path / "again"
    assert stepper("synth", "--out", str(target), "--layers", "1:2").returncode == 0
    assert stepper("synth", "--out", str(target), "--force").returncode == 0
    assert len(list(target.glob("*.safetensors"))) == 5 and not list(tmp_path.glob(".again*"))


# ---------------------------------------------------------------------------------------------
# A checkpoint written by an independent writer (the safetensors package), with FP8 made by
# ml_dtypes' own cast, the shards laid out differently and one scale in another shard.


def independent_checkpoint(folder: Path, seed: int = 7, drop=(), reshape=None, extra=None) -> dict[str, np.ndarray]:
    """Write tiny's weights with safetensors.serialize_file; return the float64-dequantized truth."""
    cfg = preset("tiny")
    rng = np.random.default_rng(seed)
    shards: dict[str, dict] = {"a.safetensors": {}, "b.safetensors": {}}
    truth = {}
    for i, (name, shape) in enumerate(weight_shapes(cfg).items()):
        shard = "a.safetensors" if i % 2 == 0 else "b.safetensors"
        if reshape and name in reshape:
            shape = reshape[name]
        w = rng.standard_normal(shape) / np.sqrt(shape[-1])
        if name.endswith("norm.weight"):
            w = 1 + 0.1 * rng.standard_normal(shape)
        if name.endswith("bias"):
            shards[shard][name] = entry("F32", w.astype(np.float32))
            truth[name] = w.astype(np.float32).astype(np.float64)
        elif is_linear(name):
            codes, scales, value = independent_fp8(w)
            shards[shard][name] = entry("F8_E4M3", codes)
            scale_shard = "b.safetensors" if name.endswith("layers.1.self_attn.kv_b_proj.weight") else shard
            shards[scale_shard][name + "_scale_inv"] = entry("F32", scales)
            truth[name] = value
        else:
            b = w.astype(ml_dtypes.bfloat16)
            shards[shard][name] = entry("BF16", b)
            truth[name] = b.astype(np.float64)
    for name, (dtype, array, shard) in (extra or {}).items():
        for tensors in shards.values():
            tensors.pop(name, None)
        shards[shard][name] = entry(dtype, array)
    for tensors in shards.values():
        for name in drop:
            tensors.pop(name, None)
    folder.mkdir()
    weight_map = {}
    for shard, tensors in shards.items():
        reference_write(folder / shard, tensors)
        weight_map.update(dict.fromkeys(tensors, shard))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(cfg.to_hf()))
    assert any(weight_map[n] != weight_map[n + "_scale_inv"] for n in weight_map if n + "_scale_inv" in weight_map)
    return truth


def entry(dtype: str, array: np.ndarray) -> np.ndarray:
    expected = {"F32": np.float32, "BF16": ml_dtypes.bfloat16, "F8_E4M3": ml_dtypes.float8_e4m3fn,
                "F8_E8M0": ml_dtypes.float8_e8m0fnu}[dtype]
    if dtype == "F8_E8M0":  # given as exponent bytes
        return np.ascontiguousarray(array, dtype=np.uint8).view(expected)
    return np.ascontiguousarray(array, dtype=expected)


def independent_fp8(w: np.ndarray):
    """Block-quantize with ml_dtypes' cast; dequantize in float64 by explicit block indexing."""
    rows, cols = (-(-n // 128) for n in w.shape)
    scales = np.zeros((rows, cols), np.float32)
    codes = np.zeros(w.shape, ml_dtypes.float8_e4m3fn)
    value = np.zeros(w.shape)
    for r in range(rows):
        for c in range(cols):
            block = (slice(128 * r, 128 * r + 128), slice(128 * c, 128 * c + 128))
            scales[r, c] = np.abs(w[block]).max() / 448
            codes[block] = (w[block] / scales[r, c]).astype(ml_dtypes.float8_e4m3fn)
            value[block] = codes[block].astype(np.float64) * np.float64(scales[r, c])
    return codes, scales, value


@pytest.mark.skipif(not os.environ.get("STEPPER_REQUIRE_CROSSCHECK")
                    and not __import__("importlib").util.find_spec("torch"),
                    reason="needs torch and transformers (pip install -e .[crosscheck])")
@pytest.mark.parametrize("writer", ["stepper", "independent"])
def test_checkpoints_match_the_pytorch_reference(tmp_path, writer):
    from helpers.compare import compare
    from helpers.hf_reference import hf_trace

    folder = tmp_path / "ckpt"
    if writer == "stepper":
        synth_checkpoint(SyntheticWeights(preset("tiny"), seed=11), folder)
        ck = Checkpoint(folder)
        truth = {n: ck.get(n).astype(np.float64) for n in weight_shapes(ck.config)}
    else:
        truth = independent_checkpoint(folder)
    dump = tmp_path / "run.safetensors"
    out = stepper("run", "--model", str(folder), "--ids", "3,1,4,1,5", "--start-pos", "4094", "--decode", "2",
                  "--attn", "naive",
                  "--json", "--dump", str(dump))
    assert out.returncode == 0, out.stderr
    from safetensors.numpy import load_file

    mine = load_file(str(dump))
    generated = json.loads(json.loads(Path(dump).read_bytes()[8:8 + int.from_bytes(dump.read_bytes()[:8], "little")])
                           ["__metadata__"]["generated"])
    ref = hf_trace(preset("tiny").to_hf(), {n: v.astype(np.float32) for n, v in truth.items()},
                   np.array([[3, 1, 4, 1, 5]]), start_pos=4094, decode_ids=[np.array([[t]]) for t in generated])
    assert set(mine) == set(ref)
    failures = {n: why for n in mine if (why := compare(n, mine, ref))}
    assert not failures, failures


def test_problems_are_reported_together_by_name(tmp_path):
    bad_scale = np.ones((1, 1), np.float32)
    independent_checkpoint(
        tmp_path / "bad",
        drop=("model.layers.1.mlp.gate.weight", "model.layers.2.self_attn.o_proj.weight"),
        reshape={"model.layers.0.self_attn.kv_a_layernorm.weight": (99,)},
        extra={
            "model.layers.0.input_layernorm.weight_scale_inv": ("F32", bad_scale, "a.safetensors"),
        },
    )
    with pytest.raises(StepperError) as err:
        Checkpoint(tmp_path / "bad").check(range(3), with_globals=True)
    message = str(err.value)
    assert "4 problem(s)" in message
    for name in ("model.layers.1.mlp.gate.weight' is missing", "model.layers.2.self_attn.o_proj.weight' is missing",
                 "kv_a_layernorm.weight' has shape [99], expected [128]",
                 "input_layernorm.weight_scale_inv' is a block scale for a BF16 weight"):
        assert name in message, name
    out = stepper("run", "--model", str(tmp_path / "bad"))
    assert out.returncode == 2 and "4 problem(s)" in out.stderr and "Traceback" not in out.stderr
    # running layer 0 alone only needs layer 0's tensors: two of the problems remain
    assert "2 problem(s)" in stepper("run", "--model", str(tmp_path / "bad"), "--layer", "0").stderr


@pytest.mark.parametrize("field, edit, fits", [
    ("q_lora_rank", None, "q_lora_rank = 192 (config.json gives none)"),  # a porter deleted it: q_proj expected
    ("hidden_size", 640, "hidden_size = 320 (config.json gives 640)"),
    ("kv_lora_rank", 192, "kv_lora_rank = 128 (config.json gives 192)"),
    ("qk_rope_head_dim", 32, "qk_rope_head_dim = 16 (config.json gives 32)"),  # only in a sum: kv_lora_rank + rope
    ("moe_intermediate_size", 192, "moe_intermediate_size = 96 (config.json gives 192)"),  # layer 0 is dense: layer 1
    ("n_shared_experts", 2, "n_shared_experts = 1 (config.json gives 2)"),
])
def test_a_refusal_names_the_config_field_the_weights_contradict(synth_dir, tmp_path, field, edit, fits):
    folder = tmp_path / "ck"
    shutil.copytree(synth_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    if edit is None:
        del config[field]
    else:
        config[field] = edit
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(StepperError) as err:
        Checkpoint(folder).check(range(3), with_globals=True)
    layer = 1 if field in ("moe_intermediate_size", "n_shared_experts") else 0
    assert str(err.value).splitlines()[-1] == (f"the weights fit {fits}: every tensor of layer {layer} then has its "
                                               "stored shape")
    inspected = stepper("inspect", folder, "--plain")
    assert inspected.returncode == 1 and f"the weights fit {fits}" in inspected.stdout


def test_no_field_is_named_where_no_one_field_explains_the_weights(synth_dir, tmp_path):
    folder = tmp_path / "ck"
    shutil.copytree(synth_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "kv_lora_rank": 192, "hidden_size": 640}))
    with pytest.raises(StepperError) as err:
        Checkpoint(folder).check(range(3), with_globals=True)
    assert "the weights fit" not in str(err.value)


def test_a_count_far_past_the_stored_experts_is_refused_without_trying_every_size(synth_dir, tmp_path, monkeypatch):
    """n_routed_experts 65,536 where 32 are stored: the hint tried hundreds of sizes of every field,
    each naming all 65,536 experts (a minute and a half). With experts absent no size can fit: the
    layers' names are made a few times, not once per size."""
    folder = tmp_path / "ck"
    shutil.copytree(synth_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "n_routed_experts": 1 << 16}))
    made = []
    shapes = checkpoint_module.layer_shapes
    monkeypatch.setattr(checkpoint_module, "layer_shapes", lambda cfg, layer: made.append(layer) or shapes(cfg, layer))
    with pytest.raises(StepperError, match="problem"):
        Checkpoint(folder).check(range(3), with_globals=True)
    assert len(made) <= 8, len(made)


def test_a_missing_or_misshaped_scale_is_named(tmp_path):
    name = "model.layers.1.self_attn.q_b_proj.weight"
    independent_checkpoint(tmp_path / "noscale", drop=(name + "_scale_inv",))
    with pytest.raises(StepperError, match=f"'{name}_scale_inv' is missing"):
        Checkpoint(tmp_path / "noscale").check([1], with_globals=False)
    # q_b_proj is [192, 192]: its scales must be [2, 2]
    independent_checkpoint(tmp_path / "badscale",
                           extra={name + "_scale_inv": ("F32", np.ones((2, 1)), "a.safetensors")})
    with pytest.raises(StepperError, match=r"has shape \[2, 1\], expected \[2, 2\] for a \[192, 192\] weight"):
        Checkpoint(tmp_path / "badscale").check([1], with_globals=False)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: m.update({"model.norm.weight": "../outside.safetensors"}),
         "expected a file name ending in .safetensors"),
        (lambda m: m.update({"model.norm.weight": "C:outside.safetensors"}),
         "expected a file name ending in .safetensors"),
        (lambda m: m.update({"model.norm.weight": "sub\\b.safetensors"}),
         "expected a file name ending in .safetensors"),
        (lambda m: m.update({"model.norm.weight": "/abs/b.safetensors"}),
         "expected a file name ending in .safetensors"),
        (lambda m: m.update({"model.norm.weight": "b.bin"}), "expected a file name ending in .safetensors"),
        (lambda m: m.update({"model.layers.0.ghost.weight": "a.safetensors"}),
         "listed in model.safetensors.index.json but not in this shard"),
        (lambda m: m.pop("lm_head.weight"), "is in this shard but not in model.safetensors.index.json"),
    ],
)
def test_index_errors_name_the_index_and_tensor(tmp_path, edit, message):
    folder = tmp_path / "ck"
    independent_checkpoint(folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    edit(index["weight_map"])
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    out = stepper("run", "--model", str(folder))
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1  # one problem: one line


def test_an_index_disagreement_refuses_only_the_runs_that_reach_it(tmp_path):
    """A tensor of layer 0 listed in the index but in no shard: inspect lists the rest and names it
    (exit 1), a run of the whole model is refused in one line, a run of layer 2 alone goes ahead."""
    folder = tmp_path / "ck"
    independent_checkpoint(folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.layers.0.ghost.weight"] = "a.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    checked = stepper("inspect", "--plain", str(folder))
    assert (checked.returncode == 1 and "layer 2 (MoE)" in checked.stdout
            and "mlp.experts.{0..31}.up_proj" in checked.stdout)
    assert ("  ! a.safetensors: 'model.layers.0.ghost.weight' is listed in model.safetensors.index.json"
            in checked.stdout)
    whole = stepper("run", "--model", str(folder), "--prompt-len", "2")
    assert whole.returncode == 2 and whole.stderr.count("\n") == 1 and "ghost" in whole.stderr
    alone = stepper("run", "--model", str(folder), "--layer", "2", "--prompt-len", "2", "--only", "*routed_output")
    assert alone.returncode == 0 and "layers.2.mlp.routed_output" in alone.stdout


# ---------------------------------------------------------------------------------------------
# Laziness: running one layer reads only that layer's pages.

LIBC = ctypes.CDLL(None, use_errno=True)


def resident_pages(path: Path) -> np.ndarray:
    """Which pages of a file are in the page cache (mincore on a fresh read-only map)."""
    size = path.stat().st_size
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = np.frombuffer(mm, dtype=np.uint8)
        page = mmap.PAGESIZE
        vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
        assert LIBC.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(size), vec) == 0
        del view
        return np.frombuffer(vec, dtype=np.uint8) & 1


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_running_one_layer_never_reads_the_other_layers(tmp_path):
    raw = preset("tiny").to_hf()
    raw["num_hidden_layers"] = 6
    from stepper.config import Config

    cfg = Config.from_hf(raw)
    folder = synth_checkpoint(SyntheticWeights(cfg, seed=2), tmp_path / "six")
    ck = Checkpoint(folder)  # reads config, index and every shard's header
    layer_shard = {i: folder / ck.weight_map[f"model.layers.{i}.input_layernorm.weight"] for i in range(6)}
    assert len(set(layer_shard.values())) == 6  # one shard per layer
    for shard in folder.glob("*.safetensors"):
        evict(shard)
    if any(resident_pages(s).sum() for s in folder.glob("*.safetensors")):
        pytest.skip("this file system keeps pages cached after POSIX_FADV_DONTNEED")

    tensors_of(RunSpec(layer=4, prompt_len=3), ck)

    for i, shard in layer_shard.items():
        read = int(resident_pages(shard).sum())
        if i == 4:
            assert read > 0  # layer 4's weights were read
        else:
            assert read == 0, f"layer {i}'s shard had {read} pages read"


def test_the_reader_lets_go_of_the_least_recently_used_tensors_past_its_budget(synth_dir, monkeypatch):
    from stepper.weights import checkpoint
    from stepper.weights.safetensors_reader import SafetensorsFile

    monkeypatch.setattr(checkpoint, "LARGE", 0)  # every tensor counts (tiny's are all small)
    read = Checkpoint(synth_dir)
    names = [n for n in read.weight_map if n.startswith("model.layers.1.mlp.experts.")][:3]
    sizes = sorted(read.shard_of(n).mapped_bytes(n) for n in names)
    read._resident.limit = sizes[1] + sizes[2]  # room for any two of the three, not for all
    let_go = []
    monkeypatch.setattr(SafetensorsFile, "release", lambda self, name: let_go.append(name))
    read.get(names[0]), read.get(names[1])
    assert let_go == []
    read.get(names[0])  # used again: names[1] is now the least recently used
    read.get(names[2])
    assert let_go == [names[1]]


# ---------------------------------------------------------------------------------------------
# Nothing a user wrote is lost; what the reference readers skip is checked; partial checkpoints


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_synth_force_never_replaces_what_stepper_did_not_write(tmp_path):
    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / "notes.txt").write_text("my notes\n")
    (mine / "sub" / "data.bin").write_bytes(b"\x00\x01")
    before = snapshot(mine)
    out = stepper("synth", "--out", str(mine), "--force")
    assert out.returncode == 2 and "'notes.txt'" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert snapshot(mine) == before
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    out = stepper("synth", "--out", str(afile), "--force")
    assert out.returncode == 2 and "is a file" in out.stderr and "Traceback" not in out.stderr
    assert afile.read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "mine"]  # no .old-* or .partial-* left


def test_synth_into_a_place_it_cannot_write_is_one_line(tmp_path):
    for out in ("/proc/ck", str(tmp_path / "no" / "such" / "ck")):
        done = stepper("synth", "--out", out)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr


def test_an_index_with_a_key_twice_is_refused_naming_the_key(tmp_path):
    folder = tmp_path / "ck"
    independent_checkpoint(folder)
    index = folder / "model.safetensors.index.json"
    text = index.read_text()
    index.write_text(text.replace('"weight_map": {', '"weight_map": {"model.norm.weight": "a.safetensors", ', 1))
    done = stepper("run", "--model", str(folder))
    assert done.returncode == 2 and "'model.norm.weight' appears twice" in done.stderr
    assert str(index) in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_partial_checkpoint_runs_the_layers_whose_shards_it_has(synth_dir, tmp_path):
    folder = tmp_path / "partial"
    shutil.copytree(synth_dir, folder)
    (folder / "model-00003-of-00005.safetensors").unlink()  # layer 1's shard: not downloaded
    damaged = folder / "model-00004-of-00005.safetensors"  # layer 2's shard: cut short
    damaged.write_bytes(damaged.read_bytes()[:100])
    whole = tensors_of(RunSpec(model=str(synth_dir), layer=0))
    assert tensors_of(RunSpec(model=str(folder), layer=0)).keys() == whole.keys()
    for name, array in tensors_of(RunSpec(model=str(folder), layer=0)).items():
        assert np.array_equal(array, whole[name]), name
    assert stepper("run", "--model", str(folder), "--layers", "0:1").returncode == 0
    for layer, shard, why in ((1, "model-00003-of-00005.safetensors", "no such file"),
                              (2, "model-00004-of-00005.safetensors", "")):
        done = stepper("run", "--model", str(folder), "--layer", str(layer))
        assert done.returncode == 2 and shard in done.stderr and f"cannot be read ({why}" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert Checkpoint(folder).unreadable["model-00003-of-00005.safetensors"] == "no such file"


@pytest.mark.parametrize("bad", [np.nan, 0.0, -0.5, np.inf])
def test_scales_that_are_not_finite_and_positive_are_named_when_read(tmp_path, bad):
    name = "model.layers.1.self_attn.q_b_proj.weight_scale_inv"
    scales = np.ones((2, 2), np.float32)
    scales[1, 0] = bad
    independent_checkpoint(tmp_path / "ck", extra={name: ("F32", scales, "a.safetensors")})
    done = stepper("run", "--model", str(tmp_path / "ck"), "--layer", "1")
    assert done.returncode == 2 and done.stderr.startswith(
        f"stepper: error: {tmp_path / 'ck'}: a.safetensors: '{name}' holds 1 scale(s) that are not finite and positive")
    assert "at [1, 0]" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert stepper("run", "--model", str(tmp_path / "ck"), "--layer", "0").returncode == 0  # not read there


def test_a_scale_with_no_weight_is_reported(tmp_path):
    orphan = "model.layers.0.mlp.gate_proj.bias_scale_inv"
    independent_checkpoint(tmp_path / "ck", extra={orphan: ("F32", np.ones((1, 1), np.float32), "b.safetensors")})
    with pytest.raises(StepperError, match=f"'{orphan}' is a block scale with no weight"):
        Checkpoint(tmp_path / "ck").check([0], with_globals=False)
    Checkpoint(tmp_path / "ck").check([1], with_globals=False)  # another layer's: not this run's problem


def test_e8m0_block_scales_are_read_as_powers_of_two(tmp_path):
    name = "model.layers.1.self_attn.q_b_proj.weight"
    exponents = np.array([[127, 128], [126, 130]], np.uint8)  # 1, 2, 0.5, 8
    independent_checkpoint(tmp_path / "ck", extra={name + "_scale_inv": ("F8_E8M0", exponents, "a.safetensors")})
    ck = Checkpoint(tmp_path / "ck")
    ck.check([1], with_globals=False)
    codes = ck.shard_of(name).get(name).astype(np.float32)
    powers = np.array([[1, 2], [0.5, 8]], np.float32)
    assert np.array_equal(ck.get(name), codes * np.repeat(np.repeat(powers, 128, 0), 128, 1)[:192, :192])


@pytest.mark.parametrize("model, quant", [("tiny", None), ("tiny", "int4"), ("tiny-v4", None)])
def test_checking_every_scale_and_weight_shape_maps_no_shard(model, quant, tmp_path, monkeypatch):
    """inspect's checks (every block scale, group scale and weight_shape) and a run's (every
    weight_shape of an INT4 layer) read those small tensors from the file: through the map each
    faulted in the 2 MB block around it, 2.4 GB read and mapped for one Kimi K2 layer's 4 MB of scales."""
    from stepper.session import load_model
    from stepper.views import inspect
    from stepper.weights.safetensors_reader import SafetensorsFile
    from stepper.weights.synth_checkpoint import no_progress, requantized

    source = load_model(model, 0)
    if hasattr(source, "write_checkpoint"):
        source.write_checkpoint(tmp_path / "ck", False, no_progress)
    else:
        synth_checkpoint(SyntheticWeights(requantized(source.config, quant) if quant else source.config, 0),
                         tmp_path / "ck")

    def mapped(self):
        raise AssertionError(f"{self.path.name} mapped")

    monkeypatch.setattr(SafetensorsFile, "_mapped", mapped)
    assert inspect.find_problems(inspect.open_source(tmp_path / "ck"), None) == []
    if not hasattr(source, "write_checkpoint"):
        Checkpoint(tmp_path / "ck").check(range(source.config.num_hidden_layers), with_globals=True)
