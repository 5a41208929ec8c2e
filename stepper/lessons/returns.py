"""What each exercise returns, so that a learner's function returning something else is one line
naming what it returned and what was expected (stepper.lessons.overrides.guarded checks each call).

`expected` gives, from the call's arguments, what stepper's own function returns: the (shape,
dtype) of an array, a list of them for a tuple of arrays, a dict of them for a Routing's fields.
A test runs every model with stepper's own functions behind the check.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stepper.model.router import Routing

SHAPED_AS = {"decode": "codes", "dequantize": "codes", "rms_norm": "x", "sinkhorn": "comb"}  # float32, shaped as that


def expected(name: str, a: dict[str, Any]) -> Any:
    """What stepper's own function returns for these arguments: (shape, dtype) of an array, a list
    of them for a tuple of arrays, a dict of them for a Routing's fields."""
    if name in SHAPED_AS:
        return a[SHAPED_AS[name]].shape, np.float32
    if name == "dequantize_int4":
        return (a["packed"].shape[0], a["in_features"]), np.float32
    if name in ("softmax", "apply_rope"):  # float32 in every run; a float64 x stays float64
        return a["x"].shape, np.result_type(a["x"], np.float32).type
    if name == "causal_mask":
        return (a["t"], a["s"]), np.bool_
    if name == "rope_inv_freq":
        return (a["dim"] // 2,), np.float32
    if name == "index_scores":
        return (a["q"].shape[0], a["q"].shape[2], a["keys"].shape[1]), np.float32
    if name == "absorbed":
        return (*a["q_nope"].shape[:3], a["cfg"].v_head_dim), np.float32
    if name == "latent":
        (b, t, _), cfg = a["x"].shape, a["cfg"]
        return [((b, t, cfg.kv_lora_rank), np.float32), ((b, 1, t, cfg.qk_rope_head_dim), np.float32)]
    if name == "gated_delta_rule":  # o, delta, the last state, every state (or None)
        (b, h, t, k), v = a["k"].shape, a["v"].shape[-1]
        every = ((b, h, t, k, v), np.float32) if a.get("keep_states") else None
        return [((b, h, t, v), np.float32), ((b, h, t, v), np.float32), ((b, h, k, v), np.float32), every]
    if name == "gated_pool":  # the slots' weights, the pooled windows
        b, w, _, c = a["slots_kv"].shape
        return [(a["slots_kv"].shape, np.float32), ((b, w, c), np.float32)]
    if name == "route":
        k = (a["x"].shape[0], a["cfg"].num_experts_per_tok)
        return {"topk_idx": (k, np.int64), "topk_weight": (k, np.float32)}
    raise KeyError(name)


def described(result: object) -> str:
    """A result as a message names it: 'float64[3, 4]', 'a tuple of 2', 'None', 'an int'."""
    if isinstance(result, np.ndarray):
        return f"{result.dtype}{list(result.shape)}"
    if isinstance(result, tuple):
        return f"a tuple of {len(result)}"
    kind = type(result).__name__
    return "None" if result is None else f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


def missing_or_wrong(result: object, want: tuple | None) -> str | None:
    """An item of a tuple: an array as `want` says, or None where `want` is None."""
    if want is None:
        return None if result is None else f"{described(result)}; expected None"
    return array_wrong(result, *want)


def array_wrong(result: object, shape: tuple, dtype: type) -> str | None:
    if isinstance(result, np.ndarray) and result.shape == tuple(shape) and result.dtype == dtype:
        return None
    return f"{described(result)}; expected an array {np.dtype(dtype)}{list(shape)}"


def wrong_result(name: str, arguments: dict[str, Any], result: object) -> str | None:
    """What is wrong with an exercise's result (its type, shape or dtype), or None."""
    want = expected(name, arguments)
    if isinstance(want, dict):  # a Routing
        if not isinstance(result, Routing):
            return f"{described(result)}; expected a Routing (topk_idx, topk_weight)"
        fields = [(f, getattr(result, f)) for f in want]
        problems = [f"{f} {array_wrong(value, *want[f])}" for f, value in fields if array_wrong(value, *want[f])]
        return f"a Routing whose {problems[0]}" if problems else None
    if isinstance(want, list):  # a tuple of arrays
        if not isinstance(result, tuple) or len(result) != len(want):
            return f"{described(result)}; expected a tuple of {len(want)} arrays"
        problems = [f"item {i}: {missing_or_wrong(r, w)}"
                    for i, (r, w) in enumerate(zip(result, want)) if missing_or_wrong(r, w)]
        return f"a tuple whose {problems[0]}" if problems else None
    return array_wrong(result, *want)
