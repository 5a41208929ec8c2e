"""`stepper synth`: write any weight source as a real HF-layout checkpoint directory.

The layout is the one DeepSeek-V3 and Kimi K2 ship: config.json (with quantization_config),
model.safetensors.index.json and several shards (the embedding, one shard per layer, then the
final norm and lm_head), FP8 linear weights each followed by its float32 `weight_scale_inv`,
BF16 norms, embeddings, lm_head and router gate, an F32 router bias. With a compressed-tensors
config (`--quant int4`, laid out as Kimi-K2-Thinking) the modules it quantizes are written as
I32 `weight_packed`, BF16 `weight_scale` and I64 `weight_shape`, the rest BF16. Shards are written one
tensor at a time; the directory appears under its name only when complete. `--force` replaces
only a checkpoint stepper wrote: a folder holding anything else, or a file changed since (its
index notes what each was), is never removed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from stepper import dtypes, files, int4
from stepper.config import Config, Fp8, Int4Groups, wrapped_hf
from stepper.errors import StepperError
from stepper.fp8 import scale_grid
from stepper.untrusted import shown
from stepper.untrusted.jsonfile import read_json
from stepper.weights.checkpoint import GROUP_SCALE, INDEX, PACKED, SCALE, WEIGHT_SHAPE
from stepper.weights.fused_experts import fused_data, fused_scales, stored_shapes
from stepper.weights.names import (
    EMBED,
    global_shapes,
    layer_globals,
    layer_shapes,
    storage_dtype,
    stored_name,
    unread_layer_shapes,
)
from stepper.weights.safetensors_writer import Entry, write_safetensors
from stepper.weights.seeded import SyntheticWeights

QUANTS = ("fp8", "int4", "bf16")


def requantized(cfg: Config, quant: str) -> Config:
    """The config with its linear weights stored as `quant` says: fp8 (the config's FP8 blocks, or
    128x128; one scale per tensor where the experts are stored fused, as Mistral Small 4), int4
    (Kimi-K2-Thinking's compressed-tensors groups) or bf16 (no quantization)."""
    if quant not in QUANTS:
        raise StepperError(f"--quant {shown(quant)}: expected one of {', '.join(QUANTS)}")
    if not {"quantization", "int4"} <= {f.name for f in dataclasses.fields(cfg)}:  # Kimi Linear's: BF16 as published
        if quant == "bf16":
            return cfg
        raise StepperError(f"--quant {quant}: model {cfg.name} ({cfg.model_type}) is written in BF16 only, as it is "
                           "published: use --quant bf16")
    if quant == "int4" and not any(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers)):
        raise StepperError(f"--quant int4: model {cfg.name} has no routed experts, the weights INT4 stores "
                           "(Kimi-K2-Thinking's layout): use --quant bf16 or fp8")
    if cfg.fused_experts and quant == "int4":
        raise StepperError(f"--quant {quant}: model {cfg.name} stores its experts fused (mlp.experts.gate_up_proj), "
                           "which stepper writes and reads in BF16 or FP8 only: use --quant bf16 or fp8")
    fp8_blocks = (cfg.quantization or Fp8(per_tensor=cfg.fused_experts)) if quant == "fp8" else None
    return dataclasses.replace(cfg, quantization=fp8_blocks, int4=Int4Groups() if quant == "int4" else None)


def tensor_entries(source: SyntheticWeights, shapes: dict[str, tuple[int, ...]]) -> list[Entry]:
    """Each tensor, and after each FP8 weight its block scales, made lazily when written."""
    entries = []
    for name, shape in shapes.items():
        if source.config.fused_experts and name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            data = partial(fused_data, name, shape[0], lambda expert: source.stored(expert).data)
            dtype = storage_dtype(source.config, name + ".weight")  # as its experts' matrices
            entries.append(Entry(name, dtype, shape, data))
            if dtype == "F8_E4M3":  # one scale per expert, [E, 1, 1]
                scales = partial(fused_scales, name, shape[0], lambda expert: source.stored(expert).scale_inv)
                entries.append(Entry(name + SCALE, "F32", (shape[0], 1, 1), scales))
            continue
        stored = _Lazy(source, name)
        dtype = stored.dtype
        entries.append(Entry(name, dtype, shape, stored.data))
        if dtype == "F8_E4M3":
            grid = stored.grid(shape)
            entries.append(Entry(name + SCALE, "F32", grid, stored.scale_inv))
        if dtype == "INT4":
            entries[-1] = Entry(name + PACKED, "I32", (shape[0], int4.words_for(shape[1])), stored.data)
            groups = (shape[0], int4.groups_for(shape[1], source.config.int4.group_size))
            entries.append(Entry(name + GROUP_SCALE, "BF16", groups, stored.scale_inv))
            entries.append(Entry(name + WEIGHT_SHAPE, "I64", (2,), lambda shape=shape: np.array(shape, np.int64)))
    return entries


