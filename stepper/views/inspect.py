"""`stepper inspect`: what a checkpoint directory or a single safetensors file holds, by layer.

This module owns the listing: which tensors make one row (an FP8 weight together with its
`weight_scale_inv`; an INT4 weight's `weight_packed` with its `weight_scale` and `weight_shape`,
shown as the INT4 weight [out, in] with its group grid; a layer's routed experts folded into one
row per projection), the group
headings, what a row can have wrong (missing or misshapen scales, scales without their weight),
and how it all looks (Rich rows and a footer, with the statistics `inspect_stats` adds for
--stats) or is written (JSON Lines, one object per tensor, experts never folded). Headers come
from `Checkpoint` (a directory: index and shard headers checked against each other) or
`SafetensorsFile`. What is wrong comes from the checkpoint's own checks (`weights.audit`: what
a run of any layer refuses, and what only a full read finds) or, for one file, from the block
scale checks alone; each problem is shown in its tensor's row and again in a summary at the end.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
from rich.console import Console
from rich.text import Text

from stepper import fp8
from stepper.config import Config
from stepper.errors import StepperError
from stepper.session import config_problem, open_checkpoint
from stepper.untrusted import shown
from stepper.untrusted.paths import found
from stepper.views import summary
from stepper.views.sinks import line_width, print_fitted, titled_rule, wrap_fields
from stepper.views.summary import Stats
from stepper.weights import remote
from stepper.weights.audit import audit
from stepper.weights.checkpoint import (
    GROUP_SCALE,
    INDEX,
    PACKED,
    SCALE,
    WEIGHT_SHAPE,
    Checkpoint,
    Problem,
    in_scope,
    scale_problems,
)
from stepper.weights.deepseek_v4_names import field as v4_field
from stepper.weights.deepseek_v4_names import layer_kind as v4_layer_kind
from stepper.weights.published import PublishedCheckpoint, is_published_v4, uses_published_names
from stepper.weights.published import scale_of as published_scale_of
from stepper.weights.published import scale_problem as published_scale_problem
from stepper.weights.published_audit import audit_published
from stepper.weights.published_audit import in_scope as published_in_scope
from stepper.weights.remote_published import is_remote_published, open_published
from stepper.weights.safetensors_reader import SafetensorsFile

FP8_DTYPE = "F8_E4M3"
INT4_DTYPE = "INT4"  # shown for a weight_packed row: the weight it packs
FP4_DTYPE = "FP4"  # shown for an I8 row with its scales: the e2m1 weight its bytes hold

LAYER = re.compile(r"(?P<prefix>(?:.*?\.)?layers\.(?P<layer>\d+)\.)(?P<rest>.+)")
HF_LAYER = re.compile(r"model\.layers\.(?P<layer>\d+)\.")
EXPERT = re.compile(r"(?P<head>(?:.*\.)?experts\.)(?P<index>\d+)\.(?P<tail>.+)")


# ---------------------------------------------------------------------------------------------
# Where the tensors are


@dataclass(frozen=True)
class Part:
    """One stored tensor, as its header describes it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    shard: str


@dataclass(frozen=True)
class Source:
    """A checkpoint directory or one file, seen as tensor name -> shard."""

    path: Path
    title: str
    config: Config | None
    weight_map: dict[str, str]
    shards: dict[str, SafetensorsFile]
    block: tuple[int, int]
    hint: str | None = None  # said under the footer
    checkpoint: Checkpoint | None = None  # a directory's, checked by `audit`
    unused: frozenset[str] = frozenset()  # a wrapper's tensors no run reads (vision tower, projector)
    published: PublishedCheckpoint | None = None  # DeepSeek-V4's (X.weight with X.scale), checked by audit_published
    published_names: bool = False  # a file named as V4 publishes (X.weight with X.scale), its checkpoint or not
    notes: tuple[str, ...] = ()  # what a run of it says too: files beside the shards that no run reads

    def scale_of(self, name: str) -> str:
        """The name of a weight's scales: X.weight_scale_inv, or in V4's published layout X.scale."""
        return name + SCALE if not self.published_names else published_scale_of(name)

    def in_layers(self, name: str, layers: range) -> bool:
        """Whether a tensor belongs to one of the layers (`model.layers.N.`, or V4's `layers.N.`)."""
        return in_scope(name, layers, False) if not self.published_names else published_in_scope(name, layers, False)

    def weight_of(self, name: str) -> str:
        """The weight of a scale name (the name itself when it is no scale's)."""
        if not self.published_names:
            return name.removesuffix(SCALE)
        return name.removesuffix(".scale") + ".weight" if name.endswith(".scale") else name

    def readable(self) -> list[str]:
        """Tensor names in the shards that could be read (those of unreadable shards are not listed)."""
        return [name for name, shard in self.weight_map.items() if shard in self.shards]

    def part(self, name: str) -> Part:
        shard = self.weight_map[name]
        info = self.shards[shard].info(name)
        return Part(name, info.dtype, info.shape, info.nbytes, shard)

    def array(self, name: str) -> np.ndarray:
        return self.shards[self.weight_map[name]].get(name)

    def info(self, name: str):
        return self.shards[self.weight_map[name]].info(name)


