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


def decode_and_prefill(tiny, tmp_path, monkeypatch, layer: int, kind: str, repeat: int):
    """The bench's two figures of one tiny-v4 layer written as a checkpoint, named as it names them."""
    monkeypatch.setattr(v4_layer, "rates", lambda: {"fp4": 1e9, "fp8": 2e9, "gemm": 1e11})
    folder = v4_layer.ensure_layers(tmp_path, tiny, (layer,))
    [decode] = v4_layer.v4_layer_run(folder, layer, tokens=1, repeat=repeat)
    [prefill] = v4_layer.v4_layer_run(folder, layer, tokens=40, repeat=1)
    assert decode.name == f"tiny-v4 layer {layer} ({kind}): decode 1 token after {v4_layer.CONTEXT} positions"
    assert prefill.name == f"tiny-v4 layer {layer} ({kind}): prefill 40 tokens"
    return decode, prefill


def test_a_decode_step_and_a_prefill_of_a_csa_layer_with_parts_and_floor(tiny, tmp_path, monkeypatch):
    decode, prefill = decode_and_prefill(tiny, tmp_path, monkeypatch, 3, "CSA", repeat=2)
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


def test_a_decode_step_and_a_prefill_of_an_hca_layer_with_its_own_floor(tiny, tmp_path, monkeypatch):
    assert tiny.dims(2).compress_ratio == 16 and not tiny.dims(2).has_indexer  # tiny-v4's HCA layer
    decode, prefill = decode_and_prefill(tiny, tmp_path, monkeypatch, 2, "HCA", repeat=1)
    for figure in (decode, prefill):
        assert "compressor" in figure.note and "routed experts" in figure.note and "indexer" not in figure.note
    assert decode.floor == pytest.approx(v4_layer.layer_floor(tiny, 2, 1, v4_layer.rates())[0])
    assert prefill.floor == pytest.approx(v4_layer.layer_floor(tiny, 2, 40, v4_layer.rates())[0])


def test_the_hca_floor_counts_no_indexer_and_every_closed_entry(tiny):
    d, q, H, D, o = tiny.hidden_size, tiny.q_lora_rank, tiny.num_attention_heads, tiny.head_dim, tiny.o_lora_rank
    attention = q * d + H * D * q + D * d + o * H * D + d * tiny.o_groups * o  # wq_a, wq_b, wkv, wo_a, wo_b
    shared = 3 * tiny.moe_intermediate_size * d
    expert = 3 * tiny.moe_intermediate_size * d
    used = v4_layer.weights_used(tiny, 2, 1)
    assert used["fp8"] == attention + shared  # no indexer's wq_b
    assert used["fp4"] == pytest.approx(tiny.num_experts_per_tok * expert)
    compressor, gate = 2 * D * d, tiny.n_routed_experts * d  # wkv, wgate [D, d] (BF16); the router [n, d]
    k_of_n = tiny.num_experts_per_tok / tiny.n_routed_experts
    assert used["flops"] == pytest.approx(2 * (attention + shared + compressor + gate + k_of_n * 16 * expert))
    keys = 8 + (v4_layer.CONTEXT + 1) // 16  # the window and every closed entry of ratio 16
    assert v4_layer.keys_attended(tiny.dims(2), 1) == keys
    rates = {"fp4": 1e9, "fp8": 2e9, "gemm": 1e11}
    floor, how = v4_layer.layer_floor(tiny, 2, 1, rates)  # a floor from given rates, not a time measured
    by_hand = used["fp4"] / 1e9 + used["fp8"] / 2e9 + (used["flops"] + 4 * H * D * keys) / 1e11
    assert floor == pytest.approx(by_hand) and "FP4 weights" in how


def test_bench_v4_hca_adds_the_hca_layer(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(v4_layer, "ensure_layers", lambda workdir, cfg, layers: tmp_path / f"L{layers[0]}")
    monkeypatch.setattr(v4_layer, "forget_page_cache", lambda folder: None)
    monkeypatch.setattr(v4_layer, "in_subprocess", lambda name, **kw: calls.append((name, kw)) or [])
    said = []
    v4_layer.v4_figures(tmp_path, said.append, hca=True)
    layers = [(kw["layer"], kw["tokens"]) for name, kw in calls if name == "v4_layer"]
    assert layers == [(4, 1), (4, 512), (3, 1), (3, 512)] and calls[-1][0] == "v4_long"
    assert any("layer 3 (HCA)" in line and "3.6 GB" in line for line in said)
    assert v4_layer.flash_config().dims(3).compress_ratio == 128 and not v4_layer.flash_config().dims(3).has_indexer
    calls.clear()
    v4_layer.v4_figures(tmp_path, said.append)
    assert [kw["layer"] for name, kw in calls if name == "v4_layer"] == [4, 4]


def test_the_command_line_takes_v4_hca_and_says_what_it_costs(tmp_path, monkeypatch):
    from helpers.cli import stepper

    asked = []
    monkeypatch.setattr(v4_layer, "v4_figures", lambda workdir, say, hca=False: asked.append(hca) or [])
    for args, hca in ((["--v4"], False), (["--v4", "--v4-hca"], True), (["--v4-hca"], True)):
        done = stepper("bench", *args, "--workdir", tmp_path / "bench", "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["figures"] == [] and asked.pop() is hca
    helped = " ".join(stepper("bench", "--help", env={"COLUMNS": "200"}).stdout.split())
    assert "--v4-hca" in helped and "HCA layer 3" in helped and "about 3.6 GB more written once" in helped
