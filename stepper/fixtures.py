"""Golden fixtures: every named tensor of one run, written so other implementations can test against it.

A fixture is a folder:

- `manifest.json`: format name and version, the stepper version, the config, where the weights
  come from (with hashes), the inputs (token ids, positions, decode tokens), the attention path
  of each step, the dtype policy, and per tensor its canonical name, shape, named dims, dtype,
  sha256, statistics and tolerance, in execution order.
- `tensors.safetensors`: the tensors themselves, in execution order (float32; int64 for
  `mlp.gate.topk_idx`).
- `weights/`: the weights the run read, as an HF-layout checkpoint (FP8, or BF16 converted the
  way DeepSeek's fp8_cast_bf16.py does), when they are small. Full-size synthetic weights are
  named by preset and seed instead (`stepper synth` re-creates them), with the sha256 of every
  tensor the run read.

`export` writes a fixture; `load` reads one back and checks its hashes. Comparing another
implementation's dump with a fixture is `fixtures_verify`. The format is described for
implementers in fixtures/README.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import platform
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from rich.console import Console

from . import __version__, catalog, summary
from .checkpoint import INDEX, Checkpoint
from .config import Config
from .errors import StepperError
from .presets import PRESETS
from .safetensors_reader import SafetensorsFile
from .safetensors_writer import ITEM_SIZE, Entry, write_safetensors
from .session import Plan, RunSpec, attention_path, execute, load_model, prepare
from .synth import replace_dir, tensor_entries
from .trace import Event
from .weights import EMBED, SyntheticWeights, layer_shapes, storage_dtype

FORMAT = "stepper-fixture"
VERSION = 1
MANIFEST = "manifest.json"
TENSORS = "tensors.safetensors"
WEIGHTS = "weights"

COPY_LIMIT = 64 * 2**20  # synthetic weights up to this size are written into the fixture
HASH_FILES_LIMIT = 2 * 2**30  # checkpoint files are hashed whole up to this total size
WEIGHT_DTYPES = ("fp8", "bf16")

# Tolerances (see fixtures/README.md, "Tolerances"). A float tensor matches when, for every
# finite reference entry r and candidate entry c, |c - r| <= atol + rtol * |r|, with atol set per
# tensor to ATOL_PER_ABSMAX times the reference's largest magnitude.
RTOL = 1e-4
ATOL_PER_ABSMAX = 1e-5
MASKED_BELOW = -1e30  # a candidate's masked attention score may be -inf or any value below this

EXACT_KEYS = {"mlp.gate.group_mask": "exact"}  # 0.0 / 1.0 per group
SET_KEYS = {"mlp.gate.topk_idx": "same-experts"}  # the same experts per token, in any order
PAIRED_KEYS = {"mlp.gate.topk_weight": "mlp.gate.topk_idx"}  # compared per expert, paired by index

# Tensors whose rotary dims are in the reference layout [evens rotated | odds rotated]: "all" of
# the last axis, or its "tail" of qk_rope_head_dim dims (the catalogue's descriptions say which).
ROPE_LAYOUT = {
    "rope_cos": "all",
    "rope_sin": "all",
    "self_attn.q_pe_rope": "all",
    "self_attn.k_pe_rope": "all",
    "self_attn.query_states": "tail",
    "self_attn.key_states": "tail",
}


# ---------------------------------------------------------------------------------------------
# What to export


@dataclass(frozen=True)
class ExportSpec:
    """A run to capture, plus how to store its weights. Recorded in the manifest as `export`."""

    model: str = "tiny"
    layer: int | None = None
    layers: tuple[int, int | None] | None = None
    ids: tuple[int, ...] | None = None
    prompt_len: int = 7
    start_pos: int = 0
    decode: int = 0
    attn: str = "auto"
    seed: int = 0
    weights_dtype: str = "fp8"

    def run_spec(self) -> RunSpec:
        return RunSpec(model=self.model, layer=self.layer, layers=self.layers, ids=self.ids,
                       prompt_len=self.prompt_len, start_pos=self.start_pos, decode=self.decode,
                       seed=self.seed, attn=self.attn)

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["layers"] = None if self.layers is None else list(self.layers)
        d["ids"] = None if self.ids is None else list(self.ids)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExportSpec:
        d = dict(d)
        d["layers"] = None if d.get("layers") is None else tuple(d["layers"])
        d["ids"] = None if d.get("ids") is None else tuple(d["ids"])
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})

    def command(self, out: str, weights_dir: str | None = None) -> str:
        """The `stepper fixtures export` command line that makes this fixture."""
        parts = ["stepper fixtures export", out, "--model", self.model]
        if self.layer is not None:
            parts += ["--layer", str(self.layer)]
        if self.layers is not None:
            first, stop = self.layers
            parts += ["--layers", f"{first}:{'' if stop is None else stop}"]
        if self.ids is not None:
            parts += ["--ids", ",".join(map(str, self.ids))]
        else:
            parts += ["--prompt-len", str(self.prompt_len)]
        for option, value, default in (("--start-pos", self.start_pos, 0), ("--decode", self.decode, 0),
                                       ("--attn", self.attn, "auto"), ("--seed", self.seed, 0),
                                       ("--weights-dtype", self.weights_dtype, "fp8")):
            if value != default:
                parts += [option, str(value)]
        if weights_dir is not None:
            parts += ["--weights-dir", weights_dir]
        return " ".join(parts)


# ---------------------------------------------------------------------------------------------
# Hashes and tolerances


def sha256_array(array: np.ndarray) -> str:
    """sha256 of a tensor's bytes as safetensors stores them (C order, little-endian)."""
    return hashlib.sha256(safetensors_bytes(array)).hexdigest()


