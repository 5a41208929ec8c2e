"""DeepSeek-V4's naming tables name what their sources have. transformers' table
(stepper/fixtures/naming/transformers-deepseek_v4.json) against the real DeepseekV4ForCausalLM of a
tiny config with sliding, CSA and HCA layers, hash- and score-routed: every name it gives is a
module of the model (its output, a tuple item or its input), every output and input that hooks on
every module see in a prefill and in decode steps is in the table, and no name is in it that the
hooks never see. DeepSeek's table (inference-v4.json) numbers each variable of a function in the
order of its lines, as the ordinal rule says."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from stepper.fixtures.aliases import TABLES

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

HF_TABLE = TABLES / "transformers-deepseek_v4.json"
DS_TABLE = TABLES / "inference-v4.json"
PROMPT = 19  # closes windows of both compressors (ratio 4 and 8) and leaves some open
LAYER = re.compile(r"\.layers\.\d+(?=$|[.:\[])")
PHASE = re.compile(r"^(prefill|decode\d+)\.")


def table_names(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["names"]


def pattern(name: str) -> str:
    """A dumped name as the table writes it: no phase, `{i}` for the layer."""
    return LAYER.sub(".layers.{i}", PHASE.sub("", name))


@pytest.fixture(scope="module")
def hooked():
    from helpers import hf_v4
    from helpers.hf_v4_hooks import hooked_dump

    model = hf_v4.random_model(hf_v4.TINY_V4, seed=3)
    prompt = [int(i) for i in np.random.default_rng(4).integers(0, hf_v4.TINY_V4["vocab_size"], PROMPT)]
    steps = [("prefill", prompt, range(PROMPT))] + [
        (f"decode{k}", [k + 5], [PROMPT + k]) for k in range(5)]  # position 23 closes a window of both
    return model, hooked_dump(model, steps)


def test_every_module_name_of_the_table_is_a_module_of_the_model(hooked):
    model, _ = hooked
    modules = {LAYER.sub(".layers.{i}", name) for name, _ in model.named_modules()}
    for entry in table_names(HF_TABLE):
        module = re.sub(r"(:input|\[\d\])$", "", entry["name"])
        assert module in modules, entry["name"]


def test_the_table_names_every_output_and_input_the_hooks_see_and_nothing_else(hooked):
    _, dump = hooked
    seen = {pattern(name) for name in dump}
    listed = {entry["name"] for entry in table_names(HF_TABLE)}
    assert seen - listed == set(), sorted(seen - listed)
    assert listed - seen == set(), sorted(listed - seen)


def test_each_tensor_entry_has_the_size_of_its_axes(hooked):
    """Where a name holds a fixture tensor, the dumped array has as many axes as the table says, and
    merged axes (`n*d`) have the product of their parts' sizes."""
    from helpers import hf_v4

    cfg = hf_v4.TINY_V4
    sizes = {"B": 1, "one": 1, "d": cfg["hidden_size"], "n": cfg["hc_mult"], "H": cfg["num_attention_heads"],
             "D": cfg["head_dim"], "q_lora": cfg["q_lora_rank"], "Hi": cfg["index_n_heads"],
             "Di": cfg["index_head_dim"], "Go": cfg["o_groups"], "o_lora": cfg["o_lora_rank"],
             "E": cfg["n_routed_experts"], "k": cfg["num_experts_per_tok"], "V": cfg["vocab_size"]}
    _, dump = hooked
    entries = {e["name"]: e for e in table_names(HF_TABLE) if "tensor" in e}
    checked = 0
    for name, array in dump.items():
        entry = entries.get(pattern(name))
        if entry is None:
            continue
        assert array.ndim == len(entry["axes"]), (name, array.shape, entry["axes"])
        for axis, size in zip(entry["axes"], array.shape, strict=True):
            parts = axis.split("*")
            if all(p in sizes for p in parts):
                assert size == int(np.prod([sizes[p] for p in parts])), (name, axis, array.shape)
        checked += 1
    assert checked > 300


def test_deepseek_names_are_numbered_in_the_order_of_their_lines():
    """Within one function (one prefix), a variable's n-th value comes on a line after its
    (n-1)-th; a value of one kind of step only follows the values of every step or of that kind."""
    last: dict[tuple[str, str | None], tuple[int, int]] = {}
    for entry in table_names(DS_TABLE):
        name, _, n = entry["name"].partition("#")
        if not n:
            continue
        step = entry.get("step")
        before = last.get((name, step)) or last.get((name, None))
        if before is None:
            assert int(n) == 1, entry["name"]
        elif int(n) != before[0]:  # (the same value again: a hash-routed and a score-routed layer's)
            assert int(n) == before[0] + 1 and entry["line"] >= before[1], entry["name"]
        last[(name, step)] = (int(n), entry["line"])
