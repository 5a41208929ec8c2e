"""Mistral Small 4 in FP8 as published: one scale per tensor (quantization_config weight_block_size
null), the fused experts with one scale per expert [E, 1, 1] (transformers'
models/mistral4/convert_mistral4_weight_to_hf.py). `stepper synth --quant fp8` writes that layout
for tiny-mistral4; stepper's run on it is compared, every named tensor, prefill then cached decode,
with transformers' Mistral4ForCausalLM on the same weights dequantized exactly (ml_dtypes' e4m3
decode times the scale, float32: transformers' finegrained FP8 layers need a GPU kernel), and
stepper's decode of every weight with that ml_dtypes decode bit for bit. A scale of the wrong
shape, and a block-scaled quantization_config, are refused in one line."""

import json
import os
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

if not os.environ.get("STEPPER_REQUIRE_CROSSCHECK"):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")

from helpers.cli import refused, stepper
from helpers.compare import compare
from helpers.configs import family_preset
from helpers.hf_families import hf_family_trace

from stepper.errors import StepperError
from stepper.families import load_config
from stepper.seams.trace import Recorder
from stepper.session import RunSpec, run
from stepper.weights.checkpoint import Checkpoint
from stepper.weights.safetensors_reader import SafetensorsFile
from stepper.weights.safetensors_writer import Entry, write_safetensors
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.synth_checkpoint import requantized, synth_checkpoint

PROMPT = (17, 402, 999, 3, 256, 77, 640)
SCALE = "_scale_inv"


def tensors(folder: Path) -> dict[str, tuple[str, np.ndarray]]:
    """Every tensor of a checkpoint folder: its safetensors dtype and its stored array."""
    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        f = SafetensorsFile(path)
        out.update({name: (f.info(name).dtype, np.asarray(f.get(name))) for name in f.names()})
    return out