def open_source(where: str | Path) -> Source:
    """A checkpoint directory through `Checkpoint`, a remote one (hf://, https://) from its
    headers alone, anything else as one safetensors file."""
    if isinstance(where, str) and remote.is_remote(where):
        if is_remote_published(where):
            return published_source(Path(where), open_published(where))
        return checkpoint_source(Path(where), open_checkpoint(where))
    path = Path(where)
    at = found(path)
    if at == "folder" and is_published_v4(path):
        return published_source(path, PublishedCheckpoint(path))
    if at == "folder":
        if not found(path / "config.json"):
            raise StepperError(f"{path}: not a checkpoint directory (no config.json); give a .safetensors file to "
                               "inspect one file")
        return checkpoint_source(path, open_checkpoint(path))  # any registered family's
    if at is None:
        raise StepperError(f"{path}: no such file or directory (expected a .safetensors file or a checkpoint "
                           "directory)")
    if path.suffix == ".json":
        raise StepperError(f"{path}: a JSON file; inspect expects a .safetensors file or a checkpoint directory "
                           f"({path.parent})")
    file = SafetensorsFile(path)
    hint = None
    if found(path.parent / INDEX):
        hint = f"{path.name} is one shard of {path.parent}: inspect the directory to see scales kept in other shards"
    return Source(path, file_title(file), None, dict.fromkeys(file.names(), path.name), {path.name: file},
                  fp8.BLOCK, hint, published_names=uses_published_names(file.names()))


def checkpoint_source(path: Path, ckpt: Checkpoint) -> Source:
    cfg = ckpt.config
    block = cfg.quantization.weight_block_size if cfg.quantization else fp8.BLOCK
    hint = (None if ckpt.reads_values
            else "listed from the headers alone: block scale values are read by a run, or with --stats")
    return Source(path, checkpoint_title(ckpt), cfg, {**ckpt.weight_map, **ckpt.unused}, ckpt.shards, block, hint=hint,
                  checkpoint=ckpt, unused=frozenset(ckpt.unused), notes=tuple(filter(None, [ckpt.stray_note()])))


def published_source(path: Path, ckpt: PublishedCheckpoint) -> Source:
    """A DeepSeek-V4 checkpoint: headed by layer number, its `mtp.*` block listed as not used."""
    shards = f"{len(ckpt.shards)} shard{'s' if len(ckpt.shards) != 1 else ''}"
    layout = "as transformers saves it, listed by the published names" if ckpt.saved_layout else "published layout"
    title = (f"checkpoint {ckpt.label} · deepseek_v4 ({layout}), {ckpt.layers} layers, "
             f"{v4_field(ckpt.config, 'n_routed_experts')} routed experts · {shards}")
    hint = None if ckpt.reads_values else "listed from the headers alone: scale values are read by a run"
    return Source(path, title, None, {**ckpt.weight_map, **ckpt.unused}, ckpt.shards, fp8.BLOCK, hint=hint,
                  unused=frozenset(ckpt.unused), published=ckpt, published_names=True)


