"""An HF checkpoint directory, read lazily and strictly.

A directory holds `config.json` and either one `model.safetensors` or shards listed in
`model.safetensors.index.json` (`weight_map`: tensor name -> shard file). Opening it reads the
config, the index and every shard's header, and checks that they agree. Tensor bytes are only
read when a tensor is asked for, through memory maps, so running layer 30 never touches the
other layers' pages. An FP8 weight `X.weight` finds its block scales `X.weight_scale_inv`
through the index: they may live in another shard. With one scale per tensor (weight_block_size
null) `X.weight_scale_inv` holds one value, and a fused experts' tensor one per expert; each is
handed out as that value over a 128x128 block grid (fp8.per_tensor_grid). An INT4
weight (a module a compressed-tensors quantization_config quantizes) is stored as `X.weight_packed`
(I32 words), `X.weight_scale` (its group scales) and `X.weight_shape` ([out, in]), and is read and
checked as one weight `X.weight`.

A shard that is missing or cannot be read (people download only the shards of the layers they
look at) is an error only for a run that needs one of its tensors; `unreadable` says which
shards were left out and why. A .safetensors file beside them that the index does not name (a
consolidated copy of the shards, as some repositories keep) is never read, as transformers never
reads it: `strays` names them, for a note, and a tensor a run needs that only such a file holds is
reported missing with where it is.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

import numpy as np

from stepper import fp4, fp8, int4
from stepper.config import Config, load_config
from stepper.errors import StepperError
from stepper.untrusted import is_safe
from stepper.untrusted.jsonfile import read_json
from stepper.untrusted.paths import found, why
from stepper.weights.config_hint import contradicted_field
from stepper.weights.fused_experts import expert_of, expert_start, expert_view, fused_name, stored_shapes
from stepper.weights.names import (
    QUOTED_TEXT_NAME,
    global_shapes,
    layer_globals,
    layer_prefix,
    layer_shapes,
    named_on_disk,
    optional_layer_shapes,
    storage_dtype,
    stored_name,
    text_name,
    zero_layer_shapes,
)
from stepper.weights.partial import partial_text
from stepper.weights.safetensors_reader import MappedBudget, SafetensorsFile, TensorInfo
from stepper.weights.stored import INT4, FileBytes, Stored

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
SCALE = "_scale_inv"
PACKED, GROUP_SCALE, WEIGHT_SHAPE = "_packed", "_scale", "_shape"  # X.weight of an INT4 module: X.weight_packed, ...
INT4_SCALE_DTYPES = ("BF16", "F16", "F32")
SHAPE_DTYPES = ("I64", "I32")  # an INT4 weight's weight_shape: its [out, in] as integers
FLOAT_DTYPES = ("F32", "BF16", "F16")
SCALE_DTYPES = (*FLOAT_DTYPES, "F8_E8M0")  # E8M0: a power of two 2^(e - 127), as newer checkpoints store scales
SHARD_SUFFIX = ".safetensors"
LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.")
LARGE = 1 << 20  # tensors from this size on are tracked for release
RESIDENT_BYTES = 1 << 30  # bytes of large tensors kept mapped before the oldest are released (see _keep_resident)


class Checkpoint:
    """A WeightSource over an HF checkpoint directory."""

    reads_values = True  # whether `inspect` reads every block scale's values (a remote one lists headers alone)

    def __init__(self, path: str | Path, read_config: Callable[[str | Path], Config] = load_config):
        """read_config: of the folder's config.json (MLA's reader unless given; a run passes
        stepper.families.load_config, which reads any registered family's)."""
        self.path = Path(path)
        if found(self.path) != "folder":
            raise StepperError(f"{self.path}: not a checkpoint directory")
        if not found(self.path / "config.json"):
            raise StepperError(f"{self.path}: not a checkpoint directory (no config.json)")
        self.config: Config = read_config(self.path / "config.json")
        self.weight_map = self._read_weight_map()
        self.strays = stray_files(self.path, set(self.weight_map.values()))
        self.shards: dict[str, SafetensorsFile] = {}
        self.unreadable: dict[str, str] = {}  # shard -> why it cannot be read
        self.disagreements: dict[str, Problem] = {}  # tensor -> where the index and a header disagree on it
        for shard in sorted(set(self.weight_map.values())):
            self._open_shard(shard)
        self._resident = MappedBudget(RESIDENT_BYTES)
        self._good_scales: set[str] = set()  # FP8 block and INT4 BF16 group scales checked once: the same bytes
        self._check_index_against_headers()
        self.unused: dict[str, str] = {}  # tensor -> shard, of a wrapper's parts no run reads (vision tower)
        self.stored_as: dict[str, str] = {}  # a tensor's name -> the name its file stores it by, where they differ
        if self.config.wrapper is not None or getattr(self.config, "read_name", None) is not None:
            self._resolve_names()

    @property
    def label(self) -> str:
        """How messages and headers name the checkpoint."""
        return str(self.path)

    # -- reading -----------------------------------------------------------------------------

    def get(self, name: str) -> np.ndarray:
        with self._named_on_disk():
            return self.stored(name).as_float32(name)

    def get_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Rows of a table (the embedding's, a token's each), the table checked as a run checks the
        globals: a run of one layer reads it without them."""
        shape = global_shapes(self.config).get(name)
        with self._named_on_disk():
            problems = self._problems(name, shape) if shape is not None else []
            if problems:
                raise StepperError(f"{self.label}: {problems[0]}")
            stored = self.stored(name)
            if stored.dtype == "F8_E4M3":
                return stored.as_float32(name)[rows]
        return np.asarray(stored.data[rows], dtype=np.float32)  # touches only these rows' pages

    def row_bands(self, name: str, rows: int) -> Iterator[Stored]:
        """Views of the mapped tensor, band by band; a band's pages are released once the next
        band is asked for, so reading all of lm_head (2.3 GB in BF16) keeps one band resident."""
        stored_name = self._stored_name(name)  # an INT4 lm_head: its packed words
        shard = self.shard_of(stored_name)
        with self._named_on_disk():
            bands = self.stored(name).row_bands(rows)
        for band in bands:
            yield band
            shard.release(stored_name)

    def has(self, name: str) -> bool:
        return self._stored_name(name) in self.weight_map

    def _stored_name(self, name: str) -> str:
        """The tensor holding a weight's codes: X.weight_packed for an INT4 weight X.weight, the
        fused experts' tensor for an expert's weight where they are stored fused."""
        if self.config.fused_experts and (fused := fused_name(name)) is not None:
            return fused
        return name + PACKED if self.config.int4 is not None and storage_dtype(self.config, name) == INT4 else name

    def matrix(self, name: str):
        """A weight about to be multiplied: its pages are mapped in one go."""
        stored_name = self._stored_name(name)
        if self.has(name) and self.shard_of(stored_name).info(stored_name).nbytes >= LARGE:
            self.shard_of(stored_name).prefetch(stored_name)
        with self._named_on_disk():
            return self.stored(name).matrix(name)

    def stored(self, name: str) -> Stored:
        with self._named_on_disk():
            return self._stored(name)

    @contextmanager
    def _named_on_disk(self) -> Iterator[None]:
        """A refusal raised inside names each tensor as the files do (a wrapped checkpoint's text
        tensors with their prefix): stepper reads them by the text model's names."""
        try:
            yield
        except StepperError as e:
            raise StepperError(self.on_disk(str(e))) from None

    def on_disk(self, message: str) -> str:
        """A message naming each tensor it quotes as the files do."""
        if self.stored_as and self.config.wrapper is None:  # Hy4's files: its modules' names renamed back
            return QUOTED_TEXT_NAME.sub(lambda m: f"'{self._as_stored(m[1])}'", message)
        return named_on_disk(self.config, message)

    def _as_stored(self, name: str) -> str:
        """A tensor's name as the files store it, or (one they lack) as they store it in another layer."""
        if name in self.stored_as:
            return self.stored_as[name]
        if (write_name := getattr(self.config, "write_name", None)) is not None:  # the family says (Mistral Large 4)
            return write_name(name)
        if not (found := LAYER_NAME.match(name)):
            return name
        rest = name[found.end():]
        sibling = next((stored for read, stored in self.stored_as.items()
                        if (other := LAYER_NAME.match(read)) and read[other.end():] == rest), None)
        return name if sibling is None else LAYER_NAME.sub(found[0], sibling, count=1)

    def _stored(self, name: str) -> Stored:
        if self.config.fused_experts and (fused := fused_name(name)) is not None:
            return self._expert(fused, name)
        if self._stored_name(name) != name:
            return self._int4(name)
        self._keep_resident(name)
        shard = self.shard_of(name)
        info, array = shard.info(name), shard.get(name)
        where = FileBytes(str(shard.path), shard.data_range(name)[0], shard.identity)
        if info.dtype != "F8_E4M3":  # where: a BF16 weight decoded into kept memory is known again (float32_kept)
            return Stored(info.dtype, array, origin=where)
        _, scale = self._tensor(name + SCALE)
        self._check_scales_once(name + SCALE, scale)
        if self.per_tensor:
            one = self._one_scale(name + SCALE, scale, 1)[0, 0]
            return Stored(info.dtype, array, fp8.per_tensor_grid(array.shape, one), fp8.BLOCK, where)
        return Stored(info.dtype, array, scale, self.block, where)

    def _expert(self, fused: str, name: str) -> Stored:
        """One expert's matrix, a view of its fused tensor; in FP8 with its expert's scale."""
        self._keep_resident(fused)
        shard = self.shard_of(fused)
        info, whole = shard.info(fused), shard.get(fused)
        view = expert_view(whole, name)  # [rows, cols]
        if info.dtype in FLOAT_DTYPES:
            return Stored(info.dtype, view)
        if info.dtype != "F8_E4M3" or not self.per_tensor:
            raise StepperError(f"{self.label}: '{fused}' is {info.dtype}: stepper reads fused experts in "
                               f"{', '.join(FLOAT_DTYPES)}, or F8_E4M3 with one scale per expert")
        _, scales = self._tensor(fused + SCALE)
        scale = self._one_scale(fused + SCALE, scales, whole.shape[0])[expert_of(name), 0]
        start = FileBytes(str(shard.path), shard.data_range(fused)[0], shard.identity)
        where = start.at(expert_start(whole.shape, name))  # one byte per code
        return Stored(info.dtype, view, fp8.per_tensor_grid(view.shape, scale), fp8.BLOCK, where)

    def _check_scales_once(self, name: str, scale: np.ndarray) -> None:
        """check_scale_values on a weight's block scales the first time they are read: a weight
        is asked for at every step (an expert's each time it runs), from the same map's bytes."""
        if name not in self._good_scales:
            check_scale_values(f"{self.label}: {self.shard_of(name).path.name}", name, scale)
            self._good_scales.add(name)

    def _one_scale(self, name: str, scale: np.ndarray, count: int) -> np.ndarray:
        """A per-tensor scale (count 1) or a fused experts' scales (count E), as float32 [count, 1],
        checked: of the shape per_tensor_scale_shapes allows, finite and above zero."""
        file = self.shard_of(name).path.name
        scale = np.asarray(scale)
        if scale.shape not in per_tensor_scale_shapes(count):
            raise StepperError(f"{file}: '{name}' has shape {list(scale.shape)}, expected "
                               f"{' or '.join(str(list(s)) for s in per_tensor_scale_shapes(count))}: one scale per "
                               f"{'tensor' if count == 1 else 'expert'} (weight_block_size null)")
        check_scale_values(f"{self.label}: {file}", name, scale)
        return fp8.scales_as_f32(scale, name).reshape(count, 1)

    def _int4(self, name: str) -> Stored:
        """An INT4 weight: its packed words, where they lie, its group scales (checked finite) and its inputs.
        BF16 scales found good are not looked at again, here or by Int4Matrix.of: they are read from
        the same memory map each time (as FP8 codes found without NaNs, fp8_tiles.NanCheck), and an
        expert's weights recur at every step."""
        packed = name + PACKED
        self._keep_resident(packed)
        shard = self.shard_of(packed)
        words = shard.get(packed)
        _, in_dim = self._weight_shape(name, words.shape[0])
        scale_name = name + GROUP_SCALE
        scales = self.shard_of(scale_name).get(scale_name)
        group = self.config.int4.group_size
        if scale_name not in self._good_scales:
            scales = check_int4_scales(self.shard_of(scale_name).path.name, scale_name, scales)
            if scales.dtype.name == "bfloat16":  # kept as stored (others are a float32 copy, made each time)
                self._good_scales.add(scale_name)
        where = FileBytes(str(shard.path), shard.data_range(packed)[0], shard.identity)
        return Stored(INT4, words, scales, (1, group), where, in_dim, checked=True)

    def _weight_shape(self, name: str, rows: int) -> tuple[int, int]:
        """X.weight_shape's two values, [out, in] (checked against the packed rows)."""
        shape_name = name + WEIGHT_SHAPE
        info = self.shard_of(shape_name).info(shape_name)
        if info.dtype not in SHAPE_DTYPES or tuple(info.shape) != (2,):
            raise StepperError(f"{self.shard_of(shape_name).path.name}: '{shape_name}' is {info.dtype} "
                               f"{list(info.shape)}, expected {' or '.join(SHAPE_DTYPES)} [2]: the INT4 weight's "
                               "[out, in]")
        values = [int(v) for v in self.shard_of(shape_name).values(shape_name).reshape(-1)]
        if len(values) != 2 or values[0] != rows or values[1] < 1:
            raise StepperError(f"{self.shard_of(shape_name).path.name}: '{shape_name}' holds {values}, expected "
                               f"[{rows}, in] for {rows} rows of packed words")
        return values[0], values[1]

    @property
    def block(self) -> tuple[int, int]:
        return self.config.quantization.weight_block_size if self.config.quantization else fp8.BLOCK

    @property
    def per_tensor(self) -> bool:
        """Whether each FP8 weight has one scale (each fused experts' tensor one per expert)."""
        return self.config.quantization is not None and self.config.quantization.per_tensor

    def _keep_resident(self, name: str) -> None:
        """Mapped pages count as this process's memory: past RESIDENT_BYTES of large tensors,
        the least recently used are released (they stay in the page cache, and fault back in).

        The count is of whole tensors, rounded out to the blocks a fault maps, but with FP8
        helpers this process maps only its band of a shared product's rows, about half on two
        cores: at 768 MiB, a 16-expert layer's 850 MB of weights did not fit, and every run of
        it mapped all of its pages afresh."""
        shard = self.shard_of(name)
        if shard.info(name).nbytes >= LARGE:
            self._resident.use(name, shard.mapped_bytes(name), lambda: shard.release(name))

    def shard_of(self, name: str) -> SafetensorsFile:
        with self._named_on_disk():
            return self._shard_of(name)

    def _shard_of(self, name: str) -> SafetensorsFile:
        if name in self.disagreements:
            raise StepperError(f"{self.label}: {self.disagreements[name].text}")
        if name not in self.weight_map:
            raise StepperError(f"{self.label}: no tensor named '{name}'")
        shard = self.weight_map[name]
        if shard in self.unreadable:
            raise StepperError(f"{self.label}: {shard} cannot be read ({self.unreadable[shard]}); it holds '{name}'")
        return self.shards[shard]

    def _tensor(self, name: str):
        shard = self.shard_of(name)
        return shard.info(name), shard.get(name)

    # -- checking ----------------------------------------------------------------------------

    LISTED = 10  # problems a run's refusal lists; inspect lists them all

    def check(self, layers: Iterable[int], with_globals: bool) -> None:
        """Every tensor the given layers (and the embedding/norm/lm_head) need, with the right
        shape, dtype and scales; all problems reported together, by name, before any compute."""
        layers = list(layers)
        problems = self.problems(layers, with_globals)
        if len(problems) == 1:
            raise StepperError(f"{self.label}: {problems[0]}{hinted(self.config_hint(layers, with_globals))}")
        if problems:
            listed = "\n".join(f"  - {p}" for p in problems[: self.LISTED])
            if len(problems) > self.LISTED:  # a config.json that does not describe these weights: every layer disagrees
                listed += (f"\n  ... and {len(problems) - self.LISTED} more (stepper inspect lists every one; this "
                           "many usually means config.json does not describe these weights)")
            raise StepperError(f"{self.label}: {len(problems)} problem(s) with the weights of this run:\n{listed}"
                               + hinted(self.config_hint(layers, with_globals)))

    def config_hint(self, layers: Iterable[int], with_globals: bool) -> str | None:
        """The config.json field these weights contradict, judged on the first of the layers the
        checkpoint holds with a tensor of another shape (config_hint), or None."""
        present = set(self.present_layers())
        stored = cache(self._stored_shape)  # each tried value looks at every tensor again (an INT4 one's values)
        for layer in (layer for layer in layers if layer in present):
            def shapes_of(cfg: Config, layer: int = layer) -> dict[str, tuple[int, ...]]:
                shapes = layer_shapes(cfg, layer)
                if with_globals:
                    shapes.update({name: shape for name, shape in global_shapes(cfg).items()
                                   if name in self.weight_map})
                return stored_shapes(shapes) if cfg.fused_experts else shapes

            if all(stored(name) == shape for name, shape in shapes_of(self.config).items()):
                continue
            prefix = layer_prefix(layer)
            sizes = [size for name in self.weight_map if name.startswith(prefix)
                     for size in stored(name) or ()]
            return contradicted_field(self.config, shapes_of, stored, sizes, layer)
        return None

    def _stored_shape(self, name: str) -> tuple[int, ...] | None:
        """A tensor's shape as stored (an INT4 weight's [out, in] from its weight_shape), None if
        it is absent or cannot be read."""
        try:
            if self._stored_name(name) != name and name + PACKED in self.weight_map:
                return self._weight_shape(name, self.shard_of(name + PACKED).info(name + PACKED).shape[0])
            return tuple(self.shard_of(name).info(name).shape) if name in self.weight_map else None
        except StepperError:
            return None

    def problems(self, layers: Iterable[int], with_globals: bool, values: bool = True) -> list[Problem]:
        """What `check` refuses, as data: each problem with its file, its tensor and what is wrong;
        `values`: with those only a tensor's values show (a remote checkpoint's inspect reads headers alone)."""
        layers = list(layers)
        present = self.present_layers()
        absent = [layer for layer in layers if layer not in present]
        globals_absent = with_globals and not any(name in self.weight_map for name in global_shapes(self.config))
        required: dict[str, tuple[int, ...]] = {}
        for layer in layers:
            if layer in present:
                required.update(layer_shapes(self.config, layer))
                required.update({name: shape for name, shape in optional_layer_shapes(self.config, layer).items()
                                 if name in self.weight_map or name in self.disagreements})  # held: checked
        if with_globals and not globals_absent:
            required.update(global_shapes(self.config))
        elif any(layer in present for layer in layers):
            required.update(layer_globals(self.config))
        if self.config.fused_experts:
            required = stored_shapes(required)
        problems = self._partial_problems(present, absent, globals_absent) + self._fused_problems(required)
        problems += self._unreadable_problems(required)
        problems += [p for name, shape in required.items()
                     if self.weight_map.get(self._stored_name(name)) not in self.unreadable
                     for p in self._problems(name, shape)]
        problems += [p for name, p in self.disagreements.items()
                     if name not in required and in_scope(name, layers, with_globals)]
        if values:
            problems += self._nonzero_problems([layer for layer in layers if layer in present], problems)
        return self.named_on_disk(said_once(problems + self._orphan_scales(layers, with_globals, required)))

    def _nonzero_problems(self, layers: list[int], found: list[Problem]) -> list[Problem]:
        """Each tensor of zero_layer_shapes held, readable, not `found` wrong, with a value other than zero."""
        problems, named = [], {p.tensor for p in found}
        for name in (n for layer in layers for n in zero_layer_shapes(self.config, layer)
                     if n in self.weight_map and n not in named and self.weight_map[n] not in self.unreadable):
            values = self.get(name)
            if np.any(values != 0):
                shard = self.weight_map[name]
                problems.append(Problem(shard, name, (
                    f"{shard}: '{name}' holds {int(np.count_nonzero(values))} value(s) other than zero: stepper's "
                    f"{self.config.model_type} layer reads no such tensor, so it must hold zeros (as transformers "
                    "saves it) or be left out (as published)")))
        return problems

    def named_on_disk(self, problems: list[Problem]) -> list[Problem]:
        """The problems' sentences naming each tensor as the files do (stdout's rows list a wrapped
        checkpoint's text tensors without their prefix, by `tensor`)."""
        return [replace(p, text=self.on_disk(p.text)) for p in problems]

    def present_layers(self) -> list[int]:
        """The config's layers holding at least one tensor, in order."""
        found = {int(m[1]) for m in map(LAYER_NAME.match, self.weight_map) if m}
        return sorted(layer for layer in found if layer < self.config.num_hidden_layers)

    def _partial_problems(self, present: list[int], absent: list[int], globals_absent: bool) -> list[Problem]:
        """One problem for layers (or an embedding, norm and lm_head) the checkpoint holds no tensor
        of, instead of one per tensor of them: the layers it holds and how to look at them."""
        if not absent and not globals_absent:
            return []
        has_globals = any(name in self.weight_map for name in global_shapes(self.config))
        return [Problem(None, None, partial_text(present, self.config.num_hidden_layers, has_globals))]

    def _fused_problems(self, required: dict[str, tuple[int, ...]]) -> list[Problem]:
        """One problem for routed experts stored fused where config.json's family stores them one by
        one (transformers' model as state_dict() gives it), taken out of `required`: not one per expert."""
        held = [n for n in required if n not in self.weight_map and fused_name(n, "gate_up_proj") in self.weight_map]
        if self.config.fused_experts or not held:
            return []
        cfg, first, expected = self.config, held[0], list(required[held[0]])
        for name in [n for n in required if fused_name(n) in self.weight_map]:
            del required[name]
        fused = fused_name(first)
        shard, shape = self.weight_map[fused], list(self.shard_of(fused).info(fused).shape)
        layers = len({fused_name(n) for n in held})
        slots = f" (its {shape[0]} slots: {cfg.n_routed_experts} routed experts and {cfg.zero_experts} zero experts, " \
                "which have no weights)" if cfg.zero_experts else ""
        also = f" ({count(layers - 1, 'more layer')} likewise)" if layers > 1 else ""
        return [Problem(shard, fused, f"{shard}: '{fused}' {shape}{also} holds the experts fused, as transformers' "
                        f"model holds them in memory{slots}; a {cfg.model_type} checkpoint stores each routed expert "
                        f"by itself ('{first}' {expected}, ...): transformers' save_pretrained writes them so")]

    def _unreadable_problems(self, required: dict[str, tuple[int, ...]]) -> list[Problem]:
        """One line per shard the run needs and cannot read, however many of its tensors it needs
        (an INT4 weight counted by the shard of its packed codes)."""
        needed: dict[str, list[str]] = {}
        for name in required:
            shard = self.weight_map.get(self._stored_name(name))
            if shard in self.unreadable:
                needed.setdefault(shard, []).append(name)
        return [Problem(shard, names[0], f"{shard} cannot be read ({self.unreadable[shard]}); it holds "
                        f"{count(len(names), 'tensor')} of the layers checked, first '{names[0]}'") for shard,
                        names in needed.items()]

    def _orphan_scales(self, layers: list[int], with_globals: bool, required: dict) -> list[Problem]:
        """Block scales of the run's layers whose weight is not in the checkpoint (and not already
        reported missing)."""
        prefixes = tuple(f"model.layers.{layer}." for layer in layers)
        return [Problem(shard, name, f"'{name}' is a block scale with no weight '{name.removesuffix(SCALE)}'")
                for name, shard in self.weight_map.items()
                if name.endswith(SCALE) and name.removesuffix(SCALE) not in self.weight_map
                and name.removesuffix(SCALE) not in required
                and (name.startswith(prefixes) or (with_globals and not name.startswith("model.layers.")))]

    def _problems(self, name: str, shape: tuple[int, ...]) -> list[Problem]:
        if name in self.disagreements:
            return [self.disagreements[name]]
        if self._stored_name(name) != name:
            return self._int4_problems(name, shape)
        if name not in self.weight_map:
            packed = f" (the checkpoint holds '{name + PACKED}', but config.json's quantization_config does not " \
                     f"quantize this module)" if name + PACKED in self.weight_map else ""
            return [Problem(None, name, f"'{name}' is missing (expected shape {list(shape)}){packed}"
                                        f"{self._stray_holding(name)}")]
        shard = self.shard_of(name)
        info = shard.info(name)
        where = f"{shard.path.name}: '{name}'"
        if info.shape != shape:
            return [Problem(shard.path.name, name, f"{where} has shape {list(info.shape)}, expected {list(shape)}")]
        if info.dtype != "F8_E4M3" and info.dtype not in FLOAT_DTYPES:
            return [Problem(shard.path.name, name,
                            f"{where} has dtype {info.dtype}, expected F8_E4M3, BF16, F16 or F32")]
        scale_name = name + SCALE
        if self.weight_map.get(scale_name) in self.unreadable:
            scale_shard = self.weight_map[scale_name]
            return [Problem(scale_shard, scale_name, f"'{scale_name}' lies in {scale_shard}, which cannot be read "
                            f"({self.unreadable[scale_shard]})")]
        scale = self.shard_of(scale_name).info(scale_name) if scale_name in self.weight_map else None
        scale_file = self.weight_map.get(scale_name)
        return [Problem(scale_file, scale_name, text)
                for text in scale_problems(info, scale, None if self.per_tensor else self.block, scale_file)]

    def _int4_problems(self, name: str, shape: tuple[int, ...]) -> list[Problem]:
        """An INT4 weight's three tensors: present and readable, with dtypes and shapes that agree
        with the weight's [out, in] (its weight_shape's values too)."""
        out_dim, in_dim = shape
        group = self.config.int4.group_size
        if in_dim % group:
            return [Problem(None, name, f"'{name}' {list(shape)}: {in_dim} inputs are not a whole number of groups of "
                            f"{group}, and pack-quantized INT4 has no partial groups")]
        expected = {PACKED: (("I32",), (out_dim, int4.words_for(in_dim))),
                    GROUP_SCALE: (INT4_SCALE_DTYPES, (out_dim, int4.groups_for(in_dim, group))),
                    WEIGHT_SHAPE: (SHAPE_DTYPES, (2,))}
        problems = []
        for suffix, (dtypes, want) in expected.items():
            tensor = name + suffix
            shard = self.weight_map.get(tensor)
            if shard is None:
                if name in self.weight_map:
                    why = f"'{name}' is stored unquantized, but config.json's quantization_config quantizes this module"
                else:
                    why = f"'{tensor}' is missing: the INT4 weight '{name}' {list(shape)} needs it"
                problems.append(Problem(None, tensor, why))
                continue
            if shard in self.unreadable:
                problems.append(Problem(shard, tensor,
                                        f"{shard} cannot be read ({self.unreadable[shard]}); it holds '{tensor}'"))
                continue
            info = self.shards[shard].info(tensor)
            if info.dtype not in dtypes or info.shape != want:
                problems.append(Problem(shard, tensor,
                                        f"{shard}: '{tensor}' is {info.dtype} {list(info.shape)}, expected "
                                        f"{' or '.join(dtypes)} {list(want)} for the INT4 weight '{name}' "
                                        f"{list(shape)}"))
        if not problems:
            problems += self._shape_values(name, shape)
        return problems

    def _shape_values(self, name: str, shape: tuple[int, ...]) -> list[Problem]:
        tensor = name + WEIGHT_SHAPE
        values = [int(v) for v in self.shard_of(tensor).values(tensor)]
        if values == list(shape):
            return []
        shard = self.weight_map[tensor]
        return [Problem(shard, tensor,
                        f"{shard}: '{tensor}' holds {values}, expected {list(shape)} (config.json's shape)")]

    # -- the index ---------------------------------------------------------------------------

    def stray_note(self) -> str | None:
        """A note naming the .safetensors files no run reads (`strays`), None when there are none."""
        if not self.strays:
            return None
        listed = ", ".join(self.strays[:STRAYS_NAMED]) + (f" and {len(self.strays) - STRAYS_NAMED} more"
                                                          if len(self.strays) > STRAYS_NAMED else "")
        are, them = ("is", "it") if len(self.strays) == 1 else ("are", "them")
        return f"note: {listed} {are} in {self.label} but {self._unnamed()}: no run reads {them}"

    def _unnamed(self) -> str:
        """Why a stray file is not read: the index does not name it, or model.safetensors is read alone."""
        return f"not in {INDEX}" if found(self.path / INDEX) else f"beside {SINGLE}, which is read alone"

    def _stray_holding(self, name: str) -> str:
        """Where a tensor missing from the checkpoint is after all: '; it is in X, ...' naming a stray file that
        holds it, or ''."""
        stored = stored_name(self.config, name)
        holding = [stray for stray in self.strays if stored in stray_names(self.path / stray)]
        return f"; it is in {holding[0]}, which is {self._unnamed()}" if holding else ""

    def _read_weight_map(self) -> dict[str, str]:
        index = self.path / INDEX
        if not found(index):
            if found(self.path / SINGLE):
                return dict.fromkeys(SafetensorsFile(self.path / SINGLE).names(), SINGLE)
            raise StepperError(f"{self.path}: neither {INDEX} nor {SINGLE} found")
        raw = read_json(index, "the checkpoint index")
        weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise StepperError(f"{index}: expected an object with a 'weight_map' of tensor name -> shard file")
        for name, shard in weight_map.items():
            self._check_shard_name(index, name, shard)
        if found(self.path / SINGLE) and set(weight_map.values()) - {SINGLE}:
            raise StepperError(f"{self.path}: holds both {SINGLE} and {INDEX}, whose shards are other files: "
                               f"transformers reads {SINGLE} alone, stepper would read the shards; keep the one "
                               "that holds this model's weights")
        return weight_map

    def _check_shard_name(self, index: Path, tensor: str, shard: str) -> None:
        if not is_plain_shard_name(shard):
            raise StepperError(f"{index}: tensor {tensor!r} points at shard {shard!r}, expected a file name "
                               f"ending in {SHARD_SUFFIX} in {self.path}")

    def open_file(self, path: Path) -> SafetensorsFile:
        """A shard's reader (a remote checkpoint's fetches what is read)."""
        return SafetensorsFile(path)

    def _open_shard(self, shard: str) -> None:
        """Read a shard's header; a shard that is missing or unsound is noted, not yet an error."""
        path = self.path / shard
        if not path.is_file():
            self.unreadable[shard] = not_a_file(path)
            return
        try:
            self.shards[shard] = self.open_file(path)
        except StepperError as e:
            self.unreadable[shard] = str(e).removeprefix(f"{path}: ")

    def _resolve_names(self) -> None:
        """A wrapped checkpoint's tensors by the names stepper knows (`language_model.` dropped);
        the vision tower's and projector's go to `unused`, out of reach of any run. Hy4's by its
        transformers modules' names (names.text_name)."""
        self.stored_as = {name: stored for name, stored in self._renamed(lambda s: text_name(self.config, s)).items()
                          if name != stored}

    def _renamed(self, name_of: Callable[[str], str | None]) -> dict[str, str]:
        """The tensors by the names stepper reads them by (`name_of` a stored name; None: a tensor
        no run reads, put in `unused`), in the map, the shards' headers and the disagreements (whose
        texts keep the names on disk); two stored tensors standing for one name refused.
        -> the name read by -> the name stored under"""
        stored_as: dict[str, str] = {}
        named: dict[str, str] = {}
        for stored, shard in self.weight_map.items():
            name = name_of(stored)
            if name is None:
                self.unused[stored] = shard
                continue
            if name in named:
                raise StepperError(f"{self.path}: tensors '{stored_as[name]}' and '{stored}' both stand for '{name}'")
            named[name], stored_as[name] = shard, stored
        self.weight_map = named
        renamed = {stored: name for name, stored in stored_as.items() if stored != name}
        read_as = {n: name_of(n) or n for n in self.disagreements}
        self.disagreements = {read_as[n]: replace(p, tensor=read_as[n]) for n, p in self.disagreements.items()}
        for file in self.shards.values():
            file.tensors = {renamed.get(n, n): replace(info, name=renamed.get(n, n)) for n,
                            info in file.tensors.items()}
        return stored_as

    def _check_index_against_headers(self) -> None:
        """The index and the shards' headers must name the same tensors. A tensor listed but not in
        its shard is taken out of the map (nothing will read it) and, with a tensor in a shard but
        not listed, noted in `disagreements`: a problem for a run that needs it, not yet an error."""
        listed_in: dict[str, set[str]] = {}
        for name, shard in list(self.weight_map.items()):
            if shard in self.unreadable:
                continue
            listed_in.setdefault(shard, set()).add(name)
            if name not in self.shards[shard]:
                del self.weight_map[name]
                self.disagreements[name] = Problem(shard, name,
                                                   f"{shard}: '{name}' is listed in {INDEX} but not in this shard")
        for shard, names in listed_in.items():
            for extra in sorted(set(self.shards[shard].names()) - names):
                listed = self.disagreements.get(extra)
                if listed:
                    text = f"{listed}; it is in {shard}"
                elif extra in self.weight_map:  # a second copy: the index names the other
                    named = self.weight_map[extra]
                    text = (f"'{extra}' is in {named}, as {INDEX} says, and in {shard} too: two copies, of which "
                            f"transformers reads the one in {max(named, shard)} (it loads the shards in order)")
                else:
                    text = f"{shard}: '{extra}' is in this shard but not in {INDEX}"
                self.disagreements[extra] = Problem(listed.file if listed else shard, extra, text)


