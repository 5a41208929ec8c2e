"""INT4 packing against compressed-tensors' own `pack_to_int32` and `unpack_from_int32`: every
nibble value at every position of a word, and random codes with partial last words."""

import os

import numpy as np
import pytest

if not os.environ.get("STEPPER_REQUIRE_CROSSCHECK"):
    pytest.importorskip("torch")
    pytest.importorskip("compressed_tensors")

import torch
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32

from stepper import int4


def every_value_at_every_position() -> np.ndarray:
    """16 x 8 = 128 rows of one word: row 8c + p holds the code c (value c - 8) at position p, and
    code 8 (value 0) elsewhere, so each (code, position) pair is alone in its word.  int8 [128, 8]"""
    values = np.zeros((128, 8), np.int8)
    for code in range(16):
        for position in range(8):
            values[8 * code + position, position] = code - 8
    return values


def test_every_nibble_value_and_position_against_compressed_tensors():
    values = every_value_at_every_position()
    theirs = pack_to_int32(torch.from_numpy(values), 4).numpy()
    mine = int4.pack(values)
    np.testing.assert_array_equal(mine, theirs)
    for row, word in enumerate(mine[:, 0].tolist()):  # bit level: the one nibble that is not 8
        code, position = divmod(row, 8)
        assert int4.nibble(word, position) == code
        assert all(int4.nibble(word, p) == 8 for p in range(8) if p != position)
    np.testing.assert_array_equal(int4.unpack_bits(mine, 8), values)
    fast = int4.unpack(mine, np.empty((128, 8), np.float32))
    np.testing.assert_array_equal(fast, values.astype(np.float32))
    unpacked = unpack_from_int32(torch.from_numpy(mine), 4, torch.Size([128, 8])).numpy()
    np.testing.assert_array_equal(unpacked, values)


@pytest.mark.parametrize("in_features", [8, 77, 256])
def test_random_codes_against_compressed_tensors_partial_words_included(in_features):
    values = np.random.default_rng(in_features).integers(-8, 8, (33, in_features)).astype(np.int8)
    packed = int4.pack(values)
    np.testing.assert_array_equal(packed, pack_to_int32(torch.from_numpy(values), 4).numpy())
    assert packed.shape == (33, -(-in_features // 8))
    np.testing.assert_array_equal(int4.unpack_bits(packed, in_features), values)