class _Lazy:
    """Makes a tensor once, hands out its codes and then its scales, and forgets it."""

    def __init__(self, source: SyntheticWeights, name: str):
        self.source, self.name = source, name
        self.dtype = storage_dtype(source.config, name)
        self._stored = None

    def grid(self, shape: tuple[int, int]) -> tuple[int, ...]:
        """The scales' shape: the block grid, or a scalar with one scale per tensor."""
        quantization = self.source.config.quantization
        return () if quantization.per_tensor else scale_grid(shape, quantization.weight_block_size)

    def data(self):
        self._stored = self.source.stored(self.name)
        return self._stored.data

    def scale_inv(self):
        scale, self._stored = self._stored.scale_inv, None
        quantization = self.source.config.quantization  # None for INT4's group scales
        return scale[:1, :1].reshape(()) if quantization is not None and quantization.per_tensor else scale


def shard_plan(source: SyntheticWeights, layers: range, with_globals: bool) -> list[dict[str, tuple[int, ...]]]:
    cfg = source.config
    outer = global_shapes(cfg)
    shards = [{EMBED: outer.pop(EMBED)}] if with_globals else []
    stored = stored_shapes if cfg.fused_experts else dict  # fused experts: as the checkpoint stores them
    # a layer's shard as published: with what no run reads (A.X-K1's dense layers' post_mlp_layernorm)
    shards += [stored({**layer_shapes(cfg, layer), **unread_layer_shapes(cfg, layer)}) for layer in layers]
    if with_globals:
        return shards + [outer]
    read_by_any = layer_globals(cfg)  # what any layer reads (LeRoPE's alpha)
    return shards + ([read_by_any] if read_by_any else [])


ByteProgress = Callable[[str, int], AbstractContextManager[Callable[[int], None]]]


@contextmanager
def no_progress(_what: str, _total: int) -> Iterator[Callable[[int], None]]:
    yield lambda _n: None


def synth_checkpoint(source: SyntheticWeights, out: Path, layers: range | None = None, force: bool = False,
                     progress: ByteProgress = no_progress) -> Path:
    """Write the checkpoint to `out` (all layers and the globals, or only `layers`). `progress(what,
    total)` gives a function told the bytes of each tensor as it is made and written."""
    cfg = source.config
    if cfg.wrapper is not None and cfg.wrapper.model_type != "kimi_k25":
        raise StepperError(f"model {cfg.name}: synth does not write a {cfg.wrapper.model_type} wrapper's vision tower: "
                           "use --layout hf for the text model alone")
    check_replaceable(out, force, not_from_synth, "a checkpoint stepper synth wrote")
    whole = layers is None
    plan = shard_plan(source, range(cfg.num_hidden_layers) if whole else layers, with_globals=whole)
    partial = files.temp_folder(out)
    try:
        total = sum(e.nbytes for shapes in plan for e in tensor_entries(source, shapes))
        with progress(f"writing {shown(out.name)}", total) as advance:
            _write(source, partial, plan, advance)
        publish_folder(partial, out, force)
    except OSError as e:
        raise StepperError(f"{out}: cannot be written ({e.strerror})") from None
    finally:
        files.remove_temp_folder(partial)
    return out


