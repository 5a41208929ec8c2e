"""MiniCPM3's muP scalings: three constant factors around DeepSeek-V2's layer.

- the embedding times `scale_emb` (12) before layer 0;
- each residual branch (attention's o_proj, the MLP's output) times
  `scale_depth / sqrt(num_hidden_layers)` (1.4 / sqrt(62)) before it is added to the stream;
- the final norm divided by `hidden_size / dim_model_base` (2560 / 256 = 10) before lm_head.

Each is one float32 product (or quotient, as transformers divides) with its own name.
Shapes: B batch, T new positions, d hidden.
"""

from __future__ import annotations

import numpy as np

from stepper.config import Config
from stepper.seams.trace import Emitter


def scaled_embedding(embed: np.ndarray, cfg: Config, emit: Emitter) -> np.ndarray:
    """embed * scale_emb.  [B, T, d] -> [B, T, d]"""
    return emit("embed_scaled", embed * np.float32(cfg.scale_emb))


def scaled_branch(branch: np.ndarray, cfg: Config) -> np.ndarray:
    """A residual branch times scale_depth / sqrt(num_hidden_layers) (the layer names the two:
    attn_scaled, mlp_scaled).  [B, T, d] -> [B, T, d]"""
    return branch * np.float32(cfg.residual_scale)


def scaled_for_logits(normed: np.ndarray, cfg: Config, emit: Emitter) -> np.ndarray:
    """The final norm divided by hidden_size / dim_model_base.  [B, T, d] -> [B, T, d]"""
    return emit("norm_scaled", normed / np.float32(cfg.logits_scaling))
