"""A DeepSeek-V4 checkpoint in the published layout checked whole, as `stepper inspect` checks it.

`PublishedCheckpoint.problems` says what a run of some layers would refuse (missing tensors,
dtypes, shapes, FP4 byte shapes, scale dtypes and grids); a full read adds scale values that are
NaN (E8M0's byte 0xFF; not for a remote checkpoint, listed from its headers alone), shards no
known tensor needs that cannot be read, tensors in a layer that are no tensor of it as
config.json describes it, and layers past num_hidden_layers. The `mtp.*` block is not checked: no
run reads it.
"""

from __future__ import annotations

import numpy as np

from stepper.errors import StepperError
from stepper.weights import deepseek_v4_names as v4
from stepper.weights.audit import other_unreadable, stray_problem, unknown_problem
from stepper.weights.checkpoint import Problem, count
from stepper.weights.published import FP4_DTYPE, FP8_DTYPE, SCALE_DTYPE, PublishedCheckpoint, scale_of, weight_of


def audit_published(ckpt: PublishedCheckpoint, layers: range | None) -> list[Problem]:
    """Every problem of the given layers (all of them, and the tensors outside the layers, when None)."""
    chosen = range(ckpt.layers) if layers is None else range(max(layers.start, 0), min(layers.stop, ckpt.layers))
    problems = ckpt.problems(chosen, with_globals=layers is None)
    if ckpt.reads_values:  # a remote checkpoint is listed from its headers alone
        problems += nan_scale_problems(ckpt, chosen, layers is None)
        problems += hash_table_problems(ckpt, chosen)
    problems += other_unreadable(ckpt, problems)
    problems += unknown_layer_tensors(ckpt, chosen)
    if layers is None:
        problems += stray_layers(ckpt)
    return ckpt.named_on_disk(problems)


def in_scope(name: str, layers: range, with_globals: bool) -> bool:
    layer = v4.layer_of(name)
    return layer in layers if layer is not None else with_globals


def nan_scale_problems(ckpt: PublishedCheckpoint, layers: range, with_globals: bool) -> list[Problem]:
    """Every readable F8_E8M0 scale of a quantized weight: no byte 0xFF (NaN)."""
    problems = []
    for name, shard in ckpt.weight_map.items():
        weight = weight_of(name)
        if not (name.endswith(v4.SCALE) and in_scope(name, layers, with_globals) and weight in ckpt.weight_map):
            continue
        if {shard, ckpt.weight_map[weight]} & set(ckpt.unreadable):
            continue
        if ckpt.shard_of(name).info(name).dtype != SCALE_DTYPE or ckpt.shard_of(weight).info(weight).dtype not in (
                FP8_DTYPE, FP4_DTYPE):
            continue
        nan = ckpt.shard_of(name).values(name).view(np.uint8) == 0xFF
        if nan.any():
            first = [int(i) for i in np.argwhere(nan)[0]]
            problems.append(Problem(shard, name, f"{shard}: '{name}' holds {count(int(nan.sum()), 'NaN scale')} (byte "
                                                 f"0xFF), first at {first}: every weight of its block would be NaN"))
    return problems


def zeros_hint(table: np.ndarray) -> str:
    """Why a table may repeat experts: transformers initialises tid2eid to zeros (its real values
    come from a checkpoint), so a model it made and saved names expert 0 k times in every row."""
    if table.any():
        return ""
    return "; all zeros, as transformers initialises it before a checkpoint's values are loaded"


def checked_tid2eid(table: np.ndarray, experts: int, where: str) -> np.ndarray:
    """The hash table [V, k] as int64, every entry an expert (0 <= e < experts) and each row k
    distinct experts, else one line. A row naming an expert twice gives its token k - 1 experts,
    one of them weighted by two slots' weights (transformers runs it so); a run's picture and load
    counts, and a patch's check, take a row as k experts."""
    if not np.issubdtype(table.dtype, np.integer):
        raise StepperError(f"{where}: expected integer expert ids, found {table.dtype}")
    bad = np.argwhere((table < 0) | (table >= experts))
    if len(bad):
        token, slot = (int(i) for i in bad[0])
        raise StepperError(f"{where}: entry [{token}, {slot}] is {int(table[token, slot])}, expected an expert id "
                           f"in 0..{experts - 1} ({len(bad)} {'entry' if len(bad) == 1 else 'entries'} out of range)")
    ordered = np.sort(table, axis=1)
    repeated = np.unique(np.argwhere(ordered[:, 1:] == ordered[:, :-1])[:, 0])  # the rows naming an expert twice
    if len(repeated):
        token, row = int(repeated[0]), ordered[repeated[0]]
        expert = int(row[1:][row[1:] == row[:-1]][0])
        raise StepperError(f"{where}: row {token} names expert {expert} more than once, expected "
                           f"{table.shape[1]} distinct experts a token ({len(repeated)} "
                           f"{'row' if len(repeated) == 1 else 'rows'} repeat one{zeros_hint(table)})")
    return table.astype(np.int64, copy=False)


def hash_table_problems(ckpt: PublishedCheckpoint, layers: range) -> list[Problem]:
    """Each hash-routed layer's tid2eid read whole (a few MB) and checked as a run checks it: every
    entry an expert."""
    experts = ckpt.config.get("n_routed_experts")
    if not isinstance(experts, int) or isinstance(experts, bool):
        return []  # a config a run refuses is its own problem
    problems = []
    for name, shard in ckpt.weight_map.items():
        if not name.endswith("tid2eid") or v4.layer_of(name) not in layers or shard in ckpt.unreadable:
            continue
        try:
            checked_tid2eid(ckpt.shard_of(name).values(name), experts, f"{shard}: tensor '{name}'")
        except StepperError as e:
            problems.append(Problem(shard, name, str(e)))
    return problems


def unknown_layer_tensors(ckpt: PublishedCheckpoint, layers: range) -> list[Problem]:
    """Tensors of a layer that are no tensor of it as config.json describes it, one problem per layer."""
    return [unknown_problem(layer, found) for layer, found in unknown_by_layer(ckpt, layers).items()]


def unknown_by_layer(ckpt: PublishedCheckpoint, layers: range) -> dict[int, list[tuple[str, str]]]:
    """(name, shard) of each of `unknown_layer_tensors`, by layer (the layers holding any)."""
    unknown = {}
    for layer in layers:
        prefix = v4.layer_prefix(layer)
        known = {prefix + name for name in v4.layer_tensors(ckpt.config, layer)}
        known |= {scale_of(name) for name in known}
        found = [(name, shard) for name, shard in ckpt.weight_map.items()
                 if name.startswith(prefix) and name not in known]
        if found:
            unknown[layer] = found
    return unknown


def stray_layers(ckpt: PublishedCheckpoint) -> list[Problem]:
    """Tensors of layers past num_hidden_layers (the MTP block is `mtp.*`, not a layer), one problem per layer."""
    strays: dict[int, list[tuple[str, str]]] = {}
    for name, shard in ckpt.weight_map.items():
        layer = v4.layer_of(name)
        if layer is not None and layer >= ckpt.layers:
            strays.setdefault(layer, []).append((name, shard))
    return [stray_problem(layer, found, ckpt.layers) for layer, found in sorted(strays.items())]
