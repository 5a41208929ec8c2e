"""Reading DeepSeek-V4's published layout (stepper.weights.published): names without `model.`, each
FP8 weight paired with its F8_E8M0 `.scale` and each FP4 (I8) expert with its scales across shards,
decoded exactly (against ml_dtypes); 5+5-digit shards with and without the index; `mtp.*` kept
apart; every grid, byte-shape and dtype problem one line naming the file, the tensor and what was
expected."""

import json
import re

import numpy as np
import pytest
from helpers.v4_published import CONFIG, stored_tensors, write_shards, write_tiny_v4

from stepper.errors import StepperError
from stepper.kernels import fp8_workers, parallel
from stepper.kernels.linear import linear, linears
from stepper.model.layer_weights import LayerWeights
from stepper.weights import deepseek_v4_names as v4
from stepper.weights.published import PublishedCheckpoint
from stepper.weights.stored import Bf16Matrix, Fp4Matrix, Fp8Matrix


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("v4") / "tiny-v4"
    values = write_tiny_v4(folder)
    return folder, values


def test_every_tensor_reads_as_its_exact_values(tiny):
    folder, values = tiny
    source = PublishedCheckpoint(folder)
    source.check(range(CONFIG["num_hidden_layers"]), with_globals=True)  # sound
    for name, expected in values.items():
        if name.startswith("mtp."):
            continue
        got = source.get(name)
        assert got.dtype == expected.dtype, name
        np.testing.assert_array_equal(got, expected, err_msg=name)
    assert len(values) > 100  # every layer's tensors, experts and compressors included