def checkpoint_title(ckpt: Checkpoint) -> str:
    cfg = ckpt.config
    dense = sum(not cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
    zero = f" + {cfg.zero_experts} zero" if getattr(cfg, "zero_experts", 0) else ""  # LongCat's identity experts
    experts = f", {cfg.n_routed_experts} routed{zero} experts" if dense < cfg.num_hidden_layers else ""
    shards = f"{len(ckpt.shards)} shard{'s' if len(ckpt.shards) != 1 else ''}"
    kind = cfg.model_type if cfg.name.endswith("config.json") else f"model {cfg.name} ({cfg.model_type})"
    return f"checkpoint {ckpt.label} · {kind}, {cfg.num_hidden_layers} layers ({dense} dense){experts} · {shards}"


def wrapper_note(ckpt: Checkpoint) -> str:
    wrapper = ckpt.config.wrapper
    return (f"{wrapper.model_type} wrapper: text tensors stored under {wrapper.text_prefix}, listed without it; "
            f"{len(ckpt.unused)} tensors of its vision tower and projector, which no run reads")


def renamed_note(ckpt: Checkpoint) -> str:
    """What a family whose files name tensors otherwise than its transformers modules (Ling 3, Hy4)
    is listed by: stepper's names, each stored one a message names as the files do."""
    name, stored = min(ckpt.stored_as.items(), key=lambda pair: listing_order(pair[0]))
    return (f"{len(ckpt.stored_as):,} tensors are stored under other names, which transformers renames on loading: "
            f"listed by those stepper reads them by ('{name}' is stored as '{stored}')")


def file_title(file: SafetensorsFile) -> str:
    parts = [f"file {file.path}"]
    if file.metadata:
        shown = [f"{k}={v}" if len(v) <= 40 else f"{k}=…" for k, v in file.metadata.items()]
        parts.append("metadata " + ", ".join(shown))
    return " · ".join(parts)


# ---------------------------------------------------------------------------------------------
# Tensors with their scales


@dataclass(frozen=True)
class Tensor:
    """What one listed tensor is: the tensor, its block scales (FP8) or group scales (INT4), an INT4
    weight's weight_shape tensor and the [out, in] it holds, its problems, its statistics."""

    part: Part
    scale: Part | None = None
    problems: tuple[str, ...] = ()
    stats: Stats | None = None
    shape_part: Part | None = None  # INT4: X.weight_shape
    weight_shape: tuple[int, int] | None = None  # INT4: the values of X.weight_shape, when sound

    @property
    def name(self) -> str:
        return self.part.name

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts())

    @property
    def int4(self) -> bool:
        """An INT4 weight's weight_packed (I32), listed with its group scales and shape."""
        return self.part.name.endswith(PACKED) and self.part.dtype == "I32"

    @property
    def fp4(self) -> bool:
        """A DeepSeek-V4 FP4 weight: I8 bytes, two e2m1 codes each, with its E8M0 group scales."""
        return self.part.dtype == "I8" and self.scale is not None

    @property
    def dequantized(self) -> bool:
        """An FP8 weight whose scales fit, or an INT4 weight with its scales and shape: its
        statistics are of the values (code value x scale_inv; (nibble - 8) x group scale)."""
        if self.int4:
            return self.scale is not None and self.weight_shape is not None and not self.problems
        return self.part.dtype == FP8_DTYPE and self.scale is not None and not self.problems

    def parts(self) -> list[Part]:
        return [self.part] + ([self.scale] if self.scale else []) + ([self.shape_part] if self.shape_part else [])


def find_problems(source: Source, layers: range | None) -> list[Problem]:
    """Everything wrong with the source: a directory's problems of the given layers (all layers
    and the embedding, norm and lm_head when None), or a file's block scale problems (scales are
    demanded of F8_E4M3 tensors named as weights, X.weight, only)."""
    if source.published is not None:
        problems = config_problems(source.published)
        try:
            return problems + audit_published(source.published, layers)
        except StepperError:  # tensors the config cannot describe: its own problem says why, with its path
            if not problems:
                raise
            return problems
    if source.checkpoint is not None:
        every = range(source.checkpoint.config.num_hidden_layers)
        return audit(source.checkpoint, every if layers is None else layers, with_globals=layers is None)
    if source.published_names:
        return published_file_problems(source, layers)
    problems = []
    for name in source.readable():
        if layers is not None and not in_scope(name, layers, False):
            continue
        weight = name.removesuffix(SCALE)
        if weight != name:
            if weight not in source.weight_map:
                problems.append(Problem(source.weight_map[name], name,
                                        f"'{name}' is a block scale with no weight '{weight}'"))
            continue
        scale = source.info(name + SCALE) if name + SCALE in source.weight_map else None
        if scale is None and not name.endswith(".weight"):
            continue  # not a checkpoint's weight (activations, test data): it has no scales to miss
        texts = scale_problems(source.info(name), scale, source.block, source.weight_map.get(name + SCALE))
        problems += [Problem(source.weight_map[name], name + SCALE, text) for text in texts]
    return problems