def safetensors_bytes(array: np.ndarray) -> np.ndarray:
    """A tensor's bytes as safetensors stores them (C order, little-endian), as uint8."""
    array = np.asarray(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def file_hashes(folder: Path) -> dict[str, dict[str, Any]]:
    return {p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in sorted(folder.iterdir()) if p.is_file()}


def tolerance_for(key: str, array: np.ndarray) -> dict[str, Any]:
    """The documented tolerance of one tensor (README: Tolerances)."""
    if key in SET_KEYS:
        return {"kind": SET_KEYS[key]}
    if key in EXACT_KEYS:
        return {"kind": EXACT_KEYS[key]}
    finite = np.asarray(array, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    absmax = float(np.abs(finite).max()) if finite.size else 0.0
    tol: dict[str, Any] = {"kind": "allclose", "rtol": RTOL, "atol": float(np.float32(ATOL_PER_ABSMAX * absmax))}
    if key in PAIRED_KEYS:
        tol["paired_by"] = PAIRED_KEYS[key]
    return tol


def dumps(value: Any, indent: str = "", item: bool = False) -> str:
    """JSON that diffs well: one member per line, but on one line a container of scalars, a list
    item whose members are scalars or containers of scalars (a tensor entry), or any such flat
    container that fits in 160 characters."""
    one_line = json.dumps(value, allow_nan=False)
    if not isinstance(value, (dict, list)) or not value or flat(value, 0) or (flat(value, 1) and (item or len(one_line) <= 160)):
        return one_line
    inner = indent + " "
    if isinstance(value, dict):
        members = [f"{inner}{json.dumps(k)}: {dumps(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(members) + "\n" + indent + "}"
    return "[\n" + ",\n".join(inner + dumps(v, inner, item=True) for v in value) + "\n" + indent + "]"


def flat(value: Any, depth: int) -> bool:
    """True if `value`'s members are scalars, or (depth 1) scalars and containers of scalars."""
    members = value.values() if isinstance(value, dict) else value
    return all(not isinstance(m, (dict, list)) or (depth > 0 and flat(m, depth - 1)) for m in members)


def finite_or_none(value: float) -> float | None:
    return value if not isinstance(value, float) or math.isfinite(value) else None


# ---------------------------------------------------------------------------------------------
# Weights


def needed_weights(plan: Plan) -> dict[str, tuple[int, ...]]:
    """Every weight tensor the run reads (all experts of its MoE layers, as a checkpoint holds them)."""
    cfg = plan.config
    d, v = cfg.hidden_size, cfg.vocab_size
    shapes: dict[str, tuple[int, ...]] = {EMBED: (v, d)}
    for layer in run_layers(plan):
        shapes.update(layer_shapes(cfg, layer))
    if plan.needs_logits:
        shapes.update({"model.norm.weight": (d,), "lm_head.weight": (v, d)})
    return shapes


def run_layers(plan: Plan) -> range:
    if plan.alone:
        return plan.shown
    return range(plan.config.num_hidden_layers if plan.needs_logits else plan.shown.stop)


def stored_bytes(cfg: Config, shapes: dict[str, tuple[int, ...]], weights_dtype: str) -> int:
    total = 0
    block = cfg.quantization.weight_block_size if cfg.quantization else (128, 128)
    for name, shape in shapes.items():
        dtype = storage_dtype(cfg, name)
        n = math.prod(shape)
        if dtype == "F8_E4M3" and weights_dtype == "fp8":
            total += n + 4 * math.ceil(shape[0] / block[0]) * math.ceil(shape[1] / block[1])
        else:
            total += n * ITEM_SIZE[dtype if dtype != "F8_E4M3" else "BF16"]
    return total


def bf16_config(cfg: Config) -> Config:
    return dataclasses.replace(cfg, quantization=None)


def write_weights(source: SyntheticWeights, folder: Path, shapes: dict[str, tuple[int, ...]], weights_dtype: str) -> None:
    """An HF-layout checkpoint of these tensors: one shard for the embedding, one per layer, one
    for the final norm and lm_head. FP8 as `stepper synth` writes it; or BF16, each FP8 weight
    dequantized (codes x block scale) and rounded to BF16 and its scales dropped, as DeepSeek's
    inference/fp8_cast_bf16.py converts a checkpoint."""
    groups: dict[str, dict[str, tuple[int, ...]]] = {}
    for name, shape in shapes.items():
        key = ".".join(name.split(".")[:3]) if name.startswith("model.layers.") else (
            "embed" if name == EMBED else "head")
        groups.setdefault(key, {})[name] = shape
    ordered = [groups.pop("embed")] if "embed" in groups else []
    head = groups.pop("head", None)
    ordered += list(groups.values()) + ([head] if head else [])
    cfg = source.config if weights_dtype == "fp8" else bf16_config(source.config)
    weight_map: dict[str, str] = {}
    total = 0
    for i, group in enumerate(ordered, start=1):
        shard = f"model-{i:05d}-of-{len(ordered):05d}.safetensors"
        entries = tensor_entries(source, group) if weights_dtype == "fp8" else bf16_entries(source, group)
        write_safetensors(folder / shard, entries, {"format": "pt"})
        weight_map.update(dict.fromkeys((e.name for e in entries), shard))
        total += sum(e.nbytes for e in entries)
    metadata = {"total_size": total, "stepper_model": source.config.name, "stepper_synthetic_seed": source.seed,
                "stepper_weights_dtype": weights_dtype}
    (folder / INDEX).write_text(json.dumps({"metadata": metadata, "weight_map": weight_map}, indent=2) + "\n")
    (folder / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2) + "\n")


def bf16_entries(source: SyntheticWeights, shapes: dict[str, tuple[int, ...]]) -> list[Entry]:
    entries = []
    for name, shape in shapes.items():
        dtype = storage_dtype(source.config, name)
        if dtype == "F8_E4M3":
            entries.append(Entry(name, "BF16", shape, lambda n=name: source.get(n).astype(ml_dtypes.bfloat16)))
        else:
            entries.append(Entry(name, dtype, shape, lambda n=name: source.stored(n).data))
    return entries


class ReadHashes:
    """A weight source that records the sha256 of every tensor the run reads, as stored (FP8
    codes and their scales, BF16, F32): the bytes a checkpoint file holds for it. Embedding rows
    are recorded as the float32 rows read."""

    def __init__(self, inner):
        self.inner = inner
        self.config = inner.config
        self.read: dict[str, dict[str, Any]] = {}

    def stored(self, name: str):
        stored = self.inner.stored(name)
        if name not in self.read:
            scale = None if stored.scale_inv is None else sha256_array(stored.scale_inv)
            self._record(name, stored.dtype, stored.data.shape, sha256_array(stored.data), scale)
        return stored

    def row_blocks(self, name: str, rows: int):
        """The inner source's blocks, hashed one after another: once all are read, the record is
        the whole tensor's, as `stored` makes it (blocks never split an FP8 scale block)."""
        data, scales, count = hashlib.sha256(), hashlib.sha256(), 0
        for block in self.inner.row_blocks(name, rows):
            data.update(safetensors_bytes(block.data))
            if block.scale_inv is not None:
                scales.update(safetensors_bytes(block.scale_inv))
            count += block.data.shape[0]
            yield block
        if name not in self.read:
            scale = None if block.scale_inv is None else scales.hexdigest()
            self._record(name, block.dtype, (count, *block.data.shape[1:]), data.hexdigest(), scale)

    def _record(self, name: str, dtype: str, shape: tuple[int, ...], sha256: str, scale_sha256: str | None) -> None:
        self.read[name] = {"dtype": dtype, "shape": list(shape), "sha256": sha256}
        if scale_sha256 is not None:
            self.read[name]["scale_inv_sha256"] = scale_sha256

    def get(self, name: str) -> np.ndarray:
        return self.stored(name).to_float32(name)

    def matrix(self, name: str):
        return self.stored(name).matrix(name)

    def get_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        array = self.inner.get_rows(name, rows)
        key = f"{name}[rows {','.join(str(int(r)) for r in np.ravel(rows))}]"
        self.read.setdefault(key, {"dtype": "F32", "shape": list(np.shape(array)), "sha256": sha256_array(np.asarray(array, np.float32))})
        return array

    def has(self, name: str) -> bool:
        return self.inner.has(name)

    def check(self, layers, with_globals: bool) -> None:
        self.inner.check(layers, with_globals)

    def __getattr__(self, attr: str):
        return getattr(self.inner, attr)


# ---------------------------------------------------------------------------------------------
# Export


class Capture:
    """Sink keeping a private copy of every event, in order."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, event: Event) -> None:
        self.events.append(dataclasses.replace(event, array=np.array(event.array, copy=True)))


def export(spec: ExportSpec, out: Path, *, force: bool = False, weights_dir: Path | None = None,
           console: Console | None = None) -> dict[str, Any]:
    """Run `spec`, write the fixture folder `out` atomically, and return its manifest."""
    check_target(out, force, weights_dir)
    if spec.weights_dtype not in WEIGHT_DTYPES:
        raise StepperError(f"--weights-dtype must be one of {', '.join(WEIGHT_DTYPES)}, got '{spec.weights_dtype}'")
    source = load_model(spec.model, spec.seed)
    plan = prepare(spec.run_spec(), source)  # every check on the user's input, before any work
    synthetic = isinstance(source, SyntheticWeights)
    shapes = needed_weights(plan)
    size = stored_bytes(plan.config, shapes, spec.weights_dtype) if synthetic else None
    copy = synthetic and size <= COPY_LIMIT
    if spec.weights_dtype != "fp8" and not copy:
        raise StepperError("--weights-dtype bf16 converts synthetic weights small enough to copy into the fixture "
                           f"(under {COPY_LIMIT // 2**20} MiB); model {spec.model} {'is a checkpoint' if not synthetic else 'needs more'}")
    if weights_dir is not None and not copy:
        raise StepperError(f"--weights-dir: model {spec.model}'s weights are not copied into fixtures, so there is nothing to share")
    partial = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        started = time.perf_counter()
        weights_info, weights = prepare_weights(spec, source, shapes, partial, out, weights_dir, copy, console)
        capture = Capture()
        result = execute(prepare(spec.run_spec(), weights), [capture])
        if isinstance(weights, ReadHashes):
            weights_info["read"] = dict(sorted(weights.read.items()))
        manifest = build_manifest(spec, plan, weights.config, result, capture.events, weights_info, out, weights_dir)
        write_tensors(partial / TENSORS, capture.events)
        manifest["files"] = {TENSORS: {"bytes": (partial / TENSORS).stat().st_size, "sha256": sha256_file(partial / TENSORS)}}
        (partial / MANIFEST).write_text(dumps(manifest) + "\n")
        if weights_dir is not None:
            settle_shared_weights(partial / WEIGHTS, weights_dir)
        replace_dir(partial, out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    if console is not None:
        report_export(console, manifest, out, time.perf_counter() - started)
    return manifest


def check_target(out: Path, force: bool, weights_dir: Path | None) -> None:
    if out.exists() and not force:
        raise StepperError(f"{out}: already exists; pass --force to replace it")
    if out.exists() and not out.is_dir():
        raise StepperError(f"{out}: exists and is not a folder")
    if not out.parent.is_dir():
        raise StepperError(f"{out}: folder {out.parent} does not exist")
    if weights_dir is not None:
        if not weights_dir.parent.is_dir():
            raise StepperError(f"--weights-dir {weights_dir}: folder {weights_dir.parent} does not exist")
        if weights_dir.resolve().is_relative_to(out.resolve()):
            raise StepperError(f"--weights-dir {weights_dir}: must be outside the fixture folder (it is shared)")


def prepare_weights(spec, source, shapes, partial: Path, out: Path, weights_dir: Path | None, copy: bool,
                    console: Console | None):
    """Write the weights into the fixture (small synthetic models) or describe them (the rest)."""
    if copy:
        folder = partial / WEIGHTS
        folder.mkdir()
        if console is not None:
            console.print(f"writing {len(shapes)} weight tensors ({spec.weights_dtype}) ...", style="dim")
        write_weights(source, folder, shapes, spec.weights_dtype)
        shared = weights_dir is not None
        rel = os.path.relpath(weights_dir.resolve(), out.resolve()) if shared else WEIGHTS
        info = {
            "kind": "synthetic",
            **synthetic_model(spec.model),
            "seed": spec.seed,
            "copied": True,
            "path": Path(rel).as_posix(),
            "storage": storage_note(spec.weights_dtype),
            "files": file_hashes(folder),
        }
        return info, Checkpoint(folder)
    if isinstance(source, SyntheticWeights):
        info = {
            "kind": "synthetic",
            **synthetic_model(spec.model),
            "seed": spec.seed,
            "copied": False,
            "path": None,
            "storage": storage_note("fp8"),
            "recreate": f"stepper synth --model {spec.model} --layers {layer_span(shapes)} --seed {spec.seed} --out DIR",
            "note": (f"not copied ({stored_bytes(source.config, shapes, 'fp8') / 2**30:.1f} GiB with the embedding); "
                     "synthetic weights are made per tensor from (seed, name), so the command re-creates them. "
                     "`read` has the sha256 of every tensor this run read, as stored: compare it with the bytes "
                     "of that tensor in the re-created shards. The embedding (which synth --layers does not write) "
                     "is recorded as the float32 rows read; the fixture's hidden_states hold them too."),
        }
        return info, ReadHashes(source)
    return checkpoint_info(source), ReadHashes(source)


def synthetic_model(model: str) -> dict[str, str | None]:
    """A preset's name, or the config.json synthetic weights were made for (its content is `config`)."""
    return {"preset": model} if model in PRESETS else {"preset": None, "config_file": model}


def layer_span(shapes: dict[str, tuple[int, ...]]) -> str:
    layers = sorted({int(n.split(".")[2]) for n in shapes if n.startswith("model.layers.")})
    return f"{layers[0]}:{layers[-1] + 1}" if layers else "0:0"


def storage_note(weights_dtype: str) -> str:
    if weights_dtype == "bf16":
        return ("bf16: linear weights dequantized from FP8 (codes x 128x128 block scale_inv) and rounded to BF16 "
                "(round to nearest even), scales dropped and quantization_config removed, as DeepSeek's "
                "inference/fp8_cast_bf16.py converts a checkpoint; norms, embeddings, lm_head and router gate BF16, "
                "router bias F32")
    return ("fp8: linear weights F8_E4M3 with float32 weight_scale_inv per 128x128 block; norms, embeddings, lm_head "
            "and router gate BF16, router bias F32 (the layout of Kimi K2 and DeepSeek-V3)")


def checkpoint_info(source: Checkpoint) -> dict[str, Any]:
    """A checkpoint is named, not copied: its path, its Hub id and revision when the path is a
    Hub cache snapshot, its config and index hashes, and its shards' sizes (and hashes when small)."""
    path = source.path.resolve()
    match = re.search(r"models--([^/]+)--([^/]+)/snapshots/([0-9a-f]{40})", path.as_posix())
    raw = json.loads((source.path / "config.json").read_text(encoding="utf-8"))
    shards = {p for p in source.shards}
    small = sum((source.path / s).stat().st_size for s in shards) <= HASH_FILES_LIMIT
    files: dict[str, dict[str, Any]] = {}
    for p in sorted(source.path.iterdir()):
        if p.is_file() and (p.name in shards or p.name in ("config.json", INDEX)):
            files[p.name] = {"bytes": p.stat().st_size}
            if small or p.name not in shards:
                files[p.name]["sha256"] = sha256_file(p)
    return {
        "kind": "checkpoint",
        "path": str(source.path),
        "id": f"{match.group(1)}/{match.group(2)}" if match else raw.get("_name_or_path"),
        "revision": match.group(3) if match else None,
        "copied": False,
        "files": files,
        "note": "shards over 2 GiB in total are not hashed whole; `read` has the sha256 of every tensor the run read",
    }


def settle_shared_weights(written: Path, shared: Path) -> None:
    """Move the weights to the shared folder, or check the folder already holds the same files."""
    if shared.exists():
        mine, theirs = file_hashes(written), file_hashes(shared)
        if mine != theirs:
            diff = sorted(set(mine) ^ set(theirs)) or sorted(n for n in mine if mine[n] != theirs[n])
            raise StepperError(f"--weights-dir {shared}: holds other weights than this run's ({diff[0]} differs); "
                               "choose another folder or remove it")
        shutil.rmtree(written)
        return
    partial = shared.parent / f".{shared.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    os.rename(written, partial)
    os.rename(partial, shared)


def write_tensors(path: Path, events: list[Event]) -> None:
    entries = [Entry(e.name, "I64" if e.array.dtype == np.int64 else "F32", e.array.shape,
                     lambda a=e.array: np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")))
               for e in events]
    for e in events:
        if e.array.dtype not in (np.float32, np.int64):
            raise StepperError(f"tensor {e.name} has dtype {e.array.dtype}; fixtures hold float32 and int64 only")
    write_safetensors(path, entries, {"format": FORMAT, "order": json.dumps([e.name for e in events])})


# ---------------------------------------------------------------------------------------------
# The manifest


def build_manifest(spec: ExportSpec, plan: Plan, cfg: Config, result, events: list[Event], weights: dict[str, Any],
                   out: Path, weights_dir: Path | None) -> dict[str, Any]:
    cat = catalog.load()
    steps = []
    positions = list(range(spec.start_pos, spec.start_pos + len(plan.prompt)))
    ids = list(plan.prompt)
    for step in range(spec.decode + 1):
        phase = None if spec.decode == 0 else ("prefill" if step == 0 else f"decode{step - 1}")
        steps.append({"phase": phase, "ids": ids, "positions": positions, "attention": attention_path(spec.run_spec(), step)})
        if step < spec.decode:
            ids, positions = [result.generated[step]], [positions[-1] + 1]
    tensors = []
    for e in events:
        dims = cat.dims(e.key, e.array.shape, cfg)
        entry = {
            "name": e.name,
            "key": e.key,
            "phase": e.phase,
            "layer": e.layer,
            "shape": list(e.array.shape),
            "dims": [d.symbol for d in dims],
            "named_shape": catalog.format_shape(dims),
            "dtype": "int64" if e.array.dtype == np.int64 else "float32",
            "sha256": sha256_array(e.array),
            "stats": {k: finite_or_none(v) for k, v in summary.stats(e.array).as_dict().items()},
            "tolerance": tolerance_for(e.key, e.array),
        }
        if e.key in ROPE_LAYOUT:
            entry["rope_layout"] = "reference: [evens rotated | odds rotated]" + (
                "" if ROPE_LAYOUT[e.key] == "all" else f" in the last {cfg.qk_rope_head_dim} dims")
        tensors.append(entry)
    alone = plan.alone
    return {
        "format": FORMAT,
        "version": VERSION,
        "stepper_version": __version__,
        "name": out.name,
        "description": describe(spec, plan),
        "environment": environment(),
        "command": spec.command(out.name, None if weights_dir is None else os.path.relpath(weights_dir, out.parent)),
        "export": spec.as_dict(),
        "config": cfg.to_hf(),
        "weights": weights,
        "run": {
            "kind": "layer" if alone else "model",
            "layers": list(plan.shown),
            "layers_run": list(run_layers(plan)),
            "layer_input": ("`layers.N.hidden_states` of each step: the token embeddings of its ids" if alone
                            else "token embeddings"),
        },
        "inputs": {
            "prompt_ids": list(plan.prompt),
            "start_pos": spec.start_pos,
            "decode_tokens": list(result.generated),
            "decode_tokens_from": ("drawn from the seed (a lone layer has no logits)" if alone
                                   else "greedy: argmax of the previous step's last logits"),
            "steps": steps,
        },
        "mode": "prefill" if spec.decode == 0 else f"prefill, then {spec.decode} decode step(s) with the cache",
        "attention": {s["phase"] or "prefill": s["attention"] for s in steps},
        "dtype_policy": {
            "compute": "float32 throughout (NumPy; matmuls are float32 BLAS sgemm)",
            "weights": ("each weight widened to float32 before use: FP8 as code x scale_inv of its 128x128 block, "
                        "BF16 exactly"),
            "tensors": "float32; int64 for mlp.gate.topk_idx",
        },
        "tolerance_policy": {
            "allclose": f"|candidate - reference| <= atol + rtol * |reference| for every finite reference entry; "
                        f"rtol = {RTOL}, atol = {ATOL_PER_ABSMAX} x the tensor's absmax (stored per tensor); "
                        f"non-finite entries (masked scores, -inf) must be non-finite or below {MASKED_BELOW:g} "
                        "in the same places",
            "same-experts": "the same set of experts for every token (the references leave the order unspecified)",
            "exact": "equal (group_mask is 0.0 or 1.0)",
            "paired_by": "topk_weight is compared per expert: both sides sorted by their own topk_idx",
        },
        "routing": routing_margins(events),
        "tensors": tensors,
    }


def describe(spec: ExportSpec, plan: Plan) -> str:
    cfg = plan.config
    what = (f"layer {plan.shown.start} alone" if plan.alone else
            f"layers {plan.shown.start}..{plan.shown.stop - 1} of {cfg.num_hidden_layers}")
    steps = f", then {spec.decode} cached decode step{'s' if spec.decode != 1 else ''}" if spec.decode else ""
    paths = sorted({attention_path(spec.run_spec(), s) for s in range(spec.decode + 1)}, reverse=True)
    weights = (f"{spec.weights_dtype} synthetic weights, seed {spec.seed}" if isinstance(plan.weights, SyntheticWeights)
               else f"weights of checkpoint {spec.model}")
    return (f"{cfg.name} ({cfg.model_type}), {what}: prefill of {len(plan.prompt)} tokens at positions "
            f"{spec.start_pos}..{spec.start_pos + len(plan.prompt) - 1}{steps}; attention {' then '.join(paths)}; "
            f"{weights}")


def environment() -> dict[str, Any]:
    """What the exact bits depend on (fixtures/README.md, Determinism): recorded, not required."""
    blas = None
    try:
        info = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        blas = f"{info.get('name')} {info.get('version')}"
    except (KeyError, TypeError, ValueError):  # older NumPy: no dict mode
        blas = None
    return {"numpy": np.__version__, "blas": blas, "machine": platform.machine(), "system": platform.system(),
            "python": platform.python_version()}


def routing_margins(events: list[Event]) -> dict[str, dict[str, float | None]]:
    """How far each MoE layer's choices are from a tie: the smallest gap, over tokens, between the
    last chosen and the first unchosen expert (masked scores_for_choice), and between the last
    kept and the first dropped group. A port within tolerance cannot choose differently unless a
    gap is below about twice the scores' atol."""
    by_name = {e.name: e.array for e in events}
    margins = {}
    for e in events:
        if e.key != "mlp.gate.topk_idx":
            continue
        base = e.name[: -len("topk_idx")]
        sfc = by_name.get(base + "scores_for_choice")
        mask = by_name.get(base + "group_mask")
        groups = by_name.get(base + "group_scores")
        if sfc is None or mask is None or groups is None:
            continue
        k = e.array.shape[1]
        kept = np.repeat(mask, sfc.shape[1] // mask.shape[1], axis=1) > 0
        masked = np.sort(np.where(kept, sfc, -np.inf), axis=1)[:, ::-1]
        gaps = masked[:, k - 1] - masked[:, k] if sfc.shape[1] > k else np.array([np.inf])
        expert = float(np.min(gaps[np.isfinite(gaps)])) if np.isfinite(gaps).any() else None
        kept_groups = int(mask[0].sum())
        group = None
        if mask.shape[1] > kept_groups:
            g = np.sort(groups, axis=1)[:, ::-1]
            group = float(np.min(g[:, kept_groups - 1] - g[:, kept_groups]))
        margins[e.name] = {"expert_margin": expert, "group_margin": group}
    return margins


def report_export(console: Console, manifest: dict[str, Any], out: Path, seconds: float) -> None:
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    weights = manifest["weights"]
    where = (f"weights in {weights['path']}" if weights.get("copied") else
             f"weights named ({weights['kind']}{', ' + weights['recreate'] if 'recreate' in weights else ''})")
    console.print(f"wrote {out}: {len(manifest['tensors'])} tensors, {size / 2**20:.2f} MiB in the folder, {where} "
                  f"({seconds:.1f} s)")
    for name, m in manifest["routing"].items():
        for kind in ("expert_margin", "group_margin"):
            if m[kind] is not None and m[kind] < 1e-4:
                console.print(f"warning: {name}: {kind} {m[kind]:.2g} is close to a tie; a port within tolerance "
                              "may choose differently (try other ids or another seed)", style="yellow")


# ---------------------------------------------------------------------------------------------
# Reading a fixture back


@dataclass(frozen=True)
class Fixture:
    path: Path
    manifest: dict[str, Any]
    tensors: dict[str, np.ndarray]  # execution order

    @property
    def entries(self) -> list[dict[str, Any]]:
        return self.manifest["tensors"]

    @property
    def config(self) -> Config:
        return Config.from_hf(self.manifest["config"], f"{self.path / MANIFEST}: config")

    @property
    def phased(self) -> bool:
        return any(e["phase"] for e in self.entries)

    def weights_path(self) -> Path | None:
        rel = self.manifest["weights"].get("path")
        return None if rel is None else (self.path / rel)


def fixture_dir(path: Path) -> Path:
    if path.is_file() and path.name == MANIFEST:
        return path.parent
    if not path.is_dir():
        raise StepperError(f"{path}: not a fixture folder (expected a folder with {MANIFEST} and {TENSORS})")
    if not (path / MANIFEST).is_file():
        raise StepperError(f"{path}: no {MANIFEST}; not a fixture folder")
    return path


def read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StepperError(f"{path}: cannot read it as JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise StepperError(f"{path}: not a stepper fixture manifest (format should be '{FORMAT}')")
    if manifest.get("version") != VERSION:
        raise StepperError(f"{path}: fixture format version {manifest.get('version')!r}; this stepper reads version {VERSION}")
    if not isinstance(manifest.get("tensors"), list):
        raise StepperError(f"{path}: no tensor list")
    return manifest


def load(path: Path, check_hashes: bool = True) -> Fixture:
    """A fixture folder: its manifest and tensors, the tensors checked against the manifest."""
    folder = fixture_dir(Path(path))
    manifest = read_manifest(folder)
    tensors: dict[str, np.ndarray] = {}
    with SafetensorsFile(folder / TENSORS) as f:
        for entry in manifest["tensors"]:
            name = entry["name"]
            if name not in f:
                raise StepperError(f"{folder / TENSORS}: tensor '{name}' of the manifest is missing")
            array = np.array(f.get(name))
            if list(array.shape) != entry["shape"]:
                raise StepperError(f"{folder / TENSORS}: tensor '{name}' has shape {list(array.shape)}, "
                                   f"the manifest says {entry['shape']}")
            if check_hashes and sha256_array(array) != entry["sha256"]:
                raise StepperError(f"{folder / TENSORS}: tensor '{name}' does not match its sha256 in the manifest")
            tensors[name] = array
    return Fixture(folder, manifest, tensors)


def check_weights(fixture: Fixture) -> list[str]:
    """Problems with the fixture's copied weights: files missing or differing from their hashes."""
    folder = fixture.weights_path()
    if folder is None:
        return []
    problems = []
    for name, info in fixture.manifest["weights"]["files"].items():
        path = folder / name
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif sha256_file(path) != info["sha256"]:
            problems.append(f"{path}: sha256 differs from the manifest")
    return problems
