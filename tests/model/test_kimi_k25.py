"""Kimi K2.5's vision-language wrapper: the config's text_config is the model, the text tensors
are stored under `language_model.`, and the vision tower's and projector's tensors are listed by
inspect but never read by a run."""

import copy
import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers.cli import stepper

from stepper.config import Config, Wrapper, Yarn
from stepper.errors import StepperError
from stepper.presets import PRESETS, preset
from stepper.seams.trace import Recorder
from stepper.session import RunSpec, run
from stepper.weights.checkpoint import Checkpoint
from stepper.weights.safetensors_reader import SafetensorsFile
from stepper.weights.safetensors_writer import Entry, write_safetensors
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.synth_checkpoint import synth_checkpoint

K25_EXTRA = {  # the fields of Kimi-K2.5's config.json beside text_config, as published
    "architectures": ["KimiK25ForConditionalGeneration"],
    "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config"},
    "bos_token_id": 163584, "eos_token_id": 163585, "pad_token_id": 163839, "ignore_index": -100,
    "media_placeholder_token_id": 163605, "use_unified_vision_chunk": True,
    "video_placeholder": "<|kimi_k25_video_placeholder|>", "tie_word_embeddings": False,
    "vision_config": {"vt_hidden_size": 1152, "vt_num_hidden_layers": 27, "patch_size": 14},
    "transformers_version": "5.7.0", "dtype": "bfloat16",
}
K25_ROPE = {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0, "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096, "rope_theta": 50000.0, "rope_type": "yarn", "type": "yarn"}


def k25_raw(**text_fields) -> dict:
    text = {**copy.deepcopy(PRESETS["kimi-k2"]), "model_type": "deepseek_v3", "rope_parameters": K25_ROPE,
            "max_position_embeddings": 262144, "_name_or_path": ""}
    text.pop("rope_scaling", None)
    text.pop("quantization_config", None)
    text.update(text_fields)
    return {**copy.deepcopy(K25_EXTRA), "model_type": "kimi_k25", "text_config": text}


# ---------------------------------------------------------------------------------------------
# The config


def test_the_text_config_is_the_model_with_k25s_yarn():
    cfg = Config.from_hf(k25_raw(), "k25/config.json")
    assert cfg.model_type == "deepseek_v3" and cfg.hidden_size == 7168 and cfg.n_routed_experts == 384
    assert cfg.rope_scaling == Yarn(factor=64.0, original_max_position_embeddings=4096, beta_fast=32.0, beta_slow=1.0,
                                    mscale=1.0, mscale_all_dim=1.0)
    assert cfg.rope_theta == 50000.0 and cfg.max_position_embeddings == 262144
    assert cfg.name == "k25" and cfg.quantization is None
    assert cfg.wrapper.model_type == "kimi_k25"
    assert set(cfg.wrapper.unused_fields) == {"bos_token_id", "eos_token_id", "pad_token_id", "ignore_index",
                                              "media_placeholder_token_id", "use_unified_vision_chunk",
                                              "video_placeholder", "vision_config"}
    assert "vision_config" in cfg.wrapper.describe() and "language_model." in cfg.wrapper.describe()


def test_the_wrappers_quantization_config_reaches_the_text_model():
    fp8 = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
    assert Config.from_hf({**k25_raw(), "quantization_config": fp8}).quantization is not None
    both = {**k25_raw(quantization_config={**fp8, "weight_block_size": [64, 64]}), "quantization_config": fp8}
    with pytest.raises(StepperError, match="quantization_config' differs from text_config"):
        Config.from_hf(both)


@pytest.mark.parametrize("change, message", [
    ({"text_config": None}, "field 'text_config' must be an object"),
    ({"text_config": [1]}, "field 'text_config' must be an object"),
    ({"tie_word_embeddings": True}, "field 'tie_word_embeddings' must be false"),
])
def test_a_bad_wrapper_is_refused_naming_the_field(change, message):
    with pytest.raises(StepperError, match=message):
        Config.from_hf({**k25_raw(), **change}, "k25/config.json")


def test_a_bad_text_config_is_refused_naming_where():
    with pytest.raises(StepperError, match=r"k25/config.json: text_config: field 'hidden_size' is null"):
        Config.from_hf(k25_raw(hidden_size=None), "k25/config.json")
    with pytest.raises(StepperError, match="text_config.model_type' must be one of"):
        Config.from_hf(k25_raw(model_type="kimi_k25"), "k25/config.json")


# ---------------------------------------------------------------------------------------------
# The checkpoint


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> tuple[Path, Path]:
    """The same synthetic weights in the plain layout and in Kimi K2.5's."""
    root = tmp_path_factory.mktemp("k25")
    plain = synth_checkpoint(SyntheticWeights(preset("tiny"), seed=3), root / "plain")
    wrapped = replace(preset("tiny"), wrapper=Wrapper("kimi_k25"))
    return plain, synth_checkpoint(SyntheticWeights(wrapped, seed=3), root / "k25")


def test_synth_writes_kimi_k25s_layout(dirs):
    _, k25 = dirs
    raw = json.loads((k25 / "config.json").read_text())
    assert raw["model_type"] == "kimi_k25" and raw["text_config"]["model_type"] == "kimi_k2" and "vision_config" in raw
    names = json.loads((k25 / "model.safetensors.index.json").read_text())["weight_map"]
    assert "language_model.model.layers.1.self_attn.kv_a_proj_with_mqa.weight_scale_inv" in names
    assert "language_model.lm_head.weight" in names and "language_model.model.embed_tokens.weight" in names
    assert not any(n.startswith(("model.", "lm_head")) for n in names)
    vision = [n for n in names if n.startswith(("vision_tower.", "mm_projector."))]
    assert "vision_tower.encoder.blocks.1.wqkv.weight" in vision and "mm_projector.proj.2.weight" in vision
    ck = Checkpoint(k25)
    assert set(ck.unused) == set(vision)
    assert (ck.has("model.layers.1.mlp.experts.3.up_proj.weight")
            and not ck.has("vision_tower.encoder.blocks.1.wqkv.weight"))
    with pytest.raises(StepperError, match="no tensor named 'vision_tower.encoder.blocks.1.wqkv.weight'"):
        ck.get("vision_tower.encoder.blocks.1.wqkv.weight")


def tensors_of(spec: RunSpec) -> dict[str, np.ndarray]:
    rec = Recorder()
    run(spec, [rec])
    return rec.tensors()


@pytest.mark.parametrize("spec", [
    RunSpec(layer=0, prompt_len=4, start_pos=4100), RunSpec(layer=1, prompt_len=4, decode=1),
    RunSpec(layer=2, prompt_len=3), RunSpec(prompt_len=5, start_pos=5000, decode=2),
], ids=["layer0", "layer1-decode", "layer2", "model-decode"])
def test_a_k25_checkpoint_runs_as_the_same_weights_in_plain_layout(dirs, spec):
    plain, k25 = (tensors_of(replace(spec, model=str(d))) for d in dirs)
    assert plain.keys() == k25.keys() and len(plain) > 30
    for name in plain:
        np.testing.assert_array_equal(k25[name], plain[name], err_msg=name)


def test_a_run_reads_no_vision_or_projector_bytes(dirs, monkeypatch):
    _, k25 = dirs
    read: list[str] = []
    real_get = SafetensorsFile.get

    def counted(self, name):
        read.append(name)
        return real_get(self, name)

    monkeypatch.setattr(SafetensorsFile, "get", counted)
    ck = Checkpoint(k25)
    run(RunSpec(model=str(k25), prompt_len=4, decode=1), [Recorder()], ck)
    assert "model.layers.1.self_attn.kv_b_proj.weight" in read and "lm_head.weight" in read  # reads are counted
    assert not [n for n in read if n.startswith(("vision_tower.", "mm_projector."))]
    vision_shard = ck.shards[next(iter(ck.unused.values()))]
    assert vision_shard._map is None  # its file was never even mapped
    assert {ck.unused[n] for n in ck.unused} == {vision_shard.path.name}


def test_names_that_meet_after_the_prefix_is_dropped_are_refused(dirs, tmp_path):
    _, k25 = dirs
    copy_dir = tmp_path / "twice"
    copy_dir.mkdir()
    for f in k25.iterdir():
        (copy_dir / f.name).write_bytes(f.read_bytes())
    index = json.loads((copy_dir / "model.safetensors.index.json").read_text())
    # a second copy of the norm under its plain name, in a file of its own
    write_safetensors(copy_dir / "model-extra.safetensors",
                      [Entry("model.norm.weight", "F32", (320,), lambda: np.ones(320, np.float32))])
    index["weight_map"]["model.norm.weight"] = "model-extra.safetensors"
    (copy_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(StepperError,
                       match="tensors '.*norm.weight' and '.*norm.weight' both stand for 'model.norm.weight'"):
        Checkpoint(copy_dir)


def test_inspect_lists_the_vision_tensors_as_not_used(dirs):
    _, k25 = dirs
    out = stepper("inspect", str(k25), "--plain")
    assert out.returncode == 0, out.stderr
    assert "kimi_k25 wrapper: text tensors stored under language_model., listed without it; 31 tensors" in out.stdout
    section = out.stdout.split("not used (the wrapper's vision tower, projector)")[1]
    assert "vision_tower.encoder.blocks.{0..1}.wqkv.weight" in section and "mm_projector.proj.0.weight" in section
    assert "layer 1 (MoE)" in out.stdout and "lm_head.weight" in out.stdout
    lines = [json.loads(line) for line in stepper("inspect", str(k25), "--json").stdout.splitlines()]
    vision = [r for r in lines if r.get("name", "").startswith("vision_tower.")]
    assert len(vision) == 28 and {r["group"] for r in vision} == {"not used (the wrapper's vision tower, projector)"}


def test_the_run_header_shows_the_wrapper_once(dirs):
    _, k25 = dirs
    out = stepper("run", "--model", str(k25), "--plain", "--prompt-len", "2", "--only", "*logits")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("kimi_k25 wrapper: the text model of its text_config") == 1
    assert "not used: vision_config, media_placeholder_token_id" in out.stdout


def broken_copy(k25: Path, tmp_path: Path, break_it) -> Path:
    folder = tmp_path / "broken"
    shutil.copytree(k25, folder)
    break_it(folder)
    return folder


def index_edit(change):
    def edit(folder: Path) -> None:
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        change(index["weight_map"])
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return edit


LAYER1_SHARD, LAST_SHARD = "model-00003-of-00006.safetensors", "model-00005-of-00006.safetensors"
NORM_ON_DISK = "language_model.model.norm.weight"


def truncated(folder: Path) -> None:
    (folder / LAYER1_SHARD).write_bytes((folder / LAYER1_SHARD).read_bytes()[:1000])


def last_shard_gone(folder: Path) -> None:
    (folder / LAST_SHARD).unlink()
    index_edit(lambda m: [m.pop(n) for n in [n for n, shard in m.items() if shard == LAST_SHARD]])(folder)


UNREADABLE = (f"{LAYER1_SHARD} cannot be read (header length 28608 runs past the end of the file (1000 bytes)); it "
              "holds 110 tensors of the layers checked, first 'language_model.model.layers.1.input_layernorm.weight'")
WRONG_SHARD = (f"{LAYER1_SHARD}: '{NORM_ON_DISK}' is listed in model.safetensors.index.json but not in this shard; it "
               f"is in {LAST_SHARD}")


@pytest.mark.parametrize("break_it, line", [
    (truncated, UNREADABLE),
    (index_edit(lambda m: m.__setitem__(NORM_ON_DISK, LAYER1_SHARD)), WRONG_SHARD),
    (last_shard_gone, f"'{NORM_ON_DISK}' is missing (expected shape [320])"),
], ids=["unreadable-shard", "wrong-shard", "missing"])
def test_every_refusal_names_the_tensor_as_it_is_on_disk(dirs, tmp_path, break_it, line):
    """The text tensors are read by the text model's names (`language_model.` dropped), but a refusal names them
    as the files do, a name found in the index and the shards (it named 'model.layers.1.input_layernorm.weight',
    which no file holds)."""
    folder = broken_copy(dirs[1], tmp_path, break_it)
    ran = stepper("run", "--plain", "--model", folder, "--prompt-len", "2")
    assert ran.returncode == 2 and ran.stdout == ""
    refused = [one.removeprefix("  - ") for one in ran.stderr.removeprefix(f"stepper: error: {folder}: ").splitlines()]
    assert line in refused
    assert not re.search(r"'(model|lm_head)\.", ran.stderr)  # nor a tensor by its name in stepper alone
    inspected = stepper("inspect", "--plain", folder)
    assert inspected.returncode == 1 and f"  ! {line}" in inspected.stdout.splitlines()
    assert not re.search(r"'(model|lm_head)\.", inspected.stdout)
    problems = json.loads(stepper("inspect", "--json", folder).stdout.splitlines()[-1])["problems"]
    assert line in [p["problem"] for p in problems]


def test_a_read_refused_names_the_tensor_as_it_is_on_disk(dirs, tmp_path):
    folder = broken_copy(dirs[1], tmp_path, truncated)
    with pytest.raises(StepperError, match=r"; it holds 'language_model\.model\.layers\.1\.input_layernorm\.weight'$"):
        Checkpoint(folder).get("model.layers.1.input_layernorm.weight")
    with pytest.raises(StepperError, match="no tensor named 'language_model.model.layers.7.input_layernorm.weight'"):
        Checkpoint(folder).stored("model.layers.7.input_layernorm.weight")
