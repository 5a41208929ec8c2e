"""KDA's catalogue part (stepper/catalog/parts/kda.json): one entry for each tensor a KDA layer
emits (either form), whose dims name the emitted shape for a config, and whose transformers
citations are the installed transformers' own lines."""

import json
import os
from importlib import resources

import numpy as np
import pytest
import transformers

from stepper.model.cache import KdaCache
from stepper.model.kda import kda_attention
from stepper.model.options import LayerOptions
from stepper.seams.trace import Emitter, Recorder
from tests.helpers.kimi_linear import config, layer_weights

PARTS = resources.files("stepper.catalog").joinpath("parts")
PART = json.loads(PARTS.joinpath("kda.json").read_text(encoding="utf-8"))
MAIN = {"dims": {}, "tensors": []}  # every other part's entries and dims
for other in PARTS.iterdir():
    if other.name.endswith(".json") and other.name != "kda.json":
        raw = json.loads(other.read_text(encoding="utf-8"))
        MAIN["dims"].update(raw.get("dims", {}))
        MAIN["tensors"] += raw["tensors"]
SHARED = {"self_attn.attn_output", "self_attn.o_proj"}  # emitted by KDA and MLA alike: MLA's part's entries


def emitted(form: str) -> dict[str, np.ndarray]:
    cfg = config()
    recorder = Recorder()
    x = np.ones((1, 70, cfg.hidden_size), np.float32)
    kda_attention(x, layer_weights(cfg), KdaCache(), LayerOptions(delta_rule=form), Emitter([recorder]))
    return recorder.tensors()


def test_every_emitted_tensor_has_one_entry_and_every_entry_is_emitted():
    names = [e["name"] for e in PART["tensors"]]
    assert len(names) == len(set(names))
    both = {**emitted("recurrent"), **emitted("chunked")}
    assert set(both) - SHARED == set(names)
    assert SHARED <= {e["name"] for e in MAIN["tensors"]}
    assert not set(names) & {e["name"] for e in MAIN["tensors"]}


def test_dims_name_the_emitted_shapes():
    cfg = config()
    dims = {**MAIN["dims"], **PART["dims"]}
    assert not set(PART["dims"]) & set(MAIN["dims"])
    sizes = {"B": 1, "T": 70, "chunks": 2}  # the run's: one prompt of 70 tokens, two chunks
    tensors = {**emitted("recurrent"), **emitted("chunked")}
    for entry in PART["tensors"]:
        shape = tensors[entry["name"]].shape
        expected = [sizes[s] if dims[s]["size"] == "runtime" else size(dims[s]["size"], cfg) for s in entry["dims"]]
        assert list(shape) == expected, entry["name"]


def size(expression: str, cfg) -> int:
    """'linear_num_heads * linear_head_dim' for a config: products of its fields."""
    if " - " in expression:
        field, minus = expression.split(" - ")
        return getattr(cfg, field) - int(minus)
    return int(np.prod([getattr(cfg, factor.strip()) for factor in expression.split("*")]))


@pytest.mark.skipif(transformers.__version__ != "5.24.0", reason="the citations are of transformers 5.24.0")
def test_citations_are_the_installed_transformers_lines():
    root = os.path.dirname(transformers.__file__)
    for entry in PART["tensors"]:
        cite = entry["reference"]["transformers"]
        with open(os.path.join(root, cite["path"]), encoding="utf-8") as f:
            lines = f.read().splitlines()
        first, last = cite["lines"]
        assert first <= last <= len(lines)
        assert lines[first - 1] == cite["text"], entry["name"]
        assert cite["symbol"] in cite["text"], entry["name"]
