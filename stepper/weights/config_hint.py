"""Which config.json field the weights contradict, when a run's tensors do not have the shapes the
config gives them: a porter who deleted q_lora_rank, or copied another model's hidden_size, gets
a list of weights with the wrong shape; this names the field, and the value with which every
tensor of the layer checked has its shape. Only a change of one field is looked for."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from stepper.config import Config

Shapes = dict[str, tuple[int, ...]]
# The fields that size a layer's tensors, each tried with the values the stored shapes suggest
DIMENSIONS = ("hidden_size", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
              "num_attention_heads", "intermediate_size", "moe_intermediate_size", "n_shared_experts", "vocab_size")
OPTIONAL = {"q_lora_rank"}  # null is a value of its own: no query LoRA


def contradicted_field(cfg: Config, shapes_of: Callable[[Config], Shapes],
                       stored: Callable[[str], tuple[int, ...] | None], sizes: Iterable[int], layer: int) -> str | None:
    """A sentence naming the one field whose change makes every tensor of shapes_of(cfg) (layer
    `layer`'s) stored with its shape (stored(name): its shape, None if absent), or None if no one
    field does. sizes: the dimensions of the layer's stored tensors, which the values tried come
    from. The field is named as DeepSeek-V3's config.json spells it."""
    expected = shapes_of(cfg)
    if not wrong(expected, stored):
        return None
    absent = any(stored(name) is None for name in expected)
    sizes = set(sizes)
    for field in DIMENSIONS:
        if not hasattr(cfg, field):
            continue
        for value in candidates(cfg, field, sizes, absent):
            try:
                other = dataclasses.replace(cfg, **{field: value})
                fits = not wrong(shapes_of(other), stored)
            except (TypeError, ValueError, ZeroDivisionError):
                continue
            if fits:
                now = given(getattr(cfg, field))
                return (f"the weights fit {field} = {described(value)} (config.json gives {now}): every tensor of "
                        f"layer {layer} then has its stored shape")
    return None


def wrong(shapes: Shapes, stored: Callable[[str], tuple[int, ...] | None]) -> list[str]:
    """The tensors absent or stored with another shape."""
    return [name for name, shape in shapes.items() if stored(name) != shape]


def candidates(cfg: Config, field: str, sizes: set[int], absent: bool = False) -> list:
    """Values to try for a field: the stored sizes, those divided by the config's dimensions (a
    size of heads times a head's) or less one of them (kv_lora_rank plus qk_rope_head_dim), and
    null for an optional field. A size changes the shapes of the tensors the config names, not
    which ones: only an optional field's change between null and a size does (q_proj, or q_a_proj
    and q_b_proj). So with a tensor `absent` only such a change is tried: 65,536 experts where 32
    are stored tried hundreds of sizes, each naming every expert (a minute and a half)."""
    current = getattr(cfg, field)
    nulled = [None] if field in OPTIONAL and current is not None else []
    if absent and (field not in OPTIONAL or current is not None):
        return nulled
    dimensions = {getattr(cfg, other) for other in DIMENSIONS if isinstance(getattr(cfg, other, None), int)}
    tried = (sizes | {size // d for size in sizes for d in dimensions if d and size % d == 0}
             | {size - d for size in sizes for d in dimensions})
    values: list = sorted(size for size in tried if size != current and size > 0)
    return values + nulled


def described(value: object) -> str:
    return "null" if value is None else str(value)


def given(value: object) -> str:
    return "none" if value is None else str(value)
