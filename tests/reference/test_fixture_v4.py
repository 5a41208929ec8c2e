"""The shipped DeepSeek-V4 fixture (fixtures/tiny-v4-windows: tiny-v4, a prompt that closes several
windows of both compressors, two decode steps, the first closing a window of each) against
transformers' own DeepseekV4ForCausalLM: the model gets the fixture's weights exactly dequantized, a
hook on every module dumps each output and input under transformers' names, and `stepper fixtures
verify` places every one of them (the naming table, stepper/fixtures/naming/transformers-deepseek_v4.json)
with no divergence in the prefill and in both decode steps; a perturbed tensor is named as the first
divergence under its canonical name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from stepper.families.deepseek_v4_checkpoint import V4Checkpoint
from stepper.families.deepseek_v4_weights import weight_shapes
from stepper.fixtures import verify
from stepper.fixtures.fixture import load
from stepper.fixtures.show import summary_line

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "fixtures" / "tiny-v4-windows"


@pytest.fixture(scope="module")
def fixture():
    return load(FIXTURE)


@pytest.fixture(scope="module")
def dump(fixture):
    """transformers' run on the fixture's weights and inputs, every module hooked."""
    from helpers import hf_v4
    from helpers.hf_v4_hooks import hooked_dump

    published = json.loads((fixture.weights_path() / "config.json").read_text())
    checkpoint = V4Checkpoint(fixture.weights_path())
    model = hf_v4.random_model(published)
    hf_v4.load_arrays(model, {name: np.array(checkpoint.get(name)) for name in weight_shapes(checkpoint.config)},
                      published)
    steps = [(s["phase"], s["ids"], s["positions"]) for s in fixture.manifest["inputs"]["steps"]]
    return hooked_dump(model, steps)


def written(dump: dict[str, np.ndarray], path: Path) -> Path:
    save_file({k: np.ascontiguousarray(v) for k, v in dump.items()}, str(path))
    return path


def test_the_fixture_closes_windows_in_the_prefill_and_in_a_decode_step(fixture):
    t = fixture.tensors
    assert t["prefill.layers.1.attn.compressor.entries"].shape[1] >= 3  # CSA, ratio 4
    assert t["prefill.layers.2.attn.compressor.entries"].shape[1] >= 3  # HCA
    assert t["decode0.layers.1.attn.compressor.entries"].shape[1] == 1
    assert t["decode0.layers.2.attn.compressor.entries"].shape[1] == 1
    assert "decode1.layers.1.attn.compressor.entries" not in t or t[
        "decode1.layers.1.attn.compressor.entries"].shape[1] == 0


def test_a_transformers_dump_of_every_module_verifies(fixture, dump, tmp_path):
    verdict = verify.verify(fixture, written(dump, tmp_path / "hf.safetensors"), names="transformers")
    assert verdict.count("mismatch") == 0, summary_line(verdict)
    assert verdict.unknown == [] and not verdict.ambiguous, verdict.unknown[:5]
    matched = {c.key for c in verdict.checks if c.status == "match"}
    assert {"streams", "hc_attn.comb", "attn.q", "attn.kv", "attn.compressor.kv", "attn.compressor.pooled",
            "attn.entries", "attn.indexer.compressor.pooled", "attn.indexer.q", "attn.indexer.scores",
            "attn.indexer.chosen", "attn.o_groups", "attn_output", "ffn.gate.hash_idx", "ffn.gate.topk_idx",
            "ffn.gate.weights", "ffn.routed_output", "ffn.shared_output", "ffn_streams", "hc_head.collapsed",
            "final_norm", "logits"} <= matched
    phases = {c.name.split(".", 1)[0] for c in verdict.checks if c.status == "match"}
    assert phases == {"prefill", "decode0", "decode1"}
    assert verdict.count("match") >= 400, summary_line(verdict)
    why = verdict.unplaced["prefill.model.layers.1.self_attn.compressor.kv_norm"]
    assert "before their RoPE" in why


@pytest.mark.parametrize(("module", "canonical"), [
    ("decode0.model.layers.2.self_attn.compressor.kv_norm:input", "decode0.layers.2.attn.compressor.pooled"),
    ("prefill.model.layers.1.self_attn.compressor.indexer.scorer:input", "prefill.layers.1.attn.indexer.q"),
])
def test_a_perturbed_tensor_is_the_first_divergence(fixture, dump, tmp_path, module, canonical):
    bad = dict(dump)
    bad[module] = bad[module] + np.float32(0.01) * (np.abs(bad[module]).max() + 1)
    verdict = verify.verify(fixture, written(bad, tmp_path / "bad.safetensors"), names="transformers")
    assert verdict.count("mismatch") >= 1 and verdict.first["name"] == canonical, summary_line(verdict)


# ---------------------------------------------------------------------------------------------
# DeepSeek's inference/model.py names: a dump laid out as its table says, from the fixture's tensors


def laid_out(ref: np.ndarray, dims: list[str], axes: list[str], positions: str) -> np.ndarray | None:
    """The fixture tensor `ref` (catalogue dims) as DeepSeek's code lays it out (`axes`, a merged
    axis `a*b`; `N` for B*T rows; positions `last`: the last position only); None when the
    table's axes are not the reference's in another order (a size-1 axis may be added or dropped)."""
    if positions == "last":
        ref, dims = ref[:, -1], [d for d in dims if d != "T"]
    if dims[:2] == ["B", "T"] and axes[:1] == ["N"]:
        ref, dims = ref.reshape(-1, *ref.shape[2:]), ["N", *dims[2:]]
    atoms = [a for axis in axes for a in axis.split("*")]
    extra = [a for a in atoms if a not in dims]
    if any(a not in ("one", "Wc") for a in extra) or any(d not in atoms and ref.shape[dims.index(d)] != 1
                                                          for d in dims):
        return None
    kept = [d for d in dims if d in atoms]
    ref = ref.reshape([n for d, n in zip(dims, ref.shape, strict=True) if d in atoms])
    order = [kept.index(a) for a in atoms if a in kept]
    if len(set(order)) != len(order):  # an axis twice (comb [B, T, n, n]): already in order
        order = list(range(len(kept)))
    ref = ref.transpose(order)
    sizes = iter(ref.shape)
    shape = [1 if a in extra else next(sizes) for a in atoms]
    ref = ref.reshape(shape)
    merged = []
    i = 0
    for axis in axes:
        n = len(axis.split("*"))
        merged.append(int(np.prod(shape[i:i + n])))
        i += n
    return ref.reshape(merged)


def test_a_dump_named_as_deepseeks_code_names_it_verifies(fixture, tmp_path):
    from stepper.fixtures.aliases import tables

    steps = {s["phase"]: len(s["ids"]) for s in fixture.manifest["inputs"]["steps"]}
    last = fixture.config.num_hidden_layers - 1
    dump = {}
    for alias in tables()["inference"]:
        if alias.tensor is None or "deepseek_v4" not in alias.model_types:
            continue
        for phase, tokens in steps.items():
            if alias.step and alias.step != ("prefill" if tokens > 1 else "decode"):
                continue
            layers = [last] if alias.layer == "last" else range(fixture.config.num_hidden_layers) \
                if "{i}" in alias.name else [None]
            for layer in layers:
                name = f"{phase}.{f'layers.{layer}.' if layer is not None else ''}{alias.tensor}"
                if name not in fixture.tensors or fixture.tensors[name].size == 0:
                    continue  # (a step that closes no window: DeepSeek's compressor returns before it)
                entry = next(e for e in fixture.entries if e["name"] == name)
                layout = alias.layouts[0]
                array = laid_out(fixture.tensors[name], entry["dims"], list(layout.axes), layout.positions)
                if array is not None:
                    dump[f"{phase}.{alias.name.replace('{i}', str(layer))}"] = array
    verdict = verify.verify(fixture, written(dump, tmp_path / "ds.safetensors"), names="inference")
    assert verdict.count("mismatch") == 0, summary_line(verdict)
    assert verdict.unknown == [] and not verdict.ambiguous, verdict.unknown[:5]
    assert verdict.count("match") >= 300, summary_line(verdict)
