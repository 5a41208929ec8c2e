"""kernels.linear.row_block: rows of a weight kept as stored, for a product with part of it (V4's
grouped output multiplies each group by its own block of o_a_proj). Each block's values are the
whole weight's rows bit for bit, and a product with it is the product with those rows."""

import numpy as np
import pytest

from stepper import fp4, fp8
from stepper.kernels.linear import float32_weight, linear, row_block
from stepper.weights.stored import Bf16Matrix, FileBytes, Fp4Matrix, Fp8Matrix

RNG = np.random.default_rng(0)
VALUES = RNG.standard_normal((384, 256)).astype(np.float32)


def weights():
    codes, scales = fp8.quantize(VALUES)
    origin = FileBytes("/nowhere", 1000, (1, 2, 3, 4))
    return {
        "float32": VALUES,
        "fp8": Fp8Matrix.of(codes, scales, origin=origin),
        "bf16": Bf16Matrix((VALUES.view(np.uint32) >> 16).astype(np.uint16), origin=origin),
        "fp4": Fp4Matrix.of(*fp4.quantize_fp4(VALUES), origin=origin),
    }


@pytest.mark.parametrize("kind", ["float32", "fp8", "bf16", "fp4"])
@pytest.mark.parametrize("rows", [(128, 256), (0, 384), (256, 384)])
def test_a_block_is_the_weights_rows_and_multiplies_as_them(kind, rows):
    w = weights()[kind]
    block = row_block(w, *rows)
    assert type(block) is type(w) and block.shape == (rows[1] - rows[0], 256)
    whole = float32_weight(w)
    np.testing.assert_array_equal(float32_weight(block).view(np.uint32), whole[slice(*rows)].view(np.uint32))
    x = RNG.standard_normal((3, 256)).astype(np.float32)
    np.testing.assert_allclose(linear(x, block), x @ whole[slice(*rows)].T, rtol=1e-5, atol=1e-4)


def test_a_block_remembers_where_its_bytes_lie():
    w = weights()
    assert row_block(w["fp8"], 128, 256).origin.offset == 1000 + 128 * 256  # one byte a code
    assert row_block(w["bf16"], 128, 256).origin.offset == 1000 + 128 * 256 * 2
    assert row_block(w["fp4"], 128, 256).origin.offset == 1000 + 128 * 128  # two codes a byte


def test_fp8_rows_off_the_scale_blocks_are_decoded():
    w = weights()["fp8"]
    block = row_block(w, 100, 200)  # across a 128-row scale block: decoded, the exact values
    assert isinstance(block, np.ndarray)
    np.testing.assert_array_equal(block, float32_weight(w)[100:200])
