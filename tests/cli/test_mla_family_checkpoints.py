"""Each MLA family's checkpoint as `stepper synth` writes it, in the family's published layout
(config.json field names, tensor names), read back by `stepper run` in both attention paths: the
same logits as the preset's synthetic weights it was written from, and a missing tensor refused
by its stored name."""

import json

import numpy as np
import pytest
from helpers.cli import one_line, stepper
from helpers.configs import family_preset
from helpers.resaved import saved_as_one_file, stored_tensors

from stepper.seams.trace import Recorder
from stepper.session import RunSpec, run

FAMILIES = ("tiny-sarvam", "tiny-youtu", "tiny-glm4-flash", "tiny-axk1", "tiny-mistral4")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    folder = tmp_path_factory.mktemp("published")
    for name in FAMILIES:
        out = stepper("synth", "--model", name, "--out", folder / name, "--seed", 5)
        assert out.returncode == 0, out.stderr
    return folder


def layout(folder) -> tuple[dict, set[str]]:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    return json.loads((folder / "config.json").read_text()), set(index["weight_map"])


def test_the_published_names(written):
    config, names = layout(written / "tiny-sarvam")
    assert config["num_experts"] == 16 and "n_routed_experts" not in config
    assert config["rope_scaling"]["type"] == "deepseek_yarn" and config["head_dim"] == 144
    assert "model.layers.1.mlp.experts.15.down_proj.weight" in names
    config, names = layout(written / "tiny-youtu")
    assert config["tie_word_embeddings"] is True and "lm_head.weight" not in names
    assert not any("experts" in n for n in names) and "model.layers.2.mlp.down_proj.weight" in names
    config, names = layout(written / "tiny-glm4-flash")
    assert config["mlp_layer_types"] == ["dense", "sparse", "sparse"] and config["partial_rotary_factor"] == 1.0
    config, names = layout(written / "tiny-axk1")
    assert {f"model.layers.{i}.post_mlp_layernorm.weight" for i in range(3)} <= names
    assert not any(n.endswith("e_score_correction_bias") for n in names)
    config, names = layout(written / "tiny-mistral4")
    assert config["rope_parameters"]["llama_4_scaling_beta"] == 0.1
    assert {"model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj"} <= names
    assert not any(".experts.0." in n for n in names)


def logits(model: str, attn: str) -> list[np.ndarray]:
    rec = Recorder()
    run(RunSpec(model=model, prompt_len=5, decode=1, attn=attn, seed=5), [rec])
    return [v for n, v in rec.tensors().items() if n.endswith(".logits") and ".layers." not in n]


@pytest.mark.parametrize("name", FAMILIES)
def test_the_checkpoint_runs_as_the_preset_it_was_written_from(written, name):
    for attn in ("naive", "absorb"):
        from_folder, from_preset = logits(str(written / name), attn), logits(name, attn)
        assert len(from_folder) == 2 and all(np.array_equal(a, b) for a, b in zip(from_folder, from_preset))
    out = stepper("run", "--model", written / name, "--decode", "1", "--only", "decode0.logits")
    assert out.returncode == 0 and "decode0.logits" in out.stdout, out.stderr
    inspected = stepper("inspect", written / name)  # every stored tensor one the config describes
    assert inspected.returncode == 0 and "problem" not in inspected.stdout, inspected.stdout[-500:]


def test_a_missing_fused_tensor_is_named(written, tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    for f in (written / "tiny-mistral4").iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    del index["weight_map"]["model.layers.2.mlp.experts.down_proj"]
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    out = stepper("run", "--model", folder)
    assert "'model.layers.2.mlp.experts.down_proj'" in one_line(out)


def test_fused_experts_are_written_in_bf16_or_fp8_with_one_scale_per_expert(tmp_path):
    out = stepper("synth", "--model", "tiny-mistral4", "--quant", "int4", "--out", tmp_path / "m4")
    assert "--quant int4" in one_line(out) and "BF16 or FP8 only" in out.stderr and not (tmp_path / "m4").exists()
    out = stepper("synth", "--model", "tiny-mistral4", "--quant", "fp8", "--out", tmp_path / "m4")
    assert out.returncode == 0, out.stderr
    quant = json.loads((tmp_path / "m4" / "config.json").read_text())["quantization_config"]
    assert quant["weight_block_size"] is None  # tests/reference/test_mistral4_fp8.py checks its values
    ran = stepper("run", "--model", tmp_path / "m4", "--decode", "1", "--only", "decode0.logits")
    assert ran.returncode == 0, ran.stderr


@pytest.mark.parametrize("name", ["tiny-youtu", "tiny-mistral4"])
def test_a_fixture_carries_the_familys_own_weights_layout(tmp_path, name):
    out = stepper("fixtures", "export", tmp_path / name, "--model", name, "--decode", "1")
    assert out.returncode == 0, out.stderr
    _, names = layout(tmp_path / name / "weights")
    if name == "tiny-youtu":
        assert "lm_head.weight" not in names
    else:
        assert "model.layers.1.mlp.experts.down_proj" in names
    ran = stepper("run", "--model", tmp_path / name / "weights", "--decode", "1", "--only", "decode0.logits")
    assert ran.returncode == 0, ran.stderr


def test_synth_writes_a_mistral3_wrappers_text_model_only_when_asked(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "mistral3", "text_config": family_preset("tiny-mistral4").to_hf()}))
    out = stepper("synth", "--model", config, "--out", tmp_path / "m4")
    assert "--layout hf" in one_line(out) and not (tmp_path / "m4").exists()
    assert stepper("synth", "--model", config, "--out", tmp_path / "m4", "--layout", "hf").returncode == 0
    assert json.loads((tmp_path / "m4" / "config.json").read_text())["model_type"] == "mistral4"


