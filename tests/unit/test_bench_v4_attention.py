"""The V4 long-context decode bench, on a tiny CSA layer: it seeds the cache, steps, and reports
the bytes the cache holds as the cost formula counts them."""

from dataclasses import replace

from stepper.bench.v4_attention import FLASH_CSA, long_decode
from stepper.model.v4_attention_cache import values_per_position


def test_tiny_long_decode_figures():
    tiny = replace(FLASH_CSA, hidden_size=32, num_heads=4, head_dim=16, rope_dim=8, q_lora_rank=24, o_groups=2,
                   o_lora_rank=12, sliding_window=8, index_n_heads=4, index_head_dim=8, index_topk=3)
    seed, step, held, gemm = long_decode(context=4096, steps=2, dims=tiny)
    assert "4,096 positions" in step.name and step.value > 0 and step.peak_rss_mb > 0
    entries = 4096 * values_per_position(tiny)  # 1,024 entries of 16 (the layer's) and of 8 (the indexer's)
    window = 7 * 16  # sliding_window - 1 tokens
    pending = 2 * 2 * (2 * 16 + 2 * 8)  # the two steps' tokens (kv and gate, 2 x entry dims each) wait
    overlap = 2 * 4 * (16 + 8)  # the last closed window's first halves, kv and gate
    assert held.value * 2**20 == 4 * (entries + window + pending + overlap)
    assert "CSA" in held.note and gemm.unit == "GFLOP/s" and gemm.value > 0 and seed.unit == "s"
