"""Lesson 9 (int4): dequantize an INT4 weight in compressed-tensors' pack-quantized format."""

import numpy as np


def dequantize_int4(packed: np.ndarray, scales: np.ndarray, in_features: int, group: int = 32, *,
                    name: str = "weight") -> np.ndarray:
    """value[i, j] = (nibble[i, j] - 8) * scales[i, j // group].  words [out, in/8] -> float32 [out, in]"""
    words = np.asarray(packed).view(np.uint32)  # [out, in/8]
    nibbles = np.stack([(words >> np.uint32(4 * p)) & np.uint32(0xF) for p in range(8)], axis=-1)  # [out, in/8, 8]
    values = nibbles.reshape(words.shape[0], -1)[:, :in_features].astype(np.float32) - np.float32(8)  # [out, in]
    per_input = np.repeat(np.asarray(scales).astype(np.float32), group, axis=1)  # [out, in]
    return values * per_input
