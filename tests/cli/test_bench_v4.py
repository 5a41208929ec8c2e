"""`stepper bench --v4`'s layer scenario on tiny-v4 (the coordinator runs it at full size): the
layers-only checkpoint in the published layout, a decode step and a prefill through the model's
own layer with their parts timed, and the floor counted from the weights the layer decodes."""

import json

import pytest

from stepper.bench import v4_layer
from stepper.families.deepseek_v4_checkpoint import V4Checkpoint
from stepper.families.deepseek_v4_config import V4Config
from stepper.presets import V4_PRESETS
from stepper.weights.stored import Fp4Matrix, Fp8Matrix


@pytest.fixture(scope="module")
def tiny():
    return V4Config.from_hf(V4_PRESETS["tiny-v4"], "preset tiny-v4")


def test_the_layers_only_checkpoint_holds_those_layers_as_published(tiny, tmp_path):
    folder = v4_layer.ensure_layers(tmp_path, tiny, (3,))
    assert v4_layer.ensure_layers(tmp_path, tiny, (3,)) == folder  # written once, then reused
    names = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert names and all(name.startswith("layers.3.") for name in names)
    source = V4Checkpoint(folder)
    assert isinstance(source.matrix("model.layers.3.mlp.experts.0.gate_proj.weight"), Fp4Matrix)
    assert isinstance(source.matrix("model.layers.3.self_attn.q_a_proj.weight"), Fp8Matrix)


def test_a_decode_step_and_a_prefill_of_a_csa_layer_with_parts_and_floor(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(v4_layer, "rates", lambda: {"fp4": 1e9, "fp8": 2e9, "gemm": 1e11})
    folder = v4_layer.ensure_layers(tmp_path, tiny, (3,))
    [decode] = v4_layer.v4_layer_run(folder, 3, tokens=1, repeat=2)
    [prefill] = v4_layer.v4_layer_run(folder, 3, tokens=40, repeat=1)
    assert decode.name == f"tiny-v4 layer 3 (CSA): decode 1 token after {v4_layer.CONTEXT} positions"
    assert prefill.name == "tiny-v4 layer 3 (CSA): prefill 40 tokens"
    for figure in (decode, prefill):
        assert figure.value > 0 and figure.unit == "s" and figure.peak_rss_mb > 0
        assert "attention" in figure.note and "routed experts" in figure.note and "hc_pre" in figure.note
        assert "indexer (its compressor included)" in figure.note
        assert figure.floor > 0 and "every core at once" in figure.floor_note
    assert prefill.floor > decode.floor


def test_the_floor_counts_the_experts_the_tokens_choose(tiny):
    experts = 3 * tiny.moe_intermediate_size * tiny.hidden_size  # one expert's w1, w3 and w2
    n, k = tiny.n_routed_experts, tiny.num_experts_per_tok
    assert v4_layer.weights_used(tiny, 3, 1)["fp4"] == pytest.approx(k * experts)
    assert v4_layer.weights_used(tiny, 3, 10_000)["fp4"] == pytest.approx(n * experts)  # every expert chosen
    d, q, H, D, o = tiny.hidden_size, tiny.q_lora_rank, tiny.num_attention_heads, tiny.head_dim, tiny.o_lora_rank
    wo_a, wo_b = o * H * D, d * tiny.o_groups * o  # [Go*o_lora, H*D/Go], [d, Go*o_lora]
    attention = q * d + H * D * q + D * d + wo_a + wo_b + tiny.index_n_heads * tiny.index_head_dim * q
    shared = 3 * tiny.moe_intermediate_size * d
    assert v4_layer.weights_used(tiny, 3, 1)["fp8"] == attention + shared  # wq_a, wq_b, wkv, wo_a, wo_b, indexer wq_b


def test_the_floors_rates_are_every_cores_at_once(monkeypatch):
    runs = []

    def side_by_side(name, copies):
        runs.append((name, copies))
        return [v4_layer.Figure(name, 0.5, "G weights/s")] * copies

    monkeypatch.setattr(v4_layer, "side_by_side", side_by_side)
    monkeypatch.setattr(v4_layer, "gemm_rate", lambda: 3e10)
    cores = v4_layer.parallel.cores()
    assert v4_layer.rates() == {"fp4": 0.5e9 * cores, "fp8": 0.5e9 * cores, "gemm": 3e10}
    assert runs == [("fp4_rate", cores), ("fp8_rate", cores)]


def test_the_attention_core_counts_the_keys_each_query_sees(tiny):
    dims = tiny.dims(3)  # CSA: window 8, every 4 positions an entry, at most 4 of them kept
    assert (dims.sliding_window, dims.compress_ratio, dims.index_topk) == (8, 4, 4)
    by_hand = sum(min(p + 1, 8) + min((p + 1) // 4, 4) for p in range(40))
    assert v4_layer.keys_attended(dims, 40) == by_hand
    assert v4_layer.keys_attended(dims, 1) == 8 + 4  # the decode step after CONTEXT positions
    hca = tiny.dims(2)  # ratio 16, every closed entry seen
    assert v4_layer.keys_attended(hca, 40) == sum(min(p + 1, 8) + (p + 1) // 16 for p in range(40))