def value_problems(source: Source, tensors: list[Tensor]) -> list[Problem]:
    """The tensors whose values (read for --stats) hold a NaN or an infinity: every product with
    one is NaN or infinite (an FP8 weight's NaN code 0x7F, say)."""
    return [Problem(source.weight_map.get(t.name), t.name,
                    f"'{t.name}' holds {t.stats.nan:,} NaN and {t.stats.inf:,} infinite values: every product with "
                    "them is NaN or infinite")
            for t in tensors if t.stats is not None and (t.stats.nan or t.stats.inf)]


def config_problems(ckpt: PublishedCheckpoint) -> list[Problem]:
    """A DeepSeek-V4 checkpoint's config.json as a run reads it (inspect lists the tensors from
    the fields it has, so a config a run refuses is one problem among the tensors')."""
    problem = config_problem(dict(ckpt.raw), str(ckpt.path / "config.json"))
    return [] if problem is None else [Problem("config.json", None, f"{problem} (a run refuses it)")]


def published_file_problems(source: Source, layers: range | None) -> list[Problem]:
    """One file named as DeepSeek-V4 publishes (a shard alone, no config): each quantized weight's
    `.scale` (dtype, grid), and scales without their weight."""
    problems = []
    for name in source.readable():
        if layers is not None and not source.in_layers(name, layers):
            continue
        weight, shard = source.weight_of(name), source.weight_map[name]
        if weight != name:
            if weight not in source.weight_map:
                problems.append(Problem(shard, name, f"'{name}' is a scale with no weight '{weight}'"))
            continue
        scale = source.scale_of(name)
        text = published_scale_problem(source.info(name), shard, source.info(scale) if scale in source.weight_map
                                       else None, source.weight_map.get(scale))
        if text is not None:
            problems.append(Problem(shard, scale, text))
    return problems


def collect(source: Source, only: list[str] | None, problems: list[Problem],
            layers: range | None = None) -> list[Tensor]:
    """Every readable tensor (of the layers), with its scales and its problems attached; scales
    without a weight stand alone."""
    names = set(source.weight_map)
    by_tensor: dict[str | None, list[str]] = {}
    for p in problems:
        by_tensor.setdefault(p.tensor, []).append(p.text)
    tensors = []
    for name in source.readable():
        if layers is not None and not source.in_layers(name, layers):
            continue
        if int4_member(name, names):
            if name.endswith(PACKED):
                tensors.append(int4_tensor(source, name.removesuffix(PACKED), by_tensor))
            continue
        weight = source.weight_of(name)
        if weight != name:  # block scales: shown in their weight's row, or alone if it is missing
            if weight not in names:
                found = tuple(by_tensor.get(name,
                                            ())) + tuple(by_tensor.get(weight, ()))  # e.g. "the weight is missing"
                tensors.append(Tensor(source.part(name), None, found))
            continue
        scale_name = source.scale_of(name)
        scale = (source.part(scale_name) if scale_name in names
                 and source.weight_map[scale_name] in source.shards else None)
        found = tuple(by_tensor.get(name, ())) + tuple(by_tensor.get(scale_name, ()))
        tensors.append(Tensor(source.part(name), scale, found))
    if only:
        tensors = [t for t in tensors if any(fnmatch.fnmatch(p.name, glob) for p in t.parts() for glob in only)]
    return tensors


def int4_member(name: str, names: set[str]) -> bool:
    """One of an INT4 weight's three tensors (X.weight_packed, X.weight_scale, X.weight_shape) whose
    weight_packed is in the source: they make one row."""
    for suffix in (PACKED, GROUP_SCALE, WEIGHT_SHAPE):
        if name.endswith(suffix) and name.removesuffix(suffix) + PACKED in names:
            return True
    return False