def reference_value(codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """ml_dtypes' e4m3fn decode times the scale (a scalar, or [E, 1, 1] over a fused [E, rows, cols])."""
    values = codes.view(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    return values * np.asarray(scale, np.float32).reshape(scale.shape + (1,) * (codes.ndim - scale.ndim))


def dequantized_copy(fp8: Path, out: Path) -> Path:
    """The checkpoint with every tensor in float32, FP8 ones dequantized by reference_value, and no
    quantization_config: what transformers' Mistral4ForCausalLM loads on the CPU."""
    out.mkdir()
    config = json.loads((fp8 / "config.json").read_text())
    config.pop("quantization_config")
    (out / "config.json").write_text(json.dumps(config))
    stored = tensors(fp8)
    values = {name: reference_value(array, stored[name + SCALE][1]) if dtype == "F8_E4M3"
              else np.asarray(array).astype(np.float32)
              for name, (dtype, array) in stored.items() if not name.endswith(SCALE)}
    write_safetensors(out / "model.safetensors",
                      [Entry(n, "F32", v.shape, lambda v=v: v) for n, v in values.items()], {"format": "pt"})
    return out


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("mistral4-fp8")
    cfg = requantized(family_preset("tiny-mistral4"), "fp8")
    fp8 = synth_checkpoint(SyntheticWeights(cfg, seed=3), base / "fp8")
    return fp8, dequantized_copy(fp8, base / "f32")


def test_synth_writes_the_published_per_tensor_layout(folders):
    fp8, _ = folders
    quant = json.loads((fp8 / "config.json").read_text())["quantization_config"]
    assert quant["quant_method"] == "fp8" and quant["weight_block_size"] is None
    stored = tensors(fp8)
    experts = family_preset("tiny-mistral4").n_routed_experts
    assert stored["model.layers.1.mlp.experts.gate_up_proj"][0] == "F8_E4M3"
    assert stored["model.layers.1.mlp.experts.gate_up_proj_scale_inv"][1].shape == (experts, 1, 1)
    assert stored["model.layers.1.mlp.experts.down_proj_scale_inv"][1].shape == (experts, 1, 1)
    assert stored["model.layers.1.self_attn.q_a_proj.weight_scale_inv"][1].shape == ()
    assert stored["lm_head.weight"][0] == "BF16" and stored["model.layers.1.mlp.gate.weight"][0] == "BF16"
    # each scale brings its tensor's (or its expert's) largest value to the e4m3 maximum, 448
    gate_up = stored["model.layers.1.mlp.experts.gate_up_proj"][1].view(ml_dtypes.float8_e4m3fn)
    assert np.array_equal(np.abs(gate_up.astype(np.float32)).max(axis=(1, 2)), np.full(experts, 448, np.float32))


def test_every_weight_decodes_as_ml_dtypes_does(folders):
    fp8, f32 = folders
    source = Checkpoint(fp8, load_config)
    reference = tensors(f32)
    cfg = source.config
    names = [f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight"
             for layer in range(cfg.first_k_dense_replace, cfg.num_hidden_layers)
             for e in range(cfg.n_routed_experts) for proj in ("gate_proj", "up_proj", "down_proj")]
    names += [n for n in reference if n.endswith("_proj.weight") and ".experts." not in n]
    inter = cfg.moe_intermediate_size
    for name in names:
        stored = source.stored(name)
        assert stored.dtype == "F8_E4M3" and len(set(stored.scale_inv.ravel().tolist())) == 1, name  # one scale
        if ".experts." in name:  # the expert's rows of the fused reference
            layer, e, proj = name.split(".")[2], int(name.split(".")[5]), name.split(".")[6]
            fused = f"model.layers.{layer}.mlp.experts.{'down_proj' if proj == 'down_proj' else 'gate_up_proj'}"
            whole = reference[fused][1][e]
            want = whole if proj == "down_proj" else whole[:inter] if proj == "gate_proj" else whole[inter:]
        else:
            want = reference[name][1]
        assert np.array_equal(source.get(name).view(np.uint32), want.view(np.uint32)), name


@pytest.mark.parametrize("start_pos, decode, attn", [(0, 2, "naive"), (4093, 3, "naive"), (4093, 2, "absorb")])
def test_every_tensor_matches_transformers_on_the_dequantized_weights(folders, start_pos, decode, attn):
    fp8, f32 = folders
    rec = Recorder()
    result = run(RunSpec(model=str(fp8), ids=PROMPT, start_pos=start_pos, decode=decode, attn=attn), [rec])
    steps = [np.array([[t]]) for t in result.generated]
    ref = hf_family_trace(f32, np.array([PROMPT]), start_pos=start_pos, decode_ids=steps)
    mine = rec.tensors()
    if attn == "absorb":  # transformers has no absorbed path: its naive tensors are left out of it
        ref = {n: v for n, v in ref.items() if n in mine}
        mine = {n: v for n, v in mine.items() if n in ref}
    assert len(mine) > 50 and set(mine) == set(ref), sorted(set(mine) ^ set(ref))
    assert sum(n.endswith("mlp.gate.topk_idx") for n in mine)  # the routed experts (FP8, fused) were run
    failures = {n: why for n in mine if (why := compare(n, mine, ref))}
    assert not failures, failures


def rewritten(fp8: Path, out: Path, name: str, array: np.ndarray) -> Path:
    """A copy of the checkpoint with one F32 tensor replaced (its shard rewritten)."""
    shutil.copytree(fp8, out)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shard = out / index["weight_map"][name]
    f = SafetensorsFile(shard)
    kept = {n: (f.info(n).dtype, np.array(f.get(n))) for n in f.names() if n != name}  # copied: the shard goes
    entries = [Entry(n, dtype, a.shape, lambda a=a: a) for n, (dtype, a) in kept.items()]
    shard.unlink()
    write_safetensors(shard, [*entries, Entry(name, "F32", array.shape, lambda: array)], {"format": "pt"})
    return out


def test_a_fused_scale_of_the_wrong_shape_is_refused_in_one_line(folders, tmp_path):
    fp8, _ = folders
    experts = family_preset("tiny-mistral4").n_routed_experts
    name = "model.layers.1.mlp.experts.gate_up_proj_scale_inv"  # one per gate and up half: not the published layout
    bad = rewritten(fp8, tmp_path / "bad", name, np.ones((experts, 2, 1), np.float32))
    line = refused(stepper("run", "--model", bad, "--ids", "1,2,3", "--layers", "1:2"))
    assert name in line and f"[{experts}, 2, 1]" in line and f"[{experts}, 1, 1]" in line and ".safetensors" in line
    with pytest.raises(StepperError, match=r"\[16, 2, 1\].*one scale per expert"):
        Checkpoint(bad, load_config).stored("model.layers.1.mlp.experts.3.up_proj.weight")


def test_a_linear_scale_of_more_than_one_value_is_refused(folders, tmp_path):
    fp8, _ = folders
    name = "model.layers.1.self_attn.q_a_proj.weight_scale_inv"
    bad = rewritten(fp8, tmp_path / "bad", name, np.ones((2, 3), np.float32))  # a 128x128 grid
    line = refused(stepper("run", "--model", bad, "--ids", "1,2,3", "--layers", "1:2"))
    assert name in line and "[2, 3]" in line and "one scale per tensor" in line


def test_block_scaled_mistral4_is_refused(folders, tmp_path):
    fp8, _ = folders
    bad = tmp_path / "blocks"
    shutil.copytree(fp8, bad)
    config = json.loads((bad / "config.json").read_text())
    config["quantization_config"]["weight_block_size"] = [128, 128]
    (bad / "config.json").write_text(json.dumps(config))
    line = refused(stepper("run", "--model", bad, "--ids", "1,2,3"))
    assert "quantization_config.weight_block_size" in line and "must be null" in line and "config.json" in line


def published_copy(fp8: Path, out: Path) -> Path:
    """The checkpoint as Mistral Small 4 is published: the mistral3 wrapper's config.json with the
    quantization_config transformers' conversion writes on it, the text model's tensors under
    language_model., each FP8 module's static activation scales beside its weight scales, a
    vision tower's tensor."""
    out.mkdir()
    text = json.loads((fp8 / "config.json").read_text())
    text.pop("quantization_config")
    quant = {"activation_scheme": "static", "dequantize": False, "quant_method": "fp8", "weight_block_size": None,
             "modules_to_not_convert": ["model.vision_tower", "model.multi_modal_projector", "lm_head"]}
    config = {"architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3", "text_config": text,
              "vision_config": {"model_type": "pixtral"}, "quantization_config": quant, "tie_word_embeddings": False}
    (out / "config.json").write_text(json.dumps(config))
    entries = {}
    for name, (dtype, array) in tensors(fp8).items():
        entries["language_model." + name] = (dtype, array)
        if name.endswith(SCALE):  # X.weight_scale_inv: X.activation_scale; experts: one per expert
            weight = name.removesuffix(SCALE)
            act = (weight.removesuffix(".weight") + ".activation_scale" if weight.endswith(".weight")
                   else weight + "_activation_scale")
            entries["language_model." + act] = ("F32", np.full(array.shape[:1] if array.ndim else (), 0.5, np.float32))
    entries["vision_tower.transformer.layers.0.attention.q_proj.weight"] = ("BF16", np.zeros((4, 4), np.uint16))
    write_safetensors(out / "model.safetensors", [Entry(n, dtype, a.shape, lambda a=a: a) for n, (dtype, a)
                                                  in entries.items()], {"format": "pt"})
    return out


def test_the_published_wrapper_runs_as_its_text_model(folders, tmp_path):
    fp8, _ = folders
    published = published_copy(fp8, tmp_path / "published")

    def trace(model):
        rec = Recorder()
        run(RunSpec(model=str(model), ids=PROMPT, start_pos=4093, decode=1), [rec])
        return rec.tensors()

    mine, text_only = trace(published), trace(fp8)  # every named tensor, bit for bit
    assert "decode0.logits" in mine and set(mine) == set(text_only)
    assert all(np.array_equal(mine[n], text_only[n]) for n in text_only)
    source = Checkpoint(published, load_config)
    assert source.config.wrapper.model_type == "mistral3" and source.per_tensor
    assert not source.problems(range(source.config.num_hidden_layers), with_globals=True)
    listed = stepper("inspect", published, "--json")  # its activation scales are listed, and no problem
    assert listed.returncode == 0 and '"model.layers.1.mlp.experts.down_proj_activation_scale"' in listed.stdout


def test_inspect_stats_are_of_the_values(folders):
    fp8, f32 = folders
    out = stepper("inspect", fp8, "--stats", "--layers", "1:2", "--json")
    assert out.returncode == 0, out.stderr
    rows = {row["name"]: row for row in map(json.loads, out.stdout.splitlines()) if "name" in row}
    reference = tensors(f32)
    for name in ("model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.self_attn.q_a_proj.weight"):
        want = reference[name][1]
        stats = rows[name]["stats"]
        assert stats["absmax"] == float(np.abs(want).max()) and stats["min"] == float(want.min()), name
        assert stats["sum"] == pytest.approx(float(want.astype(np.float64).sum()), rel=1e-9), name


def test_a_run_reads_only_the_chosen_experts(folders, monkeypatch):
    fp8, _ = folders
    asked: set[str] = set()
    stored = Checkpoint.stored

    def spy(self, name):
        asked.add(name)
        return stored(self, name)

    monkeypatch.setattr(Checkpoint, "stored", spy)
    rec = Recorder()
    run(RunSpec(model=str(fp8), ids=PROMPT[:2], attn="naive"), [rec])
    chosen = {f"model.layers.{n.split('.')[1]}.mlp.experts.{e}.{proj}.weight"
              for n, idx in rec.tensors().items() if n.endswith("mlp.gate.topk_idx")
              for e in np.unique(idx) for proj in ("gate_proj", "up_proj", "down_proj")}
    read = {n for n in asked if ".mlp.experts." in n}
    experts = family_preset("tiny-mistral4").n_routed_experts
    assert chosen and read == chosen and len(chosen) < 3 * experts * 2  # two MoE layers, not every expert read


@pytest.mark.parametrize("tokens", [1, 300])
def test_helpers_map_an_experts_bytes_out_of_the_fused_tensor(folders, monkeypatch, tokens):
    """An expert's FP8 matrix lies inside its fused tensor (origin at the expert's first code): a
    helper process that maps it there makes the same product."""
    from stepper.kernels import fp8_workers, parallel
    from stepper.kernels.fp8_matmul import linear_fp8

    if parallel.cores() < 2:
        pytest.skip("helpers need two cores")
    monkeypatch.setattr(fp8_workers, "SHARE_WORK", 0)  # every product with a file behind it is shared
    fp8_workers.stop_helpers()
    try:
        source = Checkpoint(folders[0], load_config)
        for name in ("model.layers.1.mlp.experts.3.down_proj.weight", "model.layers.2.mlp.experts.7.down_proj.weight"):
            w = source.matrix(name)
            assert w.origin is not None and w.shape[0] > 2 * 128, name  # rows in several blocks: bands to share
            x = np.random.default_rng(tokens).standard_normal((tokens, w.shape[1])).astype(np.float32)
            exact = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
            before = fp8_workers.helpers()[0].bands_done if fp8_workers.helpers() else 0
            assert np.abs(linear_fp8(x, w) - exact).max() <= 2e-6 * np.abs(exact).max(), name
            assert fp8_workers.helpers()[0].bands_done > before, name  # the helper made some of its rows
        assert not fp8_workers._broken
    finally:
        fp8_workers.stop_helpers()


def test_an_experts_origin_is_where_its_codes_lie_in_the_file(folders):
    source = Checkpoint(folders[0], load_config)
    for name in ("model.layers.2.mlp.experts.5.up_proj.weight", "model.layers.2.mlp.experts.5.gate_proj.weight",
                 "model.layers.1.mlp.experts.15.down_proj.weight"):
        w = source.matrix(name)
        with open(w.origin.path, "rb") as f:
            f.seek(w.origin.offset)
            stored = np.frombuffer(f.read(w.codes.size), np.uint8).reshape(w.shape)
        assert np.array_equal(stored, w.codes.view(np.uint8)), name