@pytest.mark.parametrize("name", ["tiny-mistral4", "tiny-youtu"])
def test_a_chunked_prefill_across_the_query_scale_boundary_equals_the_whole(name):
    """Each chunk scales its own positions' queries (Mistral 4) and zeroes the pad row (Youtu, whose
    pad token 999 is the third prompt token)."""
    def tensors(chunk: int) -> dict:
        rec = Recorder()
        run(RunSpec(model=name, ids=(5, 7, 999, 11) * 6, start_pos=4085, chunk=chunk, decode=1), [rec])
        return rec.tensors()
    whole, chunked = tensors(0), tensors(8)
    for key in ("prefill.logits", "decode0.logits", "prefill.layers.1.self_attn.query_states"):
        got, want = np.asarray(chunked[key]), np.asarray(whole[key])  # a chunked prefill's tensor is lazy
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), key


def as_transformers_holds_it(published, folder, fused: bool):
    """tiny-longcat's published checkpoint (8 routed experts one by one, 4 zero experts with no
    weights) as transformers' LongcatFlashExperts holds it: `fused`, state_dict()'s gate_up_proj
    [8 + 4, 2 x 96, 256] (the zero experts' slots zero: it never reads them) and down_proj
    [8, 256, 96]; else as its save_pretrained writes that, one by one again, with gate and up
    tensors for experts 8 to 11."""
    tensors = stored_tensors(published)
    for layer in range(2):
        p = f"model.layers.{layer}.mlp.experts."
        gate_up = [np.concatenate([tensors.pop(f"{p}{e}.gate_proj.weight"), tensors.pop(f"{p}{e}.up_proj.weight")])
                   for e in range(8)] + [np.zeros((192, 256), tensors[f"{p}0.down_proj.weight"].dtype)] * 4
        if fused:
            tensors[p + "gate_up_proj"] = np.stack(gate_up)
            tensors[p + "down_proj"] = np.stack([tensors.pop(f"{p}{e}.down_proj.weight") for e in range(8)])
        else:
            tensors.update({f"{p}{e}.{proj}.weight": half for e, pair in enumerate(gate_up)
                            for proj, half in zip(("gate_proj", "up_proj"), np.split(pair, 2))})
    return saved_as_one_file(published, folder, tensors)


def test_a_longcat_checkpoint_of_transformers_fused_experts_is_refused_in_one_line(tmp_path):
    """transformers' own layout of LongCat's experts, 12 gate_up slots for 8 routed experts and 4
    zero ones, is not the published checkpoint's: one line names the tensor, its shape and what a
    checkpoint holds instead, not 48 missing experts. What save_pretrained writes runs, as the
    published layout does (its zero experts' gate and up tensors are read by no run)."""
    published = tmp_path / "published"
    assert stepper("synth", "--model", "tiny-longcat", "--out", published, "--seed", 5).returncode == 0
    fused = as_transformers_holds_it(published, tmp_path / "fused", fused=True)
    assert one_line(stepper("run", "--model", fused)) == (
        f"stepper: error: {fused}: model.safetensors: 'model.layers.0.mlp.experts.gate_up_proj' [12, 192, 256] "
        "(1 more layer likewise) holds the experts fused, as transformers' model holds them in memory (its 12 slots: "
        "8 routed experts and 4 zero experts, which have no weights); a longcat_flash checkpoint stores each routed "
        "expert by itself ('model.layers.0.mlp.experts.0.gate_proj.weight' [96, 256], ...): transformers' "
        "save_pretrained writes them so")
    saved = as_transformers_holds_it(published, tmp_path / "saved", fused=False)
    for attn in ("naive", "absorb"):
        from_saved, from_published = logits(str(saved), attn), logits(str(published), attn)
        assert len(from_saved) == 2 and all(np.array_equal(a, b) for a, b in zip(from_saved, from_published))