def _write(source: SyntheticWeights, folder: Path, plan: list[dict[str, tuple[int, ...]]],
           advance: Callable[[int], None]) -> None:
    cfg = source.config
    weight_map: dict[str, str] = {}
    total = 0
    shards = len(plan) + (cfg.wrapper is not None)
    for i, shapes in enumerate(plan, start=1):
        shard = f"model-{i:05d}-of-{shards:05d}.safetensors"
        entries = [replace(e, name=stored_name(cfg, e.name),
                           make=counted(e, advance)) for e in tensor_entries(source, shapes)]
        write_safetensors(folder / shard, entries, {"format": "pt"})
        weight_map.update(dict.fromkeys((e.name for e in entries), shard))
        total += sum(e.nbytes for e in entries)
    if cfg.wrapper is not None:
        shard = f"model-{shards:05d}-of-{shards:05d}.safetensors"
        entries = vision_entries(cfg, source.seed)
        write_safetensors(folder / shard, entries, {"format": "pt"})
        weight_map.update(dict.fromkeys((e.name for e in entries), shard))
        total += sum(e.nbytes for e in entries)
    raw = cfg.to_hf() if cfg.wrapper is None else wrapped_hf(cfg, VISION_CONFIG)
    files.write_new(folder / "config.json", json.dumps(raw, indent=2) + "\n")
    write_index(folder, {"total_size": total, "stepper_synthetic_seed": source.seed, "stepper_model": cfg.name},
                weight_map)


def write_index(folder: Path, metadata: dict, weight_map: dict[str, str]) -> None:
    """The index, written last: its metadata says stepper wrote the folder, and what each file it
    wrote was (`stepper_files`: config.json's sha256, each shard's size), so that --force later
    knows a file changed since (not_from_synth)."""
    written = {entry.name: fingerprint(entry) for entry in sorted(folder.iterdir())}
    index = {"metadata": {**metadata, "stepper_files": written}, "weight_map": weight_map}
    files.write_new(folder / INDEX, json.dumps(index, indent=2) + "\n")


HASHED_UP_TO = 64 * 2**20  # shards up to this size (a fixture's weights) are noted by their sha256 too


