"""LongCat-Flash's LoRA scales on MLA: the query (both its parts) times sqrt(hidden / q_lora_rank)
and the normalised kv latent times sqrt(hidden / kv_lora_rank), before RoPE and the cache; the
shared rotary key is not scaled. The cache keeps the scaled latent.

Shapes: B batch, H heads, T new positions, nope, rope, kv_lora.
"""

from __future__ import annotations

import numpy as np

from stepper.config import Config
from stepper.seams.trace import Emitter


def lora_scaled(q_nope: np.ndarray, q_pe: np.ndarray, compressed_kv: np.ndarray, cfg: Config,
                emit: Emitter) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[B, H, T, nope], [B, H, T, rope], [B, T, kv_lora] -> the same, scaled."""
    q_scale = np.float32((cfg.hidden_size / cfg.q_lora_rank) ** 0.5)
    kv_scale = np.float32((cfg.hidden_size / cfg.kv_lora_rank) ** 0.5)
    q_nope = emit("self_attn.q_nope_scaled", q_nope * q_scale)  # [B, H, T, nope]
    q_pe = emit("self_attn.q_pe_scaled", q_pe * q_scale)  # [B, H, T, rope]
    return q_nope, q_pe, emit("self_attn.compressed_kv_scaled", compressed_kv * kv_scale)  # [B, T, kv_lora]