def as_transformers_saves_axk1(published, folder, bias: float = 0.0, drop: tuple[str, ...] = (), **changed):
    """tiny-axk1's published checkpoint (a post_mlp_layernorm in every layer, no router bias) as
    transformers' save_pretrained writes A.X-K1: no post_mlp_layernorm in the dense layer 0, each MoE
    layer's router bias (its buffer, zeros; `bias` in layer 1's first value), one model.safetensors; the
    tensors `drop` left out, `changed` ones (name with __ for .) replaced."""
    tensors = stored_tensors(published)
    del tensors["model.layers.0.post_mlp_layernorm.weight"]
    for layer in (1, 2):
        tensors[f"model.layers.{layer}.mlp.gate.e_score_correction_bias"] = np.eye(1, 32, dtype=np.float32)[0] * (
            bias if layer == 1 else 0)
    tensors = {name: a for name, a in tensors.items() if name not in drop}
    tensors.update({name.replace("__", "."): a for name, a in changed.items()})
    return saved_as_one_file(published, folder, tensors)


def test_an_axk1_checkpoint_as_transformers_saves_it_runs_as_the_published_one(written, tmp_path):
    """The dense layer without the post_mlp_layernorm no run reads, the MoE layers with transformers'
    zero router bias: the published checkpoint's logits, bit for bit, with nothing to note; `inspect`
    finds nothing wrong in either layout (tests/reference/test_transformers_saved_checkpoints.py runs
    what transformers itself saves)."""
    saved = as_transformers_saves_axk1(written / "tiny-axk1", tmp_path / "saved")
    for attn in ("naive", "absorb"):
        from_saved, from_published = logits(str(saved), attn), logits(str(written / "tiny-axk1"), attn)
        assert len(from_saved) == 2 and all(np.array_equal(a, b) for a, b in zip(from_saved, from_published))
    out = stepper("run", "--model", saved, "--only", "logits", "--plain")
    assert out.returncode == 0 and "note" not in out.stdout + out.stderr, out.stdout[-500:] + out.stderr
    for folder, dense_norm in ((saved, False), (written / "tiny-axk1", True)):  # each tensor in its layer, unflagged
        inspected = stepper("inspect", folder, "--plain")
        assert inspected.returncode == 0 and "problem" not in inspected.stdout and "!" not in inspected.stdout
        layer0 = inspected.stdout.split("layer 0 (dense)")[1].split("layer 1 (MoE)")[0]
        assert ("post_mlp_layernorm.weight" in layer0) == dense_norm
        assert ("mlp.gate.e_score_correction_bias" in inspected.stdout) != dense_norm


@pytest.mark.parametrize("change, refusal", [
    ({"drop": ("model.layers.1.post_mlp_layernorm.weight",)},
     "'model.layers.1.post_mlp_layernorm.weight' is missing (expected shape [320])"),
    ({"bias": 0.5}, ("model.safetensors: 'model.layers.1.mlp.gate.e_score_correction_bias' holds 1 value(s) other "
                     "than zero: stepper's axk1 layer reads no such tensor, so it must hold zeros (as transformers "
                     "saves it) or be left out (as published)")),
    ({"model__layers__0__post_mlp_layernorm__weight": np.ones(32, np.float32)},
     "model.safetensors: 'model.layers.0.post_mlp_layernorm.weight' has shape [32], expected [320]"),
])
def test_an_axk1_checkpoint_stays_strict_in_either_layout(written, tmp_path, change, refusal):
    """A MoE layer without its norm, a router bias stepper would leave out of a sum transformers
    makes, a dense layer's unread norm of another shape: each refused in one line."""
    saved = as_transformers_saves_axk1(written / "tiny-axk1", tmp_path / "saved", **change)
    assert one_line(stepper("run", "--model", saved)) == f"stepper: error: {saved}: {refusal}"


def test_a_remote_axk1_checkpoint_is_listed_from_its_headers_and_a_run_refuses_its_nonzero_router_bias(written,
                                                                                                        tmp_path):
    """inspect of a remote checkpoint reads headers alone: a router bias that must hold zeros is read by
    a run (one range), which refuses it in one line, not by inspect (a request per MoE layer)."""
    from helpers.range_server import RangeServer

    (tmp_path / "served").mkdir()
    saved = as_transformers_saves_axk1(written / "tiny-axk1", tmp_path / "served" / "ck", bias=0.5)
    header = 8 + int.from_bytes((saved / "model.safetensors").read_bytes()[:8], "little")
    env = {"STEPPER_CACHE_DIR": str(tmp_path / "cache")}
    with RangeServer(tmp_path / "served") as server:
        listed = stepper("inspect", "--plain", f"{server.url}/ck/", env=env)
        assert listed.returncode == 0 and "listed from the headers alone" in listed.stdout, listed.stdout[-800:]
        assert "problem" not in listed.stdout
        assert server.sent == (saved / "config.json").stat().st_size + header  # no tensor's bytes
        refused = one_line(stepper("run", "--model", f"{server.url}/ck/", env=env))
    assert refused.endswith("model.safetensors: 'model.layers.1.mlp.gate.e_score_correction_bias' holds 1 value(s) "
                            "other than zero: stepper's axk1 layer reads no such tensor, so it must hold zeros (as "
                            "transformers saves it) or be left out (as published)")
