"""An axis label states its own layer's facts: a DeepSeek-V4 compressor's window slots and channels
are 2m and 2 x entry dims on a CSA layer (m = 4, overlapping windows) and m and the entry dims on
an HCA layer (m = 16 in tiny-v4), in `stepper tree`, `run`'s tables and --json, `explain` and the
debugger; LongCat-Flash's router's 12 experts are 8 + 4 zero experts. Every preset's every layer
is walked: each number a label's parentheses state is checked against the size it labels and the
layer's compress ratio."""

from __future__ import annotations

import json
import re

import pytest
from helpers.cli import stepper
from helpers.terminal import on_terminal

from stepper import catalog, session
from stepper.presets import PRESETS, V4_PRESETS

HCA, CSA = 2, 1  # tiny-v4's layers: 0 sliding, 1 and 3 CSA (m = 4), 2 HCA (m = 16)
BINDING = re.compile(r"\b([a-z]\w*) = (\d+)")  # 'm = 16'


def layer_facts(cfg, layer: int) -> dict[str, int]:
    """The values a label may state by name on this layer, 'm = 16': its compress ratio."""
    ratio = cfg.compress_ratio(layer) if hasattr(cfg, "compress_ratio") else 0
    return {"m": ratio} if ratio else {}


def stated_problems(label: str, size: int, facts: dict[str, int]) -> list[str]:
    """What a label's parentheses state that is not so: a binding ('m = 4') that is not the layer's,
    or a product ('2m', '2 x 32 entry dims'; its bindings alone when it has none) that is not the size."""
    problems = []
    for fact in re.findall(r"\(([^()]*)\)", label):
        bound = {name: int(value) for name, value in BINDING.findall(fact)}
        problems += [f"{label}: {name} = {value}, the layer's is {facts.get(name)}"
                     for name, value in bound.items() if facts.get(name) != value]
        terms = [part for part in BINDING.sub("", fact).split(",") if part.strip()]
        for term in terms or [f"{name}" for name in bound]:
            total = sum(product(part, bound, facts) for part in term.split("+"))
            if total != size:
                problems.append(f"{label}: '{term.strip()}' is {total}, the axis {size}")
    return problems


def product(term: str, bound: dict[str, int], facts: dict[str, int]) -> int:
    """A term's numbers and named values multiplied: '2 x 32 entry dims' is 64, '2m' at m = 4 is 8."""
    value = 1
    for factor in re.findall(r"\d+|[a-z]\w*", term):
        value *= int(factor) if factor.isdigit() else bound.get(factor, facts.get(factor, 1))
    return value


def test_the_check_finds_a_label_of_another_layer():
    assert stated_problems("window slots (m, 2m at m = 4)", 16, {"m": 16}) != []  # the CSA label on an HCA layer
    assert stated_problems("compressor channels (2 x entry dims at m = 4)", 32, {"m": 16}) != []
    assert stated_problems("window slots (2m, m = 4)", 8, {"m": 4}) == []
    assert stated_problems("window slots (m = 16)", 16, {"m": 16}) == []
    assert stated_problems("compressor channels (32 entry dims, m = 16)", 32, {"m": 16}) == []
    assert stated_problems("compressor channels (2 x 32 entry dims, m = 4)", 64, {"m": 4}) == []
    assert stated_problems("compressor channels (2 x 32 entry dims, m = 4)", 32, {"m": 4}) != []
    assert stated_problems("routed experts (8 + 4 zero experts)", 12, {}) == []  # LongCat's router
    assert stated_problems("routed experts (8 + 4 zero experts)", 8, {}) != []


@pytest.mark.parametrize("preset", (*PRESETS, *V4_PRESETS))
def test_every_label_of_every_layer_states_that_layers_own_numbers(preset):
    cfg = session.preset_config(preset)
    cat = catalog.around(cfg)
    problems, stated = [], 0
    for layer in range(cfg.num_hidden_layers):
        for attn in ("naive", "absorb"):
            for entry in cat.layer_sequence(cfg, layer, attn):
                for symbol in entry["dims"]:
                    label, size = cat.label(symbol, cfg, layer), cat.expected_size(symbol, cfg, layer)
                    if "(" in label:
                        assert size is not None, f"{preset} layer {layer}: {label} states what sets no size"
                        stated += 1
                        problems += [f"{preset} layer {layer} {entry['name']}: {p}"
                                     for p in stated_problems(label, size, layer_facts(cfg, layer))]
    assert problems == []
    # V4's compressors' axes say what sets them, and LongCat's router's its zero experts
    assert (stated > 0) == (preset in V4_PRESETS or "longcat" in preset)


