"""The V4 attention's catalogue part (stepper/catalog/v4/v4_attention.json): every tensor the
attention emits on a sliding, a CSA and an HCA layer has one entry whose dims match the emitted
rank, and nothing else has one; every dimension symbol is defined; every citation names the
installed transformers file's own line (its text, with its symbol on it)."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import transformers

from stepper import catalog, session
from stepper.model.compressed_attention import attention, weight_shapes
from stepper.model.layer_weights import LayerWeights
from stepper.seams.trace import Emitter, Recorder
from tests.helpers.hf_v4_attention import tiny_config
from tests.helpers.v4_layers import Arrays, dims_of


def part() -> dict:
    return json.loads(resources.files("stepper.catalog").joinpath("v4/v4_attention.json").read_text("utf-8"))


def emitted() -> dict[str, np.ndarray]:
    """Every tensor of a 20-token prompt on each kind of layer (random weights of the right shapes)."""
    config = tiny_config()
    rng = np.random.default_rng(0)
    shown: dict[str, np.ndarray] = {}
    for layer in range(3):
        dims = dims_of(config, layer)
        arrays = {f"model.layers.{layer}.{n}": rng.standard_normal(s).astype(np.float32) for n, s in
                  weight_shapes(dims).items()}
        rec = Recorder()
        attention(rng.standard_normal((1, 20, config.hidden_size)).astype(np.float32),
                  LayerWeights(Arrays(arrays), layer), dims, None, Emitter([rec]))
        shown |= rec.tensors()
    return shown


def test_every_emitted_tensor_has_one_entry():
    entries = part()["tensors"]
    names = [e["name"] for e in entries]
    assert len(names) == len(set(names))
    shown = emitted()
    assert set(shown) == set(names)
    by_name = {e["name"]: e for e in entries}
    for name, array in shown.items():
        assert len(by_name[name]["dims"]) == array.ndim, name
        assert by_name[name]["dtype"] == str(array.dtype), name
        entry = by_name[name]
        assert 0 < len(entry["description"]) <= 100 and entry["formula"] and entry["explain"], name
        assert set(entry["reference"]) == {"variable", "modeling_deepseek.py", "transformers", "inference"}, name
        assert set(entry["aliases"]) == {"hf_module", "inference", "llama.cpp"}, name
        assert entry["block"] == "compressed_attention", name
        assert set(by_name[name]) - {"inputs"} == {"name", "scope", "block", "dims", "dtype", "description", "formula",
                                                   "explain", "reference", "aliases"}, name


def test_dims_are_defined():
    folders = [resources.files("stepper.catalog").joinpath(name) for name in ("parts", "v4")]
    others = [json.loads(f.read_text("utf-8")) for parts in folders for f in parts.iterdir() if f.name.endswith(".json")
              and f.name != "v4_attention.json"]
    main = {symbol: size for other in others for symbol, size in other.get("dims", {}).items()}
    own = part()["dims"]
    shared = set(own) & set(main)  # Hi, Di: V3.2's indexer's, defined here too (V4's catalogue has not that part)
    assert all(own[s] == main[s] for s in shared), "a part's symbol would mean something else than another's"
    v4 = catalog.around(session.preset_config("tiny-v4")).raw["dims"]
    for entry in part()["tensors"]:
        assert set(entry["dims"]) <= set(v4), entry["name"]


@pytest.mark.skipif(transformers.__version__ != "5.24.0", reason="citations are of transformers 5.24.0")
def test_citations_are_the_installed_lines():
    for entry in part()["tensors"]:
        cited = entry["reference"]["transformers"]
        lines = (Path(transformers.__file__).parent / cited["path"]).read_text().split("\n")
        first, last = cited["lines"]
        assert first <= last and lines[first - 1] == cited["text"], entry["name"]
        assert cited["symbol"] in cited["text"], entry["name"]
