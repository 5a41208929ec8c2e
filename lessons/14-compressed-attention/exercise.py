"""Lesson 14 (compressed-attention): DeepSeek-V4's compressor, pooling a window into one entry.

Write `gated_pool` below, then:

    stepper lesson check compressed-attention   compares it with stepper's on the run's real inputs,
                                                then every tensor of tiny-v4's runs
    stepper run --use stepper-lessons/compressed-attention.py --model tiny-v4 --prompt-len 38 \
        --show reach --only '*attn.chosen'      runs the model with your pooling making every entry

Keep the name and the signature: the interpreter calls gated_pool(slots_kv, slots_gate).
"""

import numpy as np


def gated_pool(slots_kv: np.ndarray, slots_gate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every closed window pooled into one vector, float32.

    slots_kv [B, Wc, slots, Dc]: the projections of each closed window's slots (Wc windows; slots is
        m, or 2m on a CSA layer, whose slots include the window before's tokens), Dc channels
    slots_gate [B, Wc, slots, Dc]: their gates, the learned bias of the slot's position and channel added (-inf for a slot before
        the first window: it must get weight 0)
    -> weights [B, Wc, slots, Dc]: for each window and channel, a softmax of the gates over the slots
       pooled [B, Wc, Dc]: for each window and channel, the sum over the slots of weights * slots_kv
    """
    raise NotImplementedError("softmax over the slots axis (2) for every channel, then the weighted sum over the slots")