STRAYS_NAMED = 3  # stray files a note names before it counts the rest


def stray_files(folder: Path, named: set[str]) -> list[str]:
    """The .safetensors files in the folder that are not among the shards `named` (and not hidden), sorted;
    whatever they are, no run opens them."""
    try:
        entries = os.listdir(folder)
    except OSError:
        return []
    return sorted(e for e in entries if e not in named and is_plain_shard_name(e))


def stray_names(path: Path) -> frozenset[str]:
    """The tensor names in a stray file's header; none when it cannot be read (or is no file)."""
    try:
        return frozenset(SafetensorsFile(path).names())
    except (StepperError, OSError):
        return frozenset()


def is_plain_shard_name(shard: str) -> bool:
    """A shard is a plain file name in the checkpoint's folder ending in .safetensors: no
    folders, no absolute path, no drive letter, no backslash, no '..', no control character."""
    plain = (Path(shard).name == shard and not any(c in shard for c in "\\:") and not shard.startswith(".")
             and is_safe(shard))
    return plain and shard.endswith(SHARD_SUFFIX) and len(shard) > len(SHARD_SUFFIX)


def not_a_file(path: Path) -> str:
    """Why a shard's path is no file to read: absent, a folder, a FIFO or device, a loop of links."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "no such file"
    except OSError as e:  # a loop of symbolic links, a denied folder
        return why(e)
    return "a folder, not a file" if stat.S_ISDIR(mode) else "not a regular file: a FIFO or a device"


def in_scope(name: str, layers: Iterable[int], with_globals: bool) -> bool:
    """Whether a tensor belongs to one of the layers, or is a global one and globals are checked."""
    m = LAYER_NAME.match(name)
    return int(m[1]) in layers if m else with_globals


def count(n: int, noun: str) -> str:
    """'1 tensor', '3 tensors'."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def hinted(hint: str | None) -> str:
    """A refusal's last line: the config field the weights contradict, if one is found."""
    return f"\n{hint}" if hint else ""


