"""FP4 codes packed two to a byte, as DeepSeek-V4 stores its routed experts.

A weight [out, in] of e2m1 codes is stored as I8 [out, in/2]; its bytes are read unsigned, and
byte k of a row holds input 2k in its low nibble (bits 3..0) and input 2k + 1 in its high nibble
(bits 7..4). So the byte 0x2F holds code 0xF (-6) for input 2k and code 0x2 (+1) for input 2k + 1.

`nibbles` reads one byte the explicit way; `unpack` does it for arrays; `pack` is its inverse;
`PAIRS` is the 256-entry table of a byte's two values, low first, that the fast paths look bytes
up in.
"""

from __future__ import annotations

import numpy as np

from stepper.errors import StepperError
from stepper.fp4.e2m1 import CODES, E2M1_TABLE

NIBBLE = 0xF


def nibbles(byte: int) -> tuple[int, int]:
    """The two codes of one byte: (low nibble = the even input, high nibble = the odd one)."""
    if not 0 <= byte <= 255:
        raise ValueError(f"a packed FP4 byte is 0..255; got {byte}")
    return byte & NIBBLE, byte >> 4


def as_bytes(packed: np.ndarray, name: str = "packed FP4") -> np.ndarray:
    """The packed bytes as uint8 (a view of I8 bytes: their bits, read unsigned)."""
    packed = np.asarray(packed)
    if packed.dtype == np.int8:
        return packed.view(np.uint8)
    if packed.dtype != np.uint8:
        raise StepperError(f"{name}: expected packed FP4 bytes (I8 or U8), got dtype {packed.dtype}")
    return packed


def unpack(packed: np.ndarray) -> np.ndarray:
    """bytes [..., in/2] -> e2m1 codes uint8 [..., in]: element 2k the low nibble, 2k + 1 the high."""
    raw = as_bytes(packed)
    codes = np.empty((*raw.shape[:-1], raw.shape[-1] * 2), dtype=np.uint8)
    codes[..., 0::2] = raw & NIBBLE
    codes[..., 1::2] = raw >> 4
    return codes


def pack(codes: np.ndarray) -> np.ndarray:
    """e2m1 codes 0..15 [..., in] (in even) -> int8 bytes [..., in/2], as the checkpoint stores them."""
    codes = np.asarray(codes, dtype=np.uint8)
    if codes.shape[-1] % 2:
        raise ValueError(f"FP4 codes pack two to a byte: a row of {codes.shape[-1]} codes is not a whole number "
                         "of bytes")
    if codes.size and int(codes.max()) >= CODES:
        raise ValueError(f"e2m1 codes are 0..15; got {int(codes.max())}")
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).view(np.int8)


# PAIRS[byte] = the values of its low and its high nibble.
PAIRS = np.stack([E2M1_TABLE[np.arange(256) & NIBBLE], E2M1_TABLE[np.arange(256) >> 4]], axis=1)  # [256, 2] float32
