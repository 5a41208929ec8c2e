"""A checkpoint checked whole, as `stepper inspect` checks it.

`Checkpoint.problems` says what a run of some layers would refuse before it starts. A full read
finds more, and `audit` adds it: block scales that are not finite and positive (a run finds
them only when it reads the weight), shards that cannot be read although no known tensor needs
them, and tensors in no layer the config knows (a run never reads them).
"""

from __future__ import annotations

from stepper.errors import StepperError
from stepper.untrusted.jsonfile import read_json
from stepper.weights.checkpoint import (
    GROUP_SCALE,
    INT4_SCALE_DTYPES,
    LAYER_NAME,
    PACKED,
    SCALE,
    SCALE_DTYPES,
    WEIGHT_SHAPE,
    Checkpoint,
    Problem,
    check_int4_scales,
    check_scale_values,
    in_scope,
)
from stepper.weights.fused_experts import stored_shapes
from stepper.weights.names import held_layer_shapes


def audit(ckpt: Checkpoint, layers: range, with_globals: bool) -> list[Problem]:
    """Every problem of the given layers (and of the embedding, norm and lm_head with_globals),
    in the order: the config field the weights contradict (it explains the rest), what a run refuses,
    scale values, unreadable shards, stray tensors. A remote checkpoint's are found from its headers
    alone: what only values show (scales, a tensor that must hold zeros) is left to a run."""
    problems = ckpt.problems(layers, with_globals, values=ckpt.reads_values)
    hint = ckpt.config_hint(layers, with_globals) if problems else None
    problems = ([Problem("config.json", None, hint)] if hint else []) + problems
    if ckpt.reads_values:
        problems += scale_value_problems(ckpt, layers, with_globals)
        problems += group_scale_problems(ckpt, layers, with_globals)
    problems += other_unreadable(ckpt, problems)
    problems += unknown_tensors(ckpt, layers)
    if with_globals:
        problems += stray_disagreements(ckpt) + stray_tensors(ckpt)
    return ckpt.named_on_disk(problems)


def scale_value_problems(ckpt: Checkpoint, layers: range, with_globals: bool) -> list[Problem]:
    """Every readable float block scale of an F8_E4M3 weight: finite and above zero."""
    scales = [name for name in ckpt.weight_map if name.endswith(SCALE) and in_scope(name, layers, with_globals)
              and readable_fp8(ckpt, name.removesuffix(SCALE), name)]
    return value_problems(ckpt, scales, check_scale_values)


def group_scale_problems(ckpt: Checkpoint, layers: range, with_globals: bool) -> list[Problem]:
    """Every readable group scale of an INT4 weight (X.weight_scale beside X.weight_packed): finite."""
    scales = [name for name, shard in ckpt.weight_map.items() if name.endswith(GROUP_SCALE)
              and name.removesuffix(GROUP_SCALE) + PACKED in ckpt.weight_map and in_scope(name, layers, with_globals)
              and shard not in ckpt.unreadable and ckpt.shard_of(name).info(name).dtype in INT4_SCALE_DTYPES]
    return value_problems(ckpt, scales, check_int4_scales)


def value_problems(ckpt: Checkpoint, names: list[str], check) -> list[Problem]:
    """What `check(shard, name, values)` refuses of each tensor, one problem each."""
    problems = []
    for name in names:
        shard = ckpt.weight_map[name]
        try:
            check(shard, name, ckpt.shard_of(name).values(name))
        except StepperError as e:
            problems.append(Problem(shard, name, str(e)))
    return problems


def readable_fp8(ckpt: Checkpoint, weight: str, scale: str) -> bool:
    """An F8_E4M3 weight and its scales in readable shards, the scales of a scale dtype."""
    if weight not in ckpt.weight_map or {ckpt.weight_map[weight], ckpt.weight_map[scale]} & set(ckpt.unreadable):
        return False
    return (ckpt.shard_of(weight).info(weight).dtype == "F8_E4M3"
            and ckpt.shard_of(scale).info(scale).dtype in SCALE_DTYPES)


def other_unreadable(ckpt: Checkpoint, found: list[Problem]) -> list[Problem]:
    """Shards that cannot be read and hold no tensor a problem already names."""
    named = {p.file for p in found}
    return [Problem(shard, None, f"{shard} cannot be read ({why})") for shard, why in ckpt.unreadable.items()
            if shard not in named]


IGNORED = ("self_attn.rotary_emb.inv_freq",)  # Kimi K2's checkpoints keep the rotary table; it is recomputed


def unknown_tensors(ckpt: Checkpoint, layers: range) -> list[Problem]:
    """Tensors of a layer the config has that are no tensor of that layer as the config describes
    it (a dense layer's tensors where it says MoE, a misspelt name), one problem per layer: no run
    reads them. A block scale without its weight is left to the run's own check."""
    return [unknown_problem(layer, found) for layer, found in unknown_by_layer(ckpt, layers).items()]


