"""DeepSeek-V4's memory estimate: its catalogue's runtime dims (window keys, compressed entries, the
keys each query sees, windows closed) get their sizes from the layer's kind and the step
(families.deepseek_v4_family.runtime_sizes), so a long prompt is estimated by what its tensors hold
and one that cannot fit is refused in one line before it starts."""

import numpy as np
import pytest
from typer.testing import CliRunner

from stepper import planning
from stepper.cli.main import app
from stepper.kernels.linear import linear
from stepper.model.compressed_attention import gather
from stepper.model.sparse_indexer import index_scores
from stepper.planning import memory
from stepper.session import RunSpec

GIB = 2**30


def recorded(spec: RunSpec) -> tuple[planning.RunPlan, dict[str, int]]:
    """The run planned, and the bytes each tensor it emits holds."""
    planned = planning.plan_run(spec)
    held: dict[str, int] = {}
    planned.execute([lambda event: held.__setitem__(event.name, int(event.array.nbytes))])
    return planned, held


@pytest.mark.parametrize("model, layer, kind", [("tiny-v4", 0, "sliding"), ("tiny-v4", 1, "csa"),
                                                ("tiny-v4", 2, "hca"), ("tiny-v4-indexer", 1, "csa")])
def test_each_tensor_is_estimated_at_the_bytes_it_holds_in_prefill_and_decode(model, layer, kind):
    planned, held = recorded(RunSpec(model=model, layer=layer, prompt_len=37, decode=2))
    assert planned.plan.config.layer_kind(layer) == kind
    estimated = {name: size for name, _, size in memory.sizes(planned.plan, planned.names)}
    assert estimated == held  # every name, entries and picks past a window's end and int64 picks included


def test_one_layers_tensors_are_estimated_within_twice_what_the_run_holds():
    planned, held = recorded(RunSpec(model="tiny-v4-indexer", layer=1, prompt_len=41, decode=1))
    per_step = max(sum(n for name, n in held.items() if name.startswith(phase)) for phase in ("prefill.", "decode0."))
    assert per_step <= memory.layer_bytes(planned.plan, [1]) <= 2 * per_step


def test_a_flash_csa_layer_is_estimated_from_its_window_and_top_k():
    plan = planning.plan_run(RunSpec(model="deepseek-v4-flash", layer=2, prompt_len=8192)).plan
    cfg = plan.config  # sliding_window 128, index_topk 512, head_dim 512, 64 heads, ratio 4
    assert (cfg.sliding_window, cfg.index_topk, cfg.head_dim, cfg.num_attention_heads) == (128, 512, 512, 64)
    sizes = {name: (shape, n) for name, shape, n in memory.sizes(plan, [f"layers.2.attn.{k}" for k in (
        "entry_keys", "scores", "indexer.scores", "entries", "window", "compressor.entries", "compressor.slot_gate")])}
    assert sizes["layers.2.attn.entry_keys"] == ("[1, 8192, 512, 512]", 4 * 8192 * 512 * 512)  # 8 GiB: top-k per query
    assert sizes["layers.2.attn.scores"][0] == "[1, 64, 8192, 641]"  # window, top-k entries, sink
    assert sizes["layers.2.attn.indexer.scores"][0] == "[1, 8192, 2048]"  # one per closed window of 4
    assert sizes["layers.2.attn.entries"][0] == "[1, 2048, 512]"
    assert sizes["layers.2.attn.window"][0] == "[1, 8192, 512]"
    assert sizes["layers.2.attn.compressor.slot_gate"][0] == "[1, 2048, 8, 512]"  # 2m overlapping slots
    total = sum(n.bytes for n in memory.needs(plan, [], "--prompt-len"))
    assert 18 * GIB < total < 21 * GIB  # /usr/bin/time -v measured a 19.1 GB peak for this run


def test_an_hca_layer_attends_its_window_and_every_entry_in_a_decode_step():
    plan = planning.plan_run(RunSpec(model="deepseek-v4-flash", layer=3, prompt_len=4096, decode=1)).plan
    names = ["decode0.layers.3.attn.scores", "decode0.layers.3.attn.compressor.slot_gate",
             "prefill.layers.3.attn.compressor.slot_gate"]
    shapes = [shape for _, shape, _ in memory.sizes(plan, names)]
    # S = 4097 positions: 32 entries of 128; the decode step closes no window, the prefill 32 of 128 slots
    assert shapes == ["[1, 64, 1, 161]", "[1, 0, 128, 512]", "[1, 32, 128, 512]"]


def test_a_flash_prompt_that_cannot_fit_is_refused_in_one_line_before_it_starts():
    result = CliRunner().invoke(app, ["run", "--model", "deepseek-v4-flash", "--layer", "2", "--prompt-len", "16384",
                                      "--only", "layers.2.ffn_output", "--plain"])  # 16 GiB room: tests/conftest.py
    assert result.exit_code == 2
    assert result.output.count("\n") == 1
    assert result.output.startswith("stepper: error: this run would need about 38.4 GiB of memory (38.3 GiB for "
                                    "one layer's tensors) and 16.0 GiB is available; lower it with --prompt-len")


def test_the_gathered_entries_and_index_scores_made_in_place_are_bit_identical_to_the_formula():
    rng = np.random.default_rng(3)
    entries = rng.standard_normal((2, 9, 16)).astype(np.float32)  # [B, Ec, D]
    chosen = rng.integers(-1, 9, size=(2, 5, 4))  # [B, T, Kq], -1: none
    picked = entries[np.arange(2)[:, None, None], np.maximum(chosen, 0)]
    expected = np.where((chosen >= 0)[..., None], picked, np.float32(0))
    assert np.array_equal(gather(entries, chosen), expected) and (gather(entries, chosen)[chosen < 0] == 0).all()

    q = rng.standard_normal((2, 3, 5, 8)).astype(np.float32)  # [B, Hi, T, Di]
    keys = rng.standard_normal((2, 7, 8)).astype(np.float32)  # [B, Ec, Di]
    head_weights = rng.standard_normal((2, 5, 3)).astype(np.float32)  # [B, T, Hi]
    dots = np.stack([linear(q.reshape(2, 15, 8)[b], keys[b]) for b in range(2)]).reshape(2, 3, 5, 7)
    per_head = np.maximum(dots, 0) * np.float32(8**-0.5)  # [B, Hi, T, Ec]
    expected = np.matmul(head_weights[:, :, None, :], per_head.transpose(0, 2, 1, 3))[:, :, 0]  # [B, T, Ec]
    mine = index_scores(q, keys, head_weights, 8)
    assert mine.dtype == np.float32 and np.array_equal(mine.view(np.uint32), expected.view(np.uint32))
