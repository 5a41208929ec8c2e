"""The exercises: the functions a lesson asks a learner to write, listed here by object.

Each is marked `@exercise` where it is defined (stepper.seams.swap: its calls go to a learner's
function while one is swapped in); this list is what `--use` and `lesson check` accept, in the
order their messages name them. Nothing is registered by importing a module: a function marked
but not listed here fails tests/unit/test_swap.py, one listed but not marked fails on import, and
a renamed one fails on import too.
"""

from __future__ import annotations

from collections.abc import Callable

from stepper.fp8 import blocks, e4m3
from stepper.int4 import groups
from stepper.model import attention, compressor, hyper_connections, indexer, kda, ops, rope, router
from stepper.seams.swap import exercise_name

FUNCTIONS: tuple[Callable, ...] = (
    e4m3.decode, blocks.dequantize, groups.dequantize_int4,
    ops.rms_norm, ops.softmax, ops.causal_mask,
    rope.rope_inv_freq, rope.apply_rope,
    attention.latent, attention.absorbed,
    indexer.index_scores,
    router.route,
    kda.gated_delta_rule,
    compressor.gated_pool, hyper_connections.sinkhorn,
)

REFERENCES: dict[str, Callable] = {exercise_name(f): f.__wrapped__ for f in FUNCTIONS}  # name -> stepper's own