def unknown_by_layer(ckpt: Checkpoint, layers: range) -> dict[int, list[tuple[str, str]]]:
    """(name, shard) of each of `unknown_tensors`, by layer (the layers holding any)."""
    unknown, of_layer = {}, tensors_by_layer(ckpt)
    for layer in (n for n in layers if n < ckpt.config.num_hidden_layers):
        prefix = f"model.layers.{layer}."
        shapes = held_layer_shapes(ckpt.config, layer)
        known = set(stored_shapes(shapes) if ckpt.config.fused_experts else shapes)  # fused: weights.fused_experts
        known |= {name + suffix for name in known for suffix in (SCALE, PACKED, GROUP_SCALE, WEIGHT_SHAPE)}
        known |= {prefix + name for name in IGNORED}
        if ckpt.per_tensor:
            known |= activation_scales(known)
        found = [(name, shard) for name, shard in of_layer.get(layer, [])
                 if name not in known and not orphan_scale(ckpt, name)]
        if found:
            unknown[layer] = found
    return unknown


def tensors_by_layer(ckpt: Checkpoint) -> dict[int, list[tuple[str, str]]]:
    """(name, shard) of each tensor of a layer (`model.layers.N.`), by layer, in the index's order."""
    of_layer: dict[int, list[tuple[str, str]]] = {}
    for name, shard in ckpt.weight_map.items():
        m = LAYER_NAME.match(name)
        if m:
            of_layer.setdefault(int(m[1]), []).append((name, shard))
    return of_layer


def activation_scales(names: set[str]) -> set[str]:
    """The static input scales a per-tensor FP8 checkpoint keeps beside its weights (Mistral Small 4
    as published: `X.activation_scale`, a fused experts' `X_activation_scale`); stepper applies the
    weight scales only, so no run reads them."""
    return {name.removesuffix(".weight") + ".activation_scale" if name.endswith(".weight")
            else name + "_activation_scale" for name in names}


def orphan_scale(ckpt: Checkpoint, name: str) -> bool:
    """A block scale whose weight the checkpoint does not list."""
    return name.endswith(SCALE) and name.removesuffix(SCALE) not in ckpt.weight_map


def unknown_problem(layer: int, found: list[tuple[str, str]]) -> Problem:
    """One line for all of a layer's unknown tensors, naming the first."""
    name, shard = found[0]
    return Problem(shard, name, f"{unknown_words(layer, found)}; no run reads {'it' if len(found) == 1 else 'them'}")


def unknown_words(layer: int, found: list[tuple[str, str]]) -> str:
    """What a layer's unknown tensors are, naming the first ("SHARD: 'NAME' and 5 more tensor(s) are
    in layer 1 but ...")."""
    name, shard = found[0]
    what = f"'{name}' is" if len(found) == 1 else f"'{name}' and {len(found) - 1} more tensor(s) are"
    return f"{shard}: {what} in layer {layer} but no tensor of that layer as config.json describes it"


def stray_tensors(ckpt: Checkpoint) -> list[Problem]:
    """Tensors of layers past the config's num_hidden_layers, one problem per layer: no run reads
    them. DeepSeek-V3's multi-token-prediction layers (`num_nextn_predict_layers` of them, right
    after the last layer) are part of the checkpoint, not strays."""
    layers = ckpt.config.num_hidden_layers
    known = layers + nextn_layers(ckpt)
    strays = {layer: found for layer, found in tensors_by_layer(ckpt).items() if layer >= known}
    return [stray_problem(layer, found, layers) for layer, found in sorted(strays.items())]


def stray_disagreements(ckpt: Checkpoint) -> list[Problem]:
    """Where the index and a shard's header disagree on a tensor of a layer past the config's
    num_hidden_layers (a multi-token-prediction layer's too): ckpt.problems looks at the config's
    layers only, and stray_tensors at the tensors both list."""
    layers = ckpt.config.num_hidden_layers
    return [problem for name, problem in ckpt.disagreements.items()
            if (m := LAYER_NAME.match(name)) and int(m[1]) >= layers]


def stray_problem(layer: int, found: list[tuple[str, str]], layers: int) -> Problem:
    """One line for all of a stray layer's tensors, naming the first."""
    name, shard = found[0]
    what = f"'{name}' is" if len(found) == 1 else f"'{name}' and {len(found) - 1} more tensor(s) are"
    return Problem(shard, name, f"{shard}: {what} in layer {layer}, but the config has {layers} layers "
                                f"(num_hidden_layers); no run reads {'it' if len(found) == 1 else 'them'}")


def nextn_layers(ckpt: Checkpoint) -> int:
    """The config's num_nextn_predict_layers (0 when absent or not a count)."""
    raw = read_json(ckpt.path / "config.json")
    raw = raw.get("text_config", raw) if ckpt.config.wrapper is not None else raw
    count = raw.get("num_nextn_predict_layers", 0)
    return count if type(count) is int and count >= 0 else 0
