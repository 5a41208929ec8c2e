"""Lesson 9 (int4): dequantize an INT4 weight in compressed-tensors' pack-quantized format.

Write `dequantize_int4` below, then:

    stepper lesson check int4          the run's real experts, through your function
    stepper run --model tiny-int4 --use stepper-lessons/int4.py
                                       every INT4 product of the run decoded by your function

Keep the name and the signature: the interpreter calls
dequantize_int4(packed, scales, in_features, group, name=...).
"""

import numpy as np


def dequantize_int4(packed: np.ndarray, scales: np.ndarray, in_features: int, group: int = 32, *,
                    name: str = "weight") -> np.ndarray:
    """value[i, j] = (nibble[i, j] - 8) * scales[i, j // group].  words [out, in/8] -> float32 [out, in]

    packed: int32 [out, in/8]: word w of a row holds inputs 8w .. 8w+7, input 8w+p in bits 4p .. 4p+3
            (lowest bits first).
    scales: [out, in/group], BF16 or float32: one scale per `group` inputs of a row.
    in_features: the weight's inputs (a multiple of group).
    name: the weight's name, for error messages; you may ignore it.
    """
    raise NotImplementedError("take each word apart into its eight nibbles, subtract 8, multiply by the group's scale")