def int4_tensor(source: Source, weight: str, by_tensor: dict[str | None, list[str]]) -> Tensor:
    """The row of an INT4 weight X.weight: its packed words, group scales and weight_shape (with its
    values when it is two integers), and the problems of all of them."""
    def present(suffix: str) -> Part | None:
        name = weight + suffix
        return source.part(name) if name in source.weight_map and source.weight_map[name] in source.shards else None

    shape_part = present(WEIGHT_SHAPE)
    values = None
    if shape_part is not None and shape_part.dtype in ("I64", "I32") and shape_part.shape == (2,):
        values = tuple(int(v) for v in source.array(shape_part.name))
    found = tuple(text for n in (weight, weight + PACKED, weight + GROUP_SCALE, weight + WEIGHT_SHAPE)
                  for text in by_tensor.get(n, ()))
    return Tensor(source.part(weight + PACKED), present(GROUP_SCALE), found, None, shape_part, values)


# ---------------------------------------------------------------------------------------------
# Groups and rows


@dataclass(frozen=True)
class Row:
    """One line of the listing: a tensor, or a layer's experts folded together."""

    label: str  # the name relative to its group
    tensors: tuple[Tensor, ...]

    @property
    def folded(self) -> bool:
        return len(self.tensors) > 1

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def stats(self) -> Stats | None:
        if any(t.stats is None for t in self.tensors):
            return None
        return summary.combine([t.stats for t in self.tensors])


@dataclass(frozen=True)
class Group:
    heading: str
    layer: int | None
    rows: tuple[Row, ...]

    def shards(self) -> set[str]:
        """Every shard holding a tensor or a scale of this group."""
        return {p.shard for r in self.rows for t in r.tensors for p in t.parts()}


def natural(text: str) -> list[Any]:
    """Sort key putting experts.2 before experts.10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]


def listing_order(name: str) -> tuple[int, list[Any]]:
    """Names in natural order, except that the embedding comes first and lm_head last."""
    return (0 if "embed_tokens" in name else 2 if name.startswith("lm_head") else 1), natural(name)


def split_name(name: str) -> tuple[str, str]:
    """(group prefix such as 'model.layers.3.', name relative to it); '' for the model's globals."""
    m = LAYER.fullmatch(name)
    return (m["prefix"], m["rest"]) if m else ("", name)


def heading(prefix: str, config: Config | None, published: PublishedCheckpoint | None = None) -> tuple[str, int | None]:
    m = LAYER.fullmatch(prefix + "x")
    if m is None:
        return "model", None
    layer = int(m["layer"])
    if published is not None and prefix == f"layers.{layer}.":
        if layer >= published.layers:
            return f"layer {layer} (beyond the config's num_hidden_layers = {published.layers})", layer
        return f"layer {layer} ({v4_layer_kind(published.config, layer)})", layer
    if config is None or not HF_LAYER.fullmatch(prefix):
        return prefix.removeprefix("model.").rstrip("."), layer
    if layer >= config.num_hidden_layers:
        return f"layer {layer} (beyond the config's num_hidden_layers = {config.num_hidden_layers})", layer
    return f"layer {layer} ({'MoE' if config.is_moe_layer(layer) else 'dense'})", layer


UNUSED_HEADING = "not used (the wrapper's vision tower, projector)"
MTP_HEADING = "not used (the multi-token-prediction block, mtp.*)"
BLOCK = re.compile(r"(?P<head>.*\.blocks\.)(?P<index>\d+)\.(?P<tail>.+)")


def group(tensors: list[Tensor], config: Config | None, fold_experts: bool, unused: frozenset[str] = frozenset(),
          published: PublishedCheckpoint | None = None) -> list[Group]:
    """The tensors in groups (the model's, then layer by layer, then those no run reads), each a
    list of rows; a DeepSeek-V4 checkpoint's layers headed with their kind (`published`)."""
    by_prefix: dict[str, list[Tensor]] = {}
    for t in tensors:
        if t.name not in unused:
            by_prefix.setdefault(split_name(t.name)[0], []).append(t)
    groups = []
    for prefix in sorted(by_prefix, key=lambda p: (p != "", natural(p))):
        members = sorted(by_prefix[prefix], key=lambda t: listing_order(t.name))
        title, layer = heading(prefix, config, published)
        groups.append(Group(title, layer, tuple(rows(members, len(prefix), fold_experts))))
    members = sorted((t for t in tensors if t.name in unused), key=lambda t: natural(t.name))
    if members:
        mtp = all(name.startswith("mtp.") for name in unused)
        groups.append(Group(MTP_HEADING if mtp else UNUSED_HEADING, None, tuple(rows(members, 0, fold_experts))))
    return groups