def test_matrices_pair_weights_with_their_scales(tiny):
    folder, values = tiny
    source = PublishedCheckpoint(folder)
    w = LayerWeights(source, 1)  # asks for model.layers.1.<name>: read without `model.`
    wq_a, w1, w3, wkv = (w.matrix(n) for n in ("attn.wq_a.weight", "ffn.experts.1.w1.weight", "ffn.experts.1.w3.weight",
                                               "attn.compressor.wkv.weight"))
    assert isinstance(wq_a, Fp8Matrix) and isinstance(w1, Fp4Matrix) and isinstance(wkv, Bf16Matrix)
    assert wq_a.origin is not None and w1.origin is not None  # the bytes are the file's, mapped
    x = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)
    np.testing.assert_allclose(linear(x, wq_a), x @ values["layers.1.attn.wq_a.weight"].T, rtol=1e-5, atol=1e-6)
    gate, up = linears(x, (w1, w3))
    np.testing.assert_allclose(gate, x @ values["layers.1.ffn.experts.1.w1.weight"].T, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(up, x @ values["layers.1.ffn.experts.1.w3.weight"].T, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(w.float32("ffn.experts.1.w2.weight"), values["layers.1.ffn.experts.1.w2.weight"])
    tid2eid = LayerWeights(source, 0)("ffn.gate.tid2eid")
    assert tid2eid.dtype == np.int64 and tid2eid.shape == (40, 2)
    np.testing.assert_array_equal(tid2eid, values["layers.0.ffn.gate.tid2eid"])


def test_mtp_block_is_kept_apart(tiny):
    folder, _ = tiny
    source = PublishedCheckpoint(folder)
    assert set(source.unused) == {"mtp.0.attn.wq_a.weight", "mtp.0.attn.wq_a.scale", "mtp.0.norm.weight"}
    assert not any(name.startswith("mtp.") for name in source.weight_map)
    assert source.present_layers() == [0, 1, 2]


def test_shards_without_an_index(tmp_path):
    stored, values = stored_tensors(CONFIG, 1)
    write_shards(tmp_path / "ok", stored, 4, index=False)
    source = PublishedCheckpoint(tmp_path / "ok")
    assert len(source.shards) == 4
    w2 = "layers.2.ffn.experts.0.w2.weight"
    np.testing.assert_array_equal(source.get(w2), values[w2])
    (tmp_path / "ok" / "model-00003-of-00004.safetensors").unlink()
    problem, *scales = PublishedCheckpoint(tmp_path / "ok").problems(range(3), True)
    assert scales and all(".scale' is missing: the " in p.text for p in scales)  # weights read, their scales not
    assert problem.file == "model-00003-of-00004.safetensors"
    assert problem.text.startswith("model-00003-of-00004.safetensors cannot be read (no such file), and with no "
                                   "model.safetensors.index.json nothing says what it holds: ")


def broken(tmp_path, name: str, array: np.ndarray) -> PublishedCheckpoint:
    write_tiny_v4(tmp_path / "bad", changed={name: array})
    return PublishedCheckpoint(tmp_path / "bad")


def test_a_scale_grid_of_the_wrong_shape(tmp_path):
    stored, _ = stored_tensors(CONFIG, 0)
    scale = stored["layers.1.ffn.experts.0.w1.scale"]  # [32, 2]
    source = broken(tmp_path, "layers.1.ffn.experts.0.w1.scale", scale[:, :1].copy())
    [problem] = source.problems([1], False)
    assert problem.file == source.weight_map["layers.1.ffn.experts.0.w1.scale"]
    assert problem.text == (f"{problem.file}: 'layers.1.ffn.experts.0.w1.scale' has shape [32, 1], expected [32, 2] "
                            "for the FP4 (I8) weight 'layers.1.ffn.experts.0.w1.weight' [32, 64] (one scale per row "
                            "and 32 inputs)")
    with pytest.raises(StepperError, match=r"'layers.1.ffn.experts.0.w1.scale' has shape \[32, 1\], expected \[32, 2"):
        source.matrix("layers.1.ffn.experts.0.w1.weight")


def test_fp4_bytes_of_the_wrong_shape(tmp_path):
    source = broken(tmp_path, "layers.2.ffn.experts.1.w2.weight", np.zeros((64, 8), np.int8))
    [problem] = source.problems([2], False)
    assert problem.tensor == "layers.2.ffn.experts.1.w2.weight" and problem.file.startswith("model-000")
    assert problem.text.endswith("'layers.2.ffn.experts.1.w2.weight' holds FP4 bytes of shape [64, 8], expected "
                                 "[64, 16] "
                                 "(two codes a byte) for the [64, 32] weight config.json gives")


def test_a_scale_of_the_wrong_dtype(tmp_path):
    source = broken(tmp_path, "layers.0.attn.wq_b.scale", np.ones((1, 1), np.float32))
    [problem] = source.problems([0], False)
    assert problem.text.endswith("'layers.0.attn.wq_b.scale' has dtype F32, expected F8_E8M0 (2^(byte - 127)) for the "
                                 "F8_E4M3 weight 'layers.0.attn.wq_b.weight'")
    with pytest.raises(StepperError, match="has dtype F32, expected F8_E8M0"):
        source.matrix("layers.0.attn.wq_b.weight")


def test_a_nan_scale_is_refused_when_read(tmp_path):
    stored, _ = stored_tensors(CONFIG, 0)
    scale = stored["layers.1.ffn.experts.0.w2.scale"].copy()
    scale.view(np.uint8)[3, 0] = 0xFF
    source = broken(tmp_path, "layers.1.ffn.experts.0.w2.scale", scale)
    with pytest.raises(StepperError, match=r"'layers.1.ffn.experts.0.w2.scale' holds 1 scale\(s\) that are not finite"):
        source.get("layers.1.ffn.experts.0.w2.weight")


def test_scales_are_checked_once_per_checkpoint(tiny, monkeypatch):
    from stepper.weights import checkpoint as reader

    calls, check = [], reader.check_scale_values
    monkeypatch.setattr(reader, "check_scale_values", lambda *a: calls.append(a[1]) or check(*a))
    folder, values = tiny
    source = PublishedCheckpoint(folder)
    for name in ("layers.1.ffn.experts.0.w2.weight", "layers.1.attn.wq_a.weight"):
        first, again = source.matrix(name), source.matrix(name)  # an expert's weights: each time it runs
        np.testing.assert_array_equal(again.dequantize(), values[name])
        np.testing.assert_array_equal(first.dequantize(), values[name])
    assert calls == ["layers.1.ffn.experts.0.w2.scale", "layers.1.attn.wq_a.scale"]
    PublishedCheckpoint(folder).matrix("layers.1.attn.wq_a.weight")  # another reader checks them itself
    assert calls[-1] == "layers.1.attn.wq_a.scale" and len(calls) == 3


def test_missing_tensors_and_scales_all_listed(tmp_path):
    stored, _ = stored_tensors(CONFIG, 0)
    del stored["layers.1.attn.indexer.compressor.wgate.weight"], stored["layers.2.attn.wo_b.scale"]
    write_shards(tmp_path / "holes", stored, 2)
    source = PublishedCheckpoint(tmp_path / "holes")
    texts = [p.text for p in source.problems(range(3), True)]
    assert texts == [
        "'layers.1.attn.indexer.compressor.wgate.weight' is missing (expected BF16, F16 or F32, shape [32, 64])",
        ("'layers.2.attn.wo_b.scale' is missing: the F8_E4M3 weight 'layers.2.attn.wo_b.weight' "
         f"({source.weight_map['layers.2.attn.wo_b.weight']}) needs its F8_E8M0 scales [1, 1]"),
    ]
    with pytest.raises(StepperError, match="2 problems with the weights of this run"):
        source.check(range(3), True)


def test_layer_kinds_decide_the_tensors():
    sliding, csa, hca = (v4.layer_tensors(CONFIG, n) for n in (0, 1, 2))
    assert not any("compressor" in n or "indexer" in n for n in sliding)
    assert csa["attn.compressor.ape"].shape == (4, 64) and csa["attn.indexer.compressor.ape"].shape == (4, 32)
    assert hca["attn.compressor.ape"].shape == (128, 32) and not any("indexer" in n for n in hca)
    assert "ffn.gate.tid2eid" in sliding and "ffn.gate.bias" in csa and "ffn.gate.tid2eid" not in csa
    with pytest.raises(StepperError, match="config.json: field 'hc_mult' is missing"):
        v4.layer_tensors({**CONFIG, "hc_mult": None}, 0)


def test_tensors_are_stored_as_published(tiny):
    folder, _ = tiny
    source = PublishedCheckpoint(folder)
    dtype = {name: source.shard_of(name).info(name).dtype for name in source.weight_map}
    expected = {
        "layers.1.attn.attn_sink": "F32", "layers.1.attn.compressor.ape": "F32", "layers.1.hc_attn_fn": "F32",
        "layers.1.ffn.gate.bias": "F32", "hc_head_scale": "F32", "layers.0.ffn.gate.tid2eid": "I64",
        "layers.1.attn.compressor.wkv.weight": "BF16", "layers.1.attn.indexer.weights_proj.weight": "BF16",
        "layers.1.ffn.gate.weight": "BF16", "embed.weight": "BF16", "layers.1.attn.q_norm.weight": "BF16",
        "layers.1.attn.wq_a.weight": "F8_E4M3", "layers.1.attn.wq_a.scale": "F8_E8M0",
        "layers.1.attn.indexer.wq_b.weight": "F8_E4M3", "layers.1.ffn.shared_experts.w2.weight": "F8_E4M3",
        "layers.1.ffn.experts.1.w2.weight": "I8", "layers.1.ffn.experts.1.w2.scale": "F8_E8M0",
    }
    assert {name: dtype[name] for name in expected} == expected
    weight, scale = "layers.1.ffn.experts.1.w2.weight", "layers.1.ffn.experts.1.w2.scale"
    assert source.shard_of(weight).info(weight).shape == (64, 16)
    assert source.shard_of(scale).info(scale).shape == (64, 1)


def test_fp8_e8m0_weights_shared_with_the_helper_processes(tiny, monkeypatch):
    if parallel.cores() < 2:
        pytest.skip("helpers need two cores")
    folder, values = tiny
    monkeypatch.setattr(fp8_workers, "SHARE_WORK", 0)  # every product with a file behind it goes to the helpers
    fp8_workers.stop_helpers()
    try:
        w = PublishedCheckpoint(folder).matrix("layers.2.attn.wq_b.weight")  # the codes mapped from the file
        x = np.random.default_rng(3).standard_normal((6, 32)).astype(np.float32)
        y = linear(x, w)
        assert not fp8_workers._broken and fp8_workers.helpers()[0].bands_done >= 1
        exact = x.astype(np.float64) @ values["layers.2.attn.wq_b.weight"].astype(np.float64).T
        assert np.abs(y - exact).max() <= 2e-6 * np.abs(exact).max()
    finally:
        fp8_workers.stop_helpers()


def test_hostile_tensors_and_config_fields_are_one_line(tmp_path):
    stored, _ = stored_tensors(CONFIG, 0)
    stored["layers.1.attn.odd.weight"] = np.zeros(6, np.int8)  # an I8 weight no config names, 1-D
    stored["layers.1.attn.odd.scale"] = np.ones(1, np.float32)
    write_shards(tmp_path / "odd", stored, 2)
    source = PublishedCheckpoint(tmp_path / "odd")
    with pytest.raises(StepperError, match=r"'layers.1.attn.odd.weight' is an FP4 \(I8\) weight of shape \[6\], "
                                           "expected 2-D"):
        source.matrix("layers.1.attn.odd.weight")
    for field, value, expected in [("hidden_size", "64", "field 'hidden_size' is '64', expected a whole number"),
                                   ("compress_ratios", [0, 4], "'compress_ratios' has 2 entries, none for layer 2"),
                                   ("compress_ratios", [0, 4, "x"],
                                    "field 'compress_ratios' is [0, 4, 'x'], expected a whole number for layer 2")]:
        (tmp_path / "odd" / "config.json").write_text(json.dumps({**CONFIG, field: value}))
        with pytest.raises(StepperError, match=re.escape(expected)):
            PublishedCheckpoint(tmp_path / "odd").problems(range(3), True)


def test_shard_names_that_do_not_add_up(tmp_path):
    stored, _ = stored_tensors(CONFIG, 2)
    write_shards(tmp_path / "a", stored, 2, index=False)
    (tmp_path / "a" / "model-00001-of-00002.safetensors").rename(tmp_path / "a" / "model-00003-of-00002.safetensors")
    with pytest.raises(StepperError, match="model-00003-of-00002.safetensors is not numbered 00001 to 00002"):
        PublishedCheckpoint(tmp_path / "a")
    (tmp_path / "a" / "model-00003-of-00002.safetensors").rename(tmp_path / "a" / "model-00001-of-00003.safetensors")
    with pytest.raises(StepperError, match=r"shards of different counts \(00002, 00003\)"):
        PublishedCheckpoint(tmp_path / "a")
    for shard in (tmp_path / "a").glob("*.safetensors"):
        shard.unlink()
    with pytest.raises(StepperError, match="nor shards model-NNNNN-of-MMMMM.safetensors found"):
        PublishedCheckpoint(tmp_path / "a")


def test_a_float_tensor_of_the_wrong_shape_is_refused_when_read(tmp_path):
    source = broken(tmp_path, "layers.1.attn.q_norm.weight", np.ones(31, np.float32))
    with pytest.raises(StepperError, match=r"'layers.1.attn.q_norm.weight' has shape \[31\], expected \[32\]"):
        LayerWeights(source, 1)("attn.q_norm.weight")