def fingerprint(path: Path) -> dict[str, object]:
    """What a file synth wrote is: its size, and its sha256 if it is config.json (the file a user
    edits) or a shard of at most 64 MiB (a shard of gigabytes, at full size, is known by its size)."""
    size = path.stat().st_size
    found: dict[str, object] = {"bytes": size}
    if path.name == "config.json" or size <= HASHED_UP_TO:
        found["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def unlike(path: Path, was: object) -> bool:
    """Whether the file is not what the index noted (only what it noted: an index written before
    small shards were hashed notes their size alone)."""
    now = fingerprint(path)
    return not isinstance(was, dict) or not was or any(now.get(key) != value for key, value in was.items())


def counted(entry: Entry, advance: Callable[[int], None]) -> Callable[[], Any]:
    """The entry's make, telling `advance` its bytes as it makes them."""
    def make():
        made = entry.make()
        advance(entry.nbytes)
        return made
    return make


# A small vision tower and projector, named and shaped as Kimi K2.5's (27 blocks of width 1152
# there), so that a kimi_k25-layout checkpoint holds the tensors a text run must never read.
VISION_CONFIG = {"vt_hidden_size": 32, "vt_num_hidden_layers": 2, "vt_num_attention_heads": 2,
                 "vt_intermediate_size": 64, "mm_hidden_size": 32, "patch_size": 14, "merge_kernel_size": [2, 2],
                 "mm_projector_type": "patchmerger", "pos_emb_type": "divided_fixed", "init_pos_emb_height": 8,
                 "init_pos_emb_width": 8}


def vision_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    v = VISION_CONFIG
    width, inner, grid = v["vt_hidden_size"], v["vt_intermediate_size"], v["init_pos_emb_height"]
    merged = width * v["merge_kernel_size"][0] * v["merge_kernel_size"][1]
    shapes = {"vision_tower.patch_embed.proj.weight": (width, 3, v["patch_size"], v["patch_size"]),
              "vision_tower.patch_embed.proj.bias": (width,),
              "vision_tower.patch_embed.pos_emb.weight": (grid, v["init_pos_emb_width"], width)}
    for b in range(v["vt_num_hidden_layers"]):
        for part, shape in (("norm0", (width,)), ("norm1", (width,)), ("wqkv", (3 * width, width)),
                            ("wo", (width, width)), ("mlp.fc0", (inner, width)), ("mlp.fc1", (width, inner))):
            shapes[f"vision_tower.encoder.blocks.{b}.{part}.weight"] = shape
            shapes[f"vision_tower.encoder.blocks.{b}.{part}.bias"] = shape[:1]
    shapes.update({"vision_tower.encoder.final_layernorm.weight": (width,), "mm_projector.pre_norm.weight": (width,),
                   "mm_projector.proj.0.weight": (merged, merged),
                   "mm_projector.proj.2.weight": (cfg.hidden_size, merged)})
    return shapes


def vision_entries(cfg: Config, seed: int) -> list[Entry]:
    """The vision tower's and projector's tensors: BF16 normals, drawn from the seed."""
    rng = np.random.default_rng([seed, 7])
    return [Entry(name, "BF16", shape,
                  lambda shape=shape: rng.standard_normal(shape, dtype=np.float32).astype(dtypes.ml("bfloat16")))
            for name, shape in vision_shapes(cfg).items()]


SYNTH_FILES = re.compile(rf"(config\.json|{re.escape(INDEX)}|model-\d{{5}}-of-\d{{5}}\.safetensors)")


def not_from_synth(folder: Path) -> list[str]:
    """What a folder holds that `stepper synth` did not write, or changed since (nothing: the folder
    is synth's). Its files are known by their names and by the index, whose metadata says stepper
    made them and (since it says so) what each was."""
    foreign = sorted(entry.name for entry in folder.iterdir()
                     if entry.is_symlink() or not entry.is_file() or not SYNTH_FILES.fullmatch(entry.name))
    metadata = synth_metadata(folder / INDEX)
    if not foreign and any(folder.iterdir()) and metadata is None:
        foreign.append(f"{INDEX} (missing, or not written by stepper)")
    written = metadata.get("stepper_files") if metadata is not None else None
    if isinstance(written, dict):
        foreign += [f"{name} (changed since stepper wrote it)" for name, was in sorted(written.items())
                    if name not in foreign and (folder / name).is_file() and unlike(folder / name, was)]
    return foreign


def synth_metadata(path: Path) -> dict | None:
    """The metadata of an index synth wrote, None if it is not one."""
    try:
        if path.is_symlink() or path.stat().st_size > 1 << 30:
            return None
        index = read_json(path)
    except (StepperError, OSError):  # unsound JSON (too deep, not UTF-8, ...): not an index synth wrote
        return None
    metadata = index.get("metadata") if isinstance(index, dict) else None
    return metadata if isinstance(metadata, dict) and "stepper_synthetic_seed" in metadata else None


def quoted(found: str) -> str:
    """A name in the way, quoted, and what is said of it after: "'config.json' (changed since ...)"."""
    name, said, why = found.partition(" (")
    return f"'{shown(name)}'{' (' + why if said else ''}"


def publish_folder(partial: Path, out: Path, force: bool) -> None:
    """Put the checkpoint written at `partial` in `out`'s place, `out` checked again first: the
    writing takes minutes for a full-size layer, and a file put in `out` meanwhile is named and kept."""
    check_replaceable(out, force, not_from_synth, "a checkpoint stepper synth wrote")
    files.replace_folder(partial, out)


def check_replaceable(out: Path, force: bool, foreign: Callable[[Path], list[str]], what: str) -> None:
    """Refuse, in one line, to write `out` unless it is new, or `force` is given and `out` is a
    folder in which `foreign` finds nothing stepper did not write (nothing a user wrote is ever
    replaced); the refusal names what is in the way."""
    if not out.parent.is_dir():
        raise StepperError(f"{out}: folder {out.parent} does not exist")
    if not os.access(out.parent, os.W_OK):
        raise StepperError(f"{out}: folder {out.parent} is not writable")
    found = files.kind(out)
    if found is None:
        return
    if found != "folder":
        thing = {"other": "special file"}.get(found, found)  # a link is not followed, even to a folder
        raise StepperError(f"{shown(out)}: is a {thing}, not a folder; stepper writes a new folder there "
                           f"(remove the {thing} first)")
    others = foreign(out)  # looked at first: --force is offered only where it would be taken
    if not others and not force:
        raise StepperError(f"{shown(out)}: already exists; pass --force to replace it")
    if others:
        listed = (", ".join(quoted(n) for n in others[:3])
                  + (f" and {len(others) - 3} more" if len(others) > 3 else ""))
        advice = "so nothing there was touched" if force else "so give a new folder"
        raise StepperError(f"{shown(out)}: holds {listed}; --force replaces only {what}, {advice}")