def rows(tensors: list[Tensor], cut: int, fold_experts: bool) -> list[Row]:
    """One row per tensor, or, folding, one per projection of the experts (a layer's or the
    multi-token-prediction block's) and per tensor of a vision tower's blocks, where they are alike
    (same dtype, shape, scales)."""
    keys = [fold_key(t.name[cut:], t) if fold_experts else None for t in tensors]
    folds: dict[tuple, list[Tensor]] = {}
    for key, t in zip(keys, tensors):
        if key is not None:
            folds.setdefault(key, []).append(t)
    out = []
    for key, t in zip(keys, tensors):
        if key is None or len(folds[key]) == 1:
            out.append(Row(t.name[cut:], (t,)))
        elif folds[key][0] is t:  # the folded row stands where its first expert would
            numbers = [int(numbered(m.name[cut:])["index"]) for m in folds[key]]
            out.append(Row(f"{key[0]}{{{ranges(numbers)}}}.{key[1]}", tuple(folds[key])))
    return out


def numbered(relative: str) -> re.Match | None:
    """An expert's or a vision block's name, split at its number."""
    return EXPERT.fullmatch(relative) or BLOCK.fullmatch(relative)


def fold_key(relative: str, t: Tensor) -> tuple | None:
    m = numbered(relative)
    if m is None or t.problems:
        return None  # a tensor with problems keeps its own row, so they show
    scale = (t.scale.dtype, t.scale.shape) if t.scale else None
    return m["head"], m["tail"], t.part.dtype, t.part.shape, scale, t.weight_shape


def ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0..2,5,7..8'."""
    numbers = sorted(numbers)
    spans = []
    start = prev = numbers[0]
    for n in numbers[1:]:
        if n != prev + 1:
            spans.append((start, prev))
            start = n
        prev = n
    spans.append((start, prev))
    return ",".join(str(a) if a == b else f"{a}..{b}" for a, b in spans)


# ---------------------------------------------------------------------------------------------
# On screen


