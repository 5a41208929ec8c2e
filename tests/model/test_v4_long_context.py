"""A decode step over a 1,048,576-position context on a CSA layer (and on an HCA layer), from a
seeded cache (stepper.model.v4_synthetic_cache): its output equals transformers'
DeepseekV4Attention run on ITS cache filled with the same state, the cache holds what the cost
formula says (window + pending bounded, entries width/m a position), and the step's largest
tensors grow with the entries (Ec), not with the positions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.cache_utils import DynamicCache

from stepper.model.compressed_attention import attention
from stepper.model.layer_weights import LayerWeights
from stepper.model.v4_attention_cache import bounded_values, values_per_position
from stepper.model.v4_synthetic_cache import seeded_cache
from stepper.seams.trace import Emitter, Recorder
from tests.helpers.compare import rel_err
from tests.helpers.hf_v4_attention import build, tiny_config
from tests.helpers.v4_layers import Arrays, dims_of

CONTEXT = 1 << 20


def filled_reference_cache(config, layer: int, cache) -> DynamicCache:
    """transformers' cache with stepper's seeded state in layer `layer` (names of DeepseekV4CSACache)."""
    ref = DynamicCache(config=config)
    held = ref.layers[layer]
    window = torch.from_numpy(cache.window)[:, None]  # [1, one, W - 1, D]
    held.lazy_initialization(window, window)
    held.keys = held.values = window
    held.cumulative_length = cache.seen
    for name, state in (("compressor", cache.compressor), ("indexer", cache.indexer)):
        if state is None:
            continue
        held.buffer_kv[name], held.buffer_gate[name] = torch.from_numpy(state.kv), torch.from_numpy(state.gate)
        held.compressed_kv[name] = torch.from_numpy(state.entries)
        held.entry_count[name] = state.entries.shape[1]
        if state.overlap_kv is not None:
            held.overlap_kv[name] = torch.from_numpy(state.overlap_kv)
            held.overlap_gate[name] = torch.from_numpy(state.overlap_gate)
    return ref


@pytest.mark.parametrize(("layer", "context"), [(1, CONTEXT), (1, CONTEXT + 3), (2, CONTEXT + 127)])
def test_decode_over_a_million_positions(layer, context):
    config = tiny_config(max_position_embeddings=2 * CONTEXT)
    model = build(config, seed=2)
    arrays = {"model." + k: v.detach().numpy() for k, v in model.named_parameters()}
    dims = dims_of(config, layer)
    w = LayerWeights(Arrays(arrays), layer)
    rng = np.random.default_rng(5)
    sample = rng.standard_normal((1, 16, config.hidden_size)).astype(np.float32)
    cache = seeded_cache(sample, w, dims, context, seed=0)

    entries = context // dims.compress_ratio
    pending = context % dims.compress_ratio
    assert cache.seen == context and cache.compressor.entries.shape[1] == entries
    D, Di, m = dims.head_dim, dims.index_head_dim, dims.compress_ratio
    window = (dims.sliding_window - 1) * D
    if dims.has_indexer:  # entries, pending kv and gate (2 x width channels each), the overlap halves
        held = entries * (D + Di) + pending * 2 * (2 * D + 2 * Di) + 2 * m * (D + Di)
    else:
        held = entries * D + pending * 2 * D
    assert cache.nbytes() == 4 * (window + held)
    assert entries * m * values_per_position(dims) == entries * (D + Di if dims.has_indexer else D)
    assert window + held - entries * m * values_per_position(dims) <= bounded_values(dims)

    x = rng.standard_normal((1, 1, config.hidden_size)).astype(np.float32)
    reference_cache = filled_reference_cache(config, layer, cache)
    rec = Recorder()
    mine = attention(x, w, dims, cache, Emitter([rec]))
    shown = rec.tensors()
    largest = max(shown, key=lambda name: shown[name].size)
    assert largest == "attn.entries" and shown[largest].shape == (1, (context + 1) // m, D)

    positions = torch.tensor([[context]])
    xt = torch.from_numpy(x)
    turns = {kind: model.rotary_emb(xt, position_ids=positions, layer_type=kind) for kind in ("main", "compress")}
    mask = torch.zeros((1, 1, 1, min(context, dims.sliding_window - 1) + 1))
    with torch.no_grad():
        ref, _ = model.layers[layer].self_attn(xt, position_embeddings=turns, position_ids=positions,
                                               attention_mask=mask, cache=reference_cache)
    assert rel_err(mine, ref.numpy()) <= 1e-5
    if dims.has_indexer:
        assert shown["attn.chosen"].shape == (1, 1, config.index_topk) and (shown["attn.chosen"] >= 0).all()
    assert cache.seen == context + 1
    assert cache.compressor.entries.shape[1] == (context + 1) // dims.compress_ratio
