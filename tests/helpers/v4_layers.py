"""stepper's side of the V4 attention tests: a layer's AttentionDims from a transformers
DeepseekV4Config, and a weight source of plain arrays."""

from __future__ import annotations

import numpy as np

from stepper.config import Yarn
from stepper.model.compressed_attention import AttentionDims

RATIOS = {"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 128}


class Arrays:
    """A weight source of plain arrays (LayerWeights reads `get` and `matrix`; the attention takes
    its sizes as AttentionDims, not from a config)."""

    config = None

    def __init__(self, arrays: dict):
        self.arrays = arrays

    def get(self, name: str) -> np.ndarray:
        return self.arrays[name]

    matrix = get


def dims_of(config, layer: int) -> AttentionDims:
    ratio = RATIOS[config.layer_types[layer]]
    rope = config.rope_parameters["compress"]
    yarn = Yarn(rope["factor"], rope["original_max_position_embeddings"], rope["beta_fast"], rope["beta_slow"])
    return AttentionDims(
        config.hidden_size, config.num_attention_heads, config.head_dim, config.qk_rope_head_dim, config.q_lora_rank,
        config.o_groups, config.o_lora_rank, config.sliding_window, ratio, config.index_n_heads, config.index_head_dim,
        config.index_topk, config.rms_norm_eps, config.compress_rope_theta if ratio else config.rope_theta,
        yarn if ratio else None)