def said_once(problems: list[Problem]) -> list[Problem]:
    """The problems, each sentence of a file once: the three parts of an INT4 weight stored
    unquantized are one problem, not three identical lines."""
    kept: dict[tuple[str | None, str], Problem] = {}
    for p in problems:
        kept.setdefault((p.file, p.text), p)
    return list(kept.values())


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a checkpoint: the file it concerns (None when the tensor is in none),
    the tensor, and the whole sentence saying what is wrong, as `check` lists it."""

    file: str | None
    tensor: str | None
    text: str

    def __str__(self) -> str:
        return self.text


def per_tensor_scale_shapes(count: int) -> tuple[tuple[int, ...], ...]:
    """The shapes one scale per tensor may be stored in (count 1), or a fused experts' tensor's one
    scale per expert (count E: [E, 1, 1] as transformers' Mistral 4 conversion writes it, or [E])."""
    return ((), (1,), (1, 1)) if count == 1 else ((count, 1, 1), (count,))


def scale_problems(weight: TensorInfo, scale: TensorInfo | None, block: tuple[int, int] | None,
                   scale_file: str | None) -> list[str]:
    """What is wrong with a weight's block scales, given the weight's and the scales' headers:
    an F8_E4M3 weight needs a 2-D weight and scales of a float dtype on its block grid (block
    None: one scale for a 2-D weight, one per expert for a fused experts' [E, rows, cols]); any
    other weight has no scales."""
    name = weight.name + SCALE
    if weight.dtype != "F8_E4M3":
        if scale is None:
            return []
        return [f"'{name}' is a block scale for a {weight.dtype} weight; only F8_E4M3 weights have scales"]
    if scale is None:
        return [f"'{name}' is missing: the F8_E4M3 weight '{weight.name}' needs its block scales"]
    where = f"{scale_file}: '{name}'"
    if scale.dtype not in SCALE_DTYPES:
        return [f"{where} has dtype {scale.dtype}, expected F32, BF16, F16 or F8_E8M0"]
    if block is None and len(weight.shape) in (2, 3):
        allowed = per_tensor_scale_shapes(1 if len(weight.shape) == 2 else weight.shape[0])
        if scale.shape in allowed:
            return []
        per = "tensor" if len(weight.shape) == 2 else "expert"
        return [(f"{where} has shape {list(scale.shape)}, expected {' or '.join(str(list(s)) for s in allowed)} "
                 f"for a {list(weight.shape)} weight with one scale per {per}")]
    if len(weight.shape) != 2:
        return [f"'{weight.name}' is an F8_E4M3 weight of shape {list(weight.shape)}, expected 2-D [out, in]"]
    expected = fp8.scale_grid(weight.shape, block)
    if scale.shape != expected:
        blocks = f"{block[0]}x{block[1]} blocks"
        return [(f"{where} has shape {list(scale.shape)}, expected {list(expected)} for a {list(weight.shape)} weight "
                f"in {blocks}")]
    return []


def check_int4_scales(shard: str, name: str, scales: np.ndarray) -> np.ndarray:
    """Group scales multiply every weight of their group: each must be finite (and -8 times it
    too) and above zero, as FP8's block scales. A symmetric quantizer writes max|w| / 7.5 (1 for
    an all-zero group): a scale of zero would make every weight of the group 0 whatever its codes
    say, a negative one would flip the group's signs (its codes then span -7..8). Returns them as
    the weight keeps them (int4.kept_scales): BF16 ones as stored, checked on their 16-bit patterns
    (two passes of min and max, no copy), others as float32."""
    scales = np.asarray(scales)
    if scales.dtype.name == "bfloat16" and int4.bf16_within(scales, 1):  # 1: +0 left out
        return scales
    values = int4.float32_scales(scales)
    if values.size == 0 or (values.min() > 0 and values.max() <= int4.LARGEST_SCALE):  # False for a NaN
        return values
    bad = ~(np.abs(values) <= int4.LARGEST_SCALE)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise StepperError(f"{shard}: '{name}' holds {int(bad.sum())} group scale(s) that are not finite, "
                           f"first {values[where]} at {list(where)}")
    bad = values <= 0
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise StepperError(f"{shard}: '{name}' holds {int(bad.sum())} group scale(s) of zero or below, first "
                           f"{values[where]} at {list(where)}: a symmetric quantizer writes max|w| / 7.5 > 0; zero "
                           "loses the group's weights, a negative scale flips their signs")
    return values


def check_scale_values(shard: str, name: str, scale: np.ndarray) -> None:
    """Block scales multiply every weight of their block: each must be finite and above zero. E8M0
    scales (DeepSeek-V4's) have no sign, zero or infinity: their bytes are looked at for NaN's
    alone, about 15x faster than the float32 values (a V4-Flash expert's [2048, 128] scales, each
    time an expert is used)."""
    scale = np.asarray(scale)
    if scale.dtype.name == "float8_e8m0fnu" and scale.view(np.uint8).max(initial=0) != fp4.e8m0.NAN_BYTE:
        return
    values = scale.astype(np.float32, copy=False)
    bad = ~(np.isfinite(values) & (values > 0))
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise StepperError(f"{shard}: '{name}' holds {int(bad.sum())} scale(s) that are not finite and positive, "
                           f"first {values[where]} at {list(where)}")