def test_tree_labels_an_hca_layers_compressor_by_its_own_ratio():
    out = stepper("tree", "--model", "tiny-v4", "--layer", str(HCA), "--plain").stdout
    assert "attn.compressor.slot_gate  [B, Wc, 16 window slots (m = 16), 32 head dims]" in out
    assert "attn.compressor.kv  [B, T, 32 compressor channels (32 entry dims, m = 16)]" in out
    assert "m = 4" not in out and "2m" not in out
    csa = stepper("tree", "--model", "tiny-v4", "--layer", str(CSA), "--plain").stdout
    assert "attn.compressor.slot_gate  [B, Wc, 8 window slots (2m, m = 4), 32 head dims]" in csa
    assert "attn.compressor.kv  [B, T, 64 compressor channels (2 x 32 entry dims, m = 4)]" in csa
    assert "attn.indexer.compressor.slot_gate  [B, Wc, 8 window slots (2m, m = 4), 16 index head dims]" in csa


def test_a_runs_table_and_json_label_each_layers_slots_by_its_ratio():
    screen = on_terminal("run", "--model", "tiny-v4", "--prompt-len", "40", "--only", "*compressor.slot_gate",
                         columns=160)
    assert screen.code == 0, screen.text
    shapes = {line.split()[0]: line.split("  ")[1] for line in screen.lines if ".slot_gate  [" in line}
    assert shapes == {
        "layers.1.attn.compressor.slot_gate": "[B=1 batch, Wc=10 windows closed this step, slots=8 window slots "
                                              "(2m, m = 4), 32 head dims]",
        "layers.1.attn.indexer.compressor.slot_gate": "[B=1 batch, Wc=10 windows closed this step, slots=8 window "
                                                      "slots (2m, m = 4), 16 index head dims]",
        "layers.2.attn.compressor.slot_gate": "[B=1 batch, Wc=2 windows closed this step, slots=16 window slots "
                                              "(m = 16), 32 head dims]",
        "layers.3.attn.compressor.slot_gate": "[B=1 batch, Wc=10 windows closed this step, slots=8 window slots "
                                              "(2m, m = 4), 32 head dims]",
        "layers.3.attn.indexer.compressor.slot_gate": "[B=1 batch, Wc=10 windows closed this step, slots=8 window "
                                                      "slots (2m, m = 4), 16 index head dims]"}
    lines = stepper("run", "--model", "tiny-v4", "--prompt-len", "40", "--only", "*.attn.compressor.kv",
                    "--json").stdout.splitlines()
    records = {r["name"]: r for r in map(json.loads, lines)}
    assert [d["label"] for d in records["layers.2.attn.compressor.kv"]["dims"]] == [
        "batch", "positions", "compressor channels (32 entry dims, m = 16)"]
    assert records["layers.1.attn.compressor.kv"]["named_shape"] == (
        "[B=1 batch, T=40 positions, c=64 compressor channels (2 x 32 entry dims, m = 4)]")


def test_explain_gives_the_named_layers_facts_or_each_kinds():
    def shape(query: str) -> str:
        out = stepper("explain", query, "--model", "tiny-v4", "--plain").stdout
        return next(line for line in out.splitlines() if line.startswith("shape"))

    assert shape(f"layers.{HCA}.attn.compressor.slot_gate") == (
        "shape   [B (batch), Wc (windows closed this step), slots (window slots = 16: m = 16), D (head dims = 32)]")
    assert shape(f"layers.{CSA}.attn.compressor.kv") == (
        "shape   [B (batch), T (positions), c (compressor channels = 64: 2 x 32 entry dims, m = 4)]")
    assert shape("attn.compressor.slot_gate") == (
        "shape   [B (batch), Wc (windows closed this step), slots (window slots: 2m, m = 4 in CSA layers; m = 16 in "
        "HCA layers), D (head dims = 32)]")


def test_the_debugger_labels_a_tensor_of_an_hca_layer_by_its_ratio():
    screen = on_terminal("step", "--model", "tiny-v4", "--prompt-len", "40", columns=160,
                         typed=[f"u layers.{HCA}.attn.compressor.slot_gate", "q"])
    assert screen.code == 0, screen.text
    shown = [line for line in screen.lines if line.startswith(f"layers.{HCA}.attn.compressor.slot_gate  [")]
    assert shown and "slots=16 window slots (m = 16), 32 head dims]" in shown[-1], screen.text


def test_longcat_s_router_says_which_of_its_experts_are_zero_experts():
    """tiny-longcat's config has 8 routed experts and 4 zero experts, and its router scores all 12:
    an axis of '12 routed experts' alone contradicts the config a learner reads."""
    tree = stepper("tree", "--model", "tiny-longcat", "--layer", "1", "--plain")
    assert "mlp.gate.logits  [N, 12 routed experts (8 + 4 zero experts)]" in tree.stdout
    plain = stepper("tree", "--model", "tiny-v3", "--layer", "1", "--plain")
    assert "mlp.gate.logits  [N, 32 routed experts]" in plain.stdout