def human(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if nbytes < 1024 or unit == "TiB":
            return f"{int(nbytes)} B" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")


def shape_text(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def shard_text(names: set[str]) -> str:
    if len(names) == 1:
        return next(iter(names))
    ordered = sorted(names, key=natural)
    return f"{ordered[0]} … {ordered[-1]} ({len(names)} shards)"


def columns(row: Row, show_shard: bool) -> list[str]:
    first = row.tensors[0]
    part, scale = first.part, first.scale
    count = f" x{len(row.tensors)}" if row.folded else ""
    scale_text = ""
    if scale is not None:
        kind = "groups" if first.int4 or first.fp4 else "scales"
        scale_text = f"{kind} {shape_text(scale.shape)}" + (f" {scale.dtype}" if scale.dtype != "F32" else "")
    dtype, shape = part.dtype, part.shape
    if first.int4 and first.weight_shape is not None:  # the weight it packs, [out, in]
        dtype, shape = INT4_DTYPE, first.weight_shape
    if first.fp4 and len(shape) == 2:  # the weight its bytes hold, [out, in]
        dtype, shape = FP4_DTYPE, (shape[0], 2 * shape[1])
    cells = [row.label, dtype, shape_text(shape) + count, human(row.nbytes), scale_text]
    if show_shard:
        cells.append(shard_text({t.part.shard for t in row.tensors}))
        elsewhere = {t.scale.shard for t in row.tensors if t.scale and t.scale.shard != t.part.shard}
        if elsewhere:
            cells.append(f"scales in {shard_text(elsewhere)}")
    return cells


def render(console: Console, source: Source, groups: list[Group], matched: list[Tensor], total: int, stats: bool,
           problems: list[Problem]) -> None:
    """The title, a heading per group, a row per tensor (or folded experts), the footer, and
    every problem again at the end.

    When all of a group's tensors and scales are in one shard (and there are several), the shard
    is named in the heading instead of on every row. Names and metadata come from the files, so
    their control characters are shown escaped.
    """
    print_fitted(console, Text(shown(source.title), style="bold"))
    if source.checkpoint is not None and source.checkpoint.config.wrapper is not None:
        print_fitted(console, Text(wrapper_note(source.checkpoint)))
    elif source.checkpoint is not None and source.checkpoint.stored_as:
        print_fitted(console, Text(shown(renamed_note(source.checkpoint))))
    several = len(source.shards) > 1
    shard_per_row = [several and len(g.shards()) > 1 for g in groups]
    table = [[[shown(c) for c in columns(r, per_row)] for r in g.rows] for g, per_row in zip(groups, shard_per_row)]
    every = [cells for group_cells in table for cells in group_cells]
    widths = [max(len(cells[i]) for cells in every if len(cells) > i) for i in range(max(map(len, every), default=0))]
    for g, per_row, group_cells in zip(groups, shard_per_row, table):
        title = f"{g.heading} · {next(iter(g.shards()))}" if several and not per_row else g.heading
        titled_rule(console, shown(title))
        for r, cells in zip(g.rows, group_cells):
            console.print(row_text(r, cells, widths, stats, line_width(console)), soft_wrap=True)
    print_fitted(console, Text(footer(matched, total, stats, len(problems)), style="dim"))
    if source.hint:
        print_fitted(console, Text(shown(source.hint), style="dim"))
    for note in source.notes:
        print_fitted(console, Text(shown(note), style="yellow"))
    if problems:
        print_fitted(console, Text(problem_heading(problems), style="bold red"))
        for p in problems[:LISTED_PROBLEMS]:
            print_fitted(console, Text(f"  ! {shown(p.text)}", style="red"))
        if len(problems) > LISTED_PROBLEMS:
            print_fitted(console, Text(f"  ... and {len(problems) - LISTED_PROBLEMS:,} more (--json lists every one)",
                                       style="red"))


LISTED_PROBLEMS = 100  # problems listed on screen: a header of a million wrong tensors is not printed a line each


def problem_heading(problems: list[Problem]) -> str:
    files = {p.file for p in problems if p.file is not None}
    where = f" in {len(files)} file{'s' if len(files) != 1 else ''}" if files else ""
    return f"{len(problems)} problem{'s' if len(problems) != 1 else ''}{where}:"


STYLES = ("bold cyan", "", "yellow", "", "dim", "dim", "dim")  # name, dtype, shape, bytes, scales, shard, scale shard


def row_text(row: Row, cells: list[str], widths: list[int], stats: bool, width: int | None = None) -> Text:
    """The row's columns, aligned; on a terminal `width` wide, the columns that do not fit go on
    under it, and so do the statistics."""
    fields = [Text(cell.rjust(w) if i == 3 else cell.ljust(w), style=style)
              for i, (cell, w, style) in enumerate(zip(cells, widths, STYLES))]
    text = wrap_fields(fields, width, "  ", "      ")
    text.rstrip()
    for t in row.tensors:
        for problem in t.problems:
            text.append(f"\n    ! {shown(problem)}", style="bold red")
    if stats and row.stats is not None:
        text.append("\n")
        text.append_text(wrap_fields(stats_fields(row), width, "    ", "    "))
    return text


def stats_fields(row: Row) -> list[Text]:
    st = row.stats
    if st.finite == 0 and st.nan == 0 and st.inf == 0:
        return [Text("no values", style="dim")]
    fields = [Text.assemble((f"{label} ", "dim"), summary.number(value))
              for label, value in (("min", st.min), ("max", st.max), ("mean", st.mean), ("std", st.std),
                                   ("absmax", st.absmax))]
    fields += [Text.assemble((f"{label} ", "dim"), (f"{value}", "bold red" if value else ""))
               for label, value in (("nan", st.nan), ("inf", st.inf))]
    first = row.tensors[0]
    if first.part.dtype == FP8_DTYPE and not first.dequantized:
        fields.append(Text("of the bare code values: no usable scales", style="yellow"))
    if row.folded:
        fields.append(Text(f"(all {len(row.tensors)} together)", style="dim"))
    return fields


def footer(matched: list[Tensor], total: int, stats: bool, problems: int) -> str:
    parts = [p for t in matched for p in t.parts()]
    if not parts:
        return "no tensors"
    count = f"{len(parts)} tensors" if len(parts) == total else f"{len(parts)} of {total} tensors"
    nbytes: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for p in parts:
        nbytes[p.dtype] += p.nbytes
        counts[p.dtype] += 1
    dtypes = ", ".join(f"{d} {counts[d]} ({human(nbytes[d])})" for d in sorted(counts, key=lambda d: -nbytes[d]))
    fp8_weights = sum(t.part.dtype == FP8_DTYPE and t.scale is not None for t in matched)
    int4_weights = sum(t.int4 for t in matched)
    out = [f"{count}, {human(sum(nbytes.values()))}", f"dtypes: {dtypes}"]
    if fp8_weights:
        out.append(f"{fp8_weights} scale tensor{'s' * (fp8_weights != 1)} shown in their F8_E4M3 weight's row")
        if stats:
            out.append("FP8 statistics are of the dequantized values, code value x scale_inv")
    if int4_weights:
        out.append(f"{int4_weights} INT4 weight{'s' * (int4_weights != 1)}: weight_packed (I32, 8 codes a word) "
                   "shown as the [out, in] it packs, with its weight_scale (one per 32 inputs) and weight_shape")
        if stats:
            out.append("INT4 statistics are of the values, (nibble - 8) x group scale")
    fp4_weights = sum(t.fp4 for t in matched)
    if fp4_weights:
        out.append(f"{fp4_weights} FP4 weight{'s' * (fp4_weights != 1)}: I8 bytes (two e2m1 codes each, low nibble "
                   "first) shown as the [out, in] they hold, with their F8_E8M0 scales (one per 32 inputs)")
    if not stats:
        out.append("the weights' values not read: --stats reads them and names any NaN or infinity")
    if problems:
        out.append(f"{problems} problem{'s' if problems != 1 else ''} (listed below)")
    return " · ".join(out)


def total_tensors(source: Source) -> int:
    return len(source.readable())


# ---------------------------------------------------------------------------------------------
# JSON Lines


def write_json(stream: IO[str], groups: list[Group], problems: list[Problem], notes: tuple[str, ...] = ()) -> None:
    """One object per tensor (experts unfolded), in the order of the listing, then one object
    with every problem: {"problems": [{"file", "tensor", "problem"}, ...]}, and its notes when it
    has any ("notes": [...], e.g. files no run reads)."""
    for g in groups:
        for row in g.rows:
            for t in row.tensors:
                stream.write(json.dumps(record(t, g), allow_nan=False) + "\n")
    listed = [{"file": p.file, "tensor": p.tensor, "problem": p.text} for p in problems]
    stream.write(json.dumps({"problems": listed, **({"notes": list(notes)} if notes else {})}) + "\n")


def record(t: Tensor, g: Group) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": t.name,
        "group": g.heading,
        "layer": g.layer,
        "dtype": t.part.dtype,
        "shape": list(t.part.shape),
        "nbytes": t.part.nbytes,
        "shard": t.part.shard,
        "scale_inv": None if t.scale is None else {
            "name": t.scale.name, "dtype": t.scale.dtype, "shape": list(t.scale.shape),
            "nbytes": t.scale.nbytes, "shard": t.scale.shard,
        },
        "problems": list(t.problems),
    }
    if t.int4:
        out["int4"] = {"weight_shape": None if t.weight_shape is None else list(t.weight_shape),
                       "weight_scale": None if t.scale is None else part_record(t.scale),
                       "weight_shape_tensor": None if t.shape_part is None else part_record(t.shape_part)}
        out["scale_inv"] = None
    if t.stats is not None:
        out["stats"] = {k: summary.finite_or_none(v) for k, v in t.stats.as_dict().items()}
        coded = t.part.dtype == FP8_DTYPE or t.int4
        out["stats_of"] = "dequantized" if t.dequantized else "codes" if coded else "values"
    return out


def part_record(p: Part) -> dict[str, Any]:
    return {"name": p.name, "dtype": p.dtype, "shape": list(p.shape), "nbytes": p.nbytes, "shard": p.shard}
