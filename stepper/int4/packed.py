"""INT4 codes packed eight to a 32-bit word, as compressed-tensors' `pack-quantized` format stores them.

A weight [out, in] of 4-bit codes is stored as `weight_packed`, int32 [out, ceil(in/8)]: the
codes of a row, taken along the input dimension, fill its words lowest bits first, so input j
of the row lies in word j // 8, bits 4*(j % 8) .. 4*(j % 8) + 3. A code is a value plus 8 (the
offset that makes -8..7 a nibble 0..15): value = nibble - 8. (When `in` is not a multiple of 8,
the packer pads the last word with 0 nibbles; weights are whole groups of 32, so stepper never
reads such a word, but `pack` and `unpack_bits` handle it.)

`nibble` and `fields` read one word the slow, explicit way (for learners and the UI);
`unpack_bits` does it for whole arrays, one nibble position at a time; `unpack` is the fast
path, which reads each byte of the words as two nibbles through a 256-entry table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepper.errors import StepperError

BITS = 4
PER_WORD = 32 // BITS  # 8 nibbles in an int32 word
OFFSET = 1 << (BITS - 1)  # 8: a nibble n stands for n - 8, so 0..15 is -8..7
NIBBLE = (1 << BITS) - 1  # 0b1111


def words_for(in_features: int) -> int:
    """The int32 words a row of `in_features` codes fills: ceil(in / 8)."""
    return -(-in_features // PER_WORD)


def nibble(word: int, position: int) -> int:
    """The code at `position` (0..7) of a word: its bits 4*position .. 4*position + 3."""
    if not 0 <= position < PER_WORD:
        raise ValueError(f"a word holds nibbles 0..{PER_WORD - 1}; got position {position}")
    return (word >> (BITS * position)) & NIBBLE  # Python's >> on a negative int keeps the two's-complement bits


@dataclass(frozen=True)
class NibbleFields:
    """One nibble of a packed word, taken apart for showing."""

    position: int  # 0..7 within the word; input column word * 8 + position
    bits: str  # the 4 bits, e.g. "1011"
    code: int  # the nibble 0..15
    value: int  # code - 8, in -8..7


def fields(word: int) -> list[NibbleFields]:
    """A word's eight nibbles, lowest bits first (input columns 8w .. 8w + 7 in that order)."""
    word &= 0xFFFF_FFFF  # an int32 as its 32 bits
    codes = [nibble(word, p) for p in range(PER_WORD)]
    return [NibbleFields(p, f"{c:04b}", c, c - OFFSET) for p, c in enumerate(codes)]


def word_bits(word: int) -> str:
    """The 32 bits of a word, highest first, in groups of four (nibble 7 on the left, nibble 0 on the right)."""
    bits = f"{word & 0xFFFF_FFFF:032b}"
    return " ".join(bits[i : i + BITS] for i in range(0, 32, BITS))


def as_words(packed: np.ndarray, name: str = "weight_packed") -> np.ndarray:
    """The packed words as int32 (a view of uint32 words, never a copy)."""
    packed = np.asarray(packed)
    if packed.dtype == np.uint32:
        return packed.view(np.int32)
    if packed.dtype != np.int32:
        raise StepperError(f"{name}: expected packed int32 words, got dtype {packed.dtype}")
    return packed


def unpack_bits(packed: np.ndarray, in_features: int) -> np.ndarray:
    """int32 words [out, ceil(in/8)] -> values (nibble - 8) as int8 [out, in], position by position:
    columns p, p + 8, p + 16, ... are nibble p of each word."""
    words = as_words(packed).view(np.uint32)
    out = np.empty((words.shape[0], words.shape[1] * PER_WORD), dtype=np.int8)
    for p in range(PER_WORD):
        out[:, p::PER_WORD] = (words >> np.uint32(BITS * p)) & np.uint32(NIBBLE)
    out -= OFFSET
    return out[:, :in_features]


# A little-endian word's byte b holds nibbles 2b (low 4 bits) and 2b + 1 (high 4 bits): reading the
# words as bytes, each byte is two consecutive inputs. PAIRS[byte] is their two values, low first.
PAIRS = np.array([[(b & NIBBLE) - OFFSET, (b >> BITS) - OFFSET] for b in range(256)], dtype=np.float32)  # [256, 2]


def unpack(packed: np.ndarray, out: np.ndarray) -> np.ndarray:
    """int32 words [rows, W] -> values (nibble - 8) as float32 into `out` [rows, 8W]: each byte of
    the words looked up in PAIRS, written straight into `out` (no temporaries). The words are
    read as little-endian bytes, as safetensors stores them."""
    pairs = out.reshape(packed.shape[0], packed.shape[1] * 4, 2)  # [rows, bytes, 2]
    np.take(PAIRS, as_words(packed).view("<u1").reshape(packed.shape[0], -1), axis=0, out=pairs)
    return out


def pack(values: np.ndarray) -> np.ndarray:
    """int values in -8..7 [out, in] -> int32 words [out, ceil(in/8)], lowest bits first; the
    padding nibbles of a partial last word are 0 (the writer's padding)."""
    values = np.asarray(values)
    if values.size and not (values.min() >= -OFFSET and values.max() < OFFSET):
        raise ValueError(f"INT4 values must lie in -{OFFSET}..{OFFSET - 1}")
    rows, cols = values.shape
    codes = np.zeros((rows, words_for(cols) * PER_WORD), dtype=np.uint32)
    codes[:, :cols] = values.astype(np.int64) + OFFSET
    words = np.zeros((rows, words_for(cols)), dtype=np.uint32)
    for p in range(PER_WORD):
        words |= codes[:, p::PER_WORD] << np.uint32(BITS * p)
    return words.view(np.int32)
