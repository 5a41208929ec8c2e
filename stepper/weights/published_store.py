"""How DeepSeek-V4's published checkpoint stores each tensor, for writing one (`synth`, tests).

A LINEAR weight is F8_E4M3 with its F8_E8M0 `.scale` grid (fp4.quantize_fp8_e8m0), a routed
EXPERT weight FP4 e2m1 as I8 [out, in/2] with its F8_E8M0 scales per 32 inputs
(fp4.quantize_fp4), an INDEX tensor I64, and a FLOAT one F32 for attn_sink, ape, hc_* and
gate.bias, BF16 for the rest (norms, embedding, head, router gate, compressor and indexer
projections). Reading is stepper.weights.published.
"""

from __future__ import annotations

import math

import numpy as np

from stepper import dtypes, fp4, fp8
from stepper.weights import deepseek_v4_names as v4

F32_PARTS = ("attn_sink", ".ape", "hc_", "gate.bias")  # the FLOAT tensors stored F32
SAFETENSORS_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3", "float8_e8m0fnu": "F8_E8M0",
                      "int8": "I8", "int64": "I64"}  # NumPy dtype name -> safetensors dtype name


def stored_arrays(name: str, tensor: v4.Tensor, w: np.ndarray) -> dict[str, np.ndarray]:
    """The arrays a checkpoint stores for the tensor `name` of float32 values `w` (integers for an
    INDEX tensor): the weight, and a quantized weight's `.scale` beside it."""
    scale = name.removesuffix(".weight") + v4.SCALE
    if tensor.kind == v4.EXPERT:
        packed, scales = fp4.quantize_fp4(w, name=name)
        return {name: packed, scale: scales}
    if tensor.kind == v4.LINEAR:
        codes, scales = fp4.quantize_fp8_e8m0(w, name=name)
        return {name: codes, scale: scales}
    if tensor.kind == v4.INDEX:
        return {name: np.asarray(w, dtype=np.int64)}
    if any(part in name for part in F32_PARTS):
        return {name: np.asarray(w, dtype=np.float32)}
    return {name: np.asarray(w, dtype=np.float32).astype(dtypes.ml("bfloat16"))}


def safetensors_dtype(array: np.ndarray) -> str:
    """The safetensors dtype name an array is written as."""
    return SAFETENSORS_DTYPES[array.dtype.name]


def stored_size(tensor: v4.Tensor) -> int:
    """Bytes of one tensor as the published checkpoint stores it, with its scales (a float one at most F32)."""
    n = math.prod(tensor.shape)
    if tensor.kind == v4.EXPERT:  # two e2m1 codes a byte, one E8M0 scale per 32 inputs
        return n // 2 + n // fp4.GROUP
    if tensor.kind == v4.LINEAR:  # one F8_E4M3 byte each, one E8M0 scale per 128x128 block
        return n + math.prod(fp8.scale_grid(tensor.shape))
    return 8 * n if tensor.kind == v4.INDEX else 4 * n
