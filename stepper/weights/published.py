"""A DeepSeek-V4 checkpoint as DeepSeek publishes it, read lazily and strictly.

Tensors are named without `model.` (stepper.weights.deepseek_v4_names): a weight `X.weight`
stored F8_E4M3 is paired with its F8_E8M0 block scales `X.scale` [ceil(out/128), ceil(in/128)],
one stored I8 is FP4 e2m1, two codes a byte [out, in/2], paired with its F8_E8M0 scales `X.scale`
[out, in/32]; `matrix` hands the model either one to multiply, decoded tile by tile inside the
product, `get` a float32 array (a hash layer's `tid2eid` as its integers). A name asked for with
`model.` in front (as LayerWeights asks) is read without it. A checkpoint transformers' save_pretrained
wrote (`model.layers.3.attn.wq_a.weight`, `model.embed_tokens.weight`: stepper.weights.deepseek_v4_saved)
is read by the published names, its config.json's fields as the published ones; its messages name
each tensor as its files do.

The shards are listed by `model.safetensors.index.json`, or are one `model.safetensors`, or,
with neither, every `model-NNNNN-of-MMMMM.safetensors` in the folder (all of one count MMMMM; a
number missing is a shard that cannot be read). The multi-token-prediction block `mtp.*` is kept
apart in `unused`: no run reads it. The index, shard headers and reading of bytes are those of
stepper.weights.checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from stepper import fp4, fp8
from stepper.errors import StepperError
from stepper.untrusted.jsonfile import read_json
from stepper.untrusted.paths import found
from stepper.weights import deepseek_v4_names as v4
from stepper.weights import deepseek_v4_saved as saved
from stepper.weights.checkpoint import (
    FLOAT_DTYPES,
    INDEX,
    RESIDENT_BYTES,
    SINGLE,
    Checkpoint,
    Problem,
    count,
)
from stepper.weights.safetensors_reader import MappedBudget, TensorInfo
from stepper.weights.stored import FP4, FileBytes, Stored

FP8_DTYPE, FP4_DTYPE, SCALE_DTYPE = "F8_E4M3", "I8", "F8_E8M0"
INDEX_DTYPES = ("I64", "I32")
MODEL_TYPE = "deepseek_v4"


def is_published_v4(folder: Path) -> bool:
    """Whether a folder's config.json says DeepSeek-V4 (read in the published layout, or as transformers saves it)."""
    config = folder / "config.json"
    if found(config) != "file":
        return False
    raw = read_json(config, "the checkpoint's config.json")
    return isinstance(raw, dict) and raw.get("model_type") == MODEL_TYPE


class PublishedCheckpoint(Checkpoint):
    """A WeightSource over a DeepSeek-V4 checkpoint folder in the published layout, or as
    transformers saves it (read by the published names).

    config: the family's config object, or None for config.json's fields in the published form
    (`published_form`: enough for the tensors' shapes, stepper.weights.deepseek_v4_names.field)."""

    def __init__(self, path: str | Path, config: Any = None):
        self.path = Path(path)
        if found(self.path) != "folder":
            raise StepperError(f"{self.path}: not a checkpoint directory")
        raw = read_json(self.path / "config.json", "the checkpoint's config.json")
        if not isinstance(raw, dict):
            raise StepperError(f"{self.path / 'config.json'}: expected a JSON object of config fields")
        self.raw = raw  # config.json as written (transformers' form, if it saved the checkpoint)
        self.config = published_form(raw) if config is None else config
        self._layer_tensors: dict[int, dict[str, v4.Tensor]] = {}
        self.shards = {}
        self.unreadable: dict[str, str] = {}
        self.disagreements: dict[str, Problem] = {}
        self.weight_map = self._read_weight_map()
        for shard in sorted(set(self.weight_map.values()) - set(self.shards)):
            self._open_shard(shard)
        self._resident = MappedBudget(RESIDENT_BYTES)
        self._good_scales: set[str] = set()  # block and group scales checked once: the same map's bytes
        self._check_index_against_headers()
        self.saved_layout = saved.is_saved_layout(self.weight_map, str(self.path))
        # transformers' saved layout: read by the published names; published name -> the name on disk
        self.stored_as = self._renamed(saved.from_saved) if self.saved_layout else {}
        self.unused = {name: shard for name, shard in self.weight_map.items() if v4.is_unused(name)}
        self.weight_map = {name: shard for name, shard in self.weight_map.items() if name not in self.unused}

    # -- the shards --------------------------------------------------------------------------

    def _read_weight_map(self) -> dict[str, str]:
        """The index's map, one file's names, or (with neither) the names in every numbered shard."""
        if found(self.path / INDEX) or found(self.path / SINGLE):
            return super()._read_weight_map()
        numbered = sorted(p.name for p in self.path.iterdir() if v4.SHARD.fullmatch(p.name))
        if not numbered:
            raise StepperError(f"{self.path}: neither {INDEX}, {SINGLE} nor shards "
                               "model-NNNNN-of-MMMMM.safetensors found")
        counts = {v4.SHARD.fullmatch(name)[2] for name in numbered}
        if len(counts) > 1:
            raise StepperError(f"{self.path}: shards of different counts ({', '.join(sorted(counts))}): expected "
                               f"model-NNNNN-of-MMMMM.safetensors with one MMMMM, and no {INDEX} to say which to read")
        total = int(counts.pop())
        expected = [f"model-{n:05d}-of-{total:05d}.safetensors" for n in range(1, total + 1)]
        self.unreadable.update({shard: "no such file" for shard in expected if shard not in numbered})
        stray = sorted(set(numbered) - set(expected))
        if stray:
            raise StepperError(f"{self.path}: {stray[0]} is not numbered 00001 to {total:05d}, the count its name "
                               "gives")
        weight_map = {}
        for shard in numbered:
            self._open_shard(shard)
            if shard in self.shards:
                weight_map.update(dict.fromkeys(self.shards[shard].names(), shard))
        return weight_map

    def on_disk(self, message: str) -> str:
        """A message naming each tensor as the files do (transformers' names, if it saved them)."""
        return saved.named_as_saved(message, self.stored_as) if self.saved_layout else message

    # -- reading -----------------------------------------------------------------------------

    def local(self, name: str) -> str:
        """The name the map holds a tensor by: the published one, asked for with `model.` in front (as
        LayerWeights asks) or, where transformers saved the checkpoint, by the name it saved."""
        return saved.from_saved(name) if self.saved_layout else name.removeprefix(saved.PREFIX)

    def has(self, name: str) -> bool:
        return self.local(name) in self.weight_map

    def _stored_name(self, name: str) -> str:
        return self.local(name)

    def get(self, name: str) -> np.ndarray:
        """A float32 tensor (FP8 and FP4 decoded); an I64 / I32 one (tid2eid) as its integers."""
        stored = self.stored(name)
        if stored.dtype in INDEX_DTYPES:
            return np.asarray(stored.data, dtype=np.int64)
        return stored.as_float32(self.local(name))

    def get_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        stored = self.stored(name)
        if stored.scale_inv is not None:
            return stored.as_float32(self.local(name))[rows]
        return np.asarray(stored.data[rows], dtype=np.float32)  # touches only these rows' pages

    def matrix(self, name: str):
        """A weight about to be multiplied: FP8 with its E8M0 block scales, FP4 with its group
        scales, BF16 kept as stored (kernels.linear), or float32."""
        return super().matrix(self.local(name))

    def stored(self, name: str) -> Stored:
        """The tensor as stored, an FP8 or FP4 weight with its scales (their dtype, grid and values checked)."""
        name = self.local(name)
        with self._named_on_disk():
            self._keep_resident(name)
            self.check_stored(name)
            return self.stored_over(name, self.shard_of(name).get(name))

    def check_stored(self, name: str) -> None:
        """A stored tensor's dtype and shape as the config says (a name it does not know: its scale's
        dtype), from its shard's header alone; the first problem as one line."""
        shard = self.shard_of(name)
        expected = self.expected(name)  # a tensor the config knows: its dtype and shape checked, as a run's check does
        problems = ([p.text for p in self.tensor_problems(name, expected)] if expected is not None
                    else [p for p in [self.scale_problem(shard.info(name), shard.path.name)] if p is not None])
        if problems:
            raise StepperError(problems[0])

    def stored_over(self, name: str, array: np.ndarray) -> Stored:
        """Checked tensor `name` over `array`, its bytes, with its scales read (their values checked)."""
        shard = self.shard_of(name)
        info = shard.info(name)
        if info.dtype not in (FP8_DTYPE, FP4_DTYPE):
            return Stored(info.dtype, array)
        scale_name = scale_of(name)
        scale = self.shard_of(scale_name).get(scale_name)
        self._check_scales_once(scale_name, scale)
        where = FileBytes(str(shard.path), shard.data_range(name)[0], shard.identity)
        if info.dtype == FP8_DTYPE:
            return Stored(info.dtype, array, scale, fp8.BLOCK, where)
        return Stored(FP4, array, scale, (1, fp4.GROUP), where, 2 * info.shape[1])

    @property
    def block(self) -> tuple[int, int]:
        return fp8.BLOCK

    def fetch_for(self, layers: Iterable[int], with_globals: bool) -> None:
        """Make the bytes of these layers' tensors (and the globals') readable before a run: a
        folder's are (a remote checkpoint fetches them: stepper.weights.remote_published)."""

    # -- checking ----------------------------------------------------------------------------

    @property
    def layers(self) -> int:
        return v4.field(self.config, "num_hidden_layers")

    def expected(self, name: str) -> v4.Tensor | None:
        """What the config says a stored name is (None for a name it does not know); each layer's
        list made once."""
        layer = v4.layer_of(name)
        if layer is None:
            return v4.global_tensors(self.config).get(name)
        if layer >= self.layers:
            return None
        return self.layer_tensors(layer).get(name.removeprefix(v4.layer_prefix(layer)))

    def layer_tensors(self, layer: int) -> dict[str, v4.Tensor]:
        """The layer's tensors by name relative to `layers.N.` (v4.layer_tensors), made once."""
        if layer not in self._layer_tensors:
            self._layer_tensors[layer] = v4.layer_tensors(self.config, layer)
        return self._layer_tensors[layer]

    def present_layers(self) -> list[int]:
        held = {v4.layer_of(name) for name in self.weight_map} - {None}
        return sorted(layer for layer in held if layer < self.layers)

    def required(self, layers: Iterable[int], with_globals: bool) -> dict[str, v4.Tensor]:
        """Every tensor these layers (and the globals) need, by stored name."""
        required = {}
        for layer in layers:
            prefix = v4.layer_prefix(layer)
            required.update({prefix + k: t for k, t in self.layer_tensors(layer).items()})
        return {**required, **(v4.global_tensors(self.config) if with_globals else {})}

    def problems(self, layers: Iterable[int], with_globals: bool) -> list[Problem]:
        """Every tensor the layers need: present, readable, of a dtype its kind allows, of the
        shape the config gives, and a quantized one with scales of the right dtype and grid; and
        scales whose weight is not there."""
        layers = list(layers)
        return self.named_on_disk(self._layer_problems(layers, with_globals))

    def _layer_problems(self, layers: list[int], with_globals: bool) -> list[Problem]:
        required = self.required(layers, with_globals)
        unknown = self._unknown_shard_problems(required)  # they stand for the missing tensors
        problems = self._unreadable_problems(required) + unknown
        for name, tensor in required.items():
            if name in self.disagreements:
                problems.append(self.disagreements[name])
            elif not (unknown and name not in self.weight_map) and self.weight_map.get(name) not in self.unreadable:
                problems += self.tensor_problems(name, tensor)
        return problems + self._orphan_scales(layers, with_globals, required)

    def _unknown_shard_problems(self, required: dict[str, v4.Tensor]) -> list[Problem]:
        """Without an index, a numbered shard that cannot be read may hold any tensor: one line for
        it, counting the tensors needed that no readable shard holds (instead of one line each)."""
        unknown = sorted(set(self.unreadable) - set(self.weight_map.values()))
        missing = [name for name in required if name not in self.weight_map and name not in self.disagreements]
        if not (unknown and missing):
            return []
        return [Problem(shard, missing[0], f"{shard} cannot be read ({self.unreadable[shard]}), and with no {INDEX} "
                        f"nothing says what it holds: {count(len(missing), 'tensor')} of the layers checked are in no "
                        f"readable shard, first '{missing[0]}'") for shard in unknown]

    def _orphan_scales(self, layers: list[int], with_globals: bool, required: dict) -> list[Problem]:
        """Scales of the layers (and globals) whose weight is neither there nor already reported missing."""
        prefixes = tuple(v4.layer_prefix(layer) for layer in layers)
        return [Problem(shard, name, f"{shard}: '{name}' is a scale with no weight '{weight_of(name)}'")
                for name, shard in self.weight_map.items()
                if name.endswith(v4.SCALE) and weight_of(name) not in self.weight_map
                and weight_of(name) not in required
                and (name.startswith(prefixes) or (with_globals and v4.layer_of(name) is None))]

    def tensor_problems(self, name: str, tensor: v4.Tensor) -> list[Problem]:
        """What is wrong with one tensor the config needs (at most one line for it, one for its scale)."""
        if name not in self.weight_map:
            return [Problem(None, name, f"'{name}' is missing (expected {describe(tensor)})")]
        shard = self.weight_map[name]
        info = self.shard_of(name).info(name)
        quantized = (FP8_DTYPE, FP4_DTYPE) if tensor.kind == v4.EXPERT else (FP8_DTYPE,)
        allowed = {v4.FLOAT: FLOAT_DTYPES, v4.INDEX: INDEX_DTYPES}.get(tensor.kind, (*quantized, *FLOAT_DTYPES))
        if info.dtype not in allowed:
            return [Problem(shard, name, f"{shard}: '{name}' has dtype {info.dtype}, expected {' or '.join(allowed)}")]
        if info.dtype == FP4_DTYPE:
            out_dim, in_dim = tensor.shape
            if in_dim % fp4.GROUP or info.shape != fp4.packed_shape(tensor.shape):
                return [Problem(shard, name, f"{shard}: '{name}' holds FP4 bytes of shape {list(info.shape)}, expected "
                                f"{list(fp4.packed_shape(tensor.shape))} (two codes a byte) for the "
                                f"[{out_dim}, {in_dim}] weight config.json gives")]
        elif info.shape != tensor.shape:
            return [Problem(shard, name, f"{shard}: '{name}' has shape {list(info.shape)}, expected "
                                         f"{list(tensor.shape)}")]
        problem = self.scale_problem(info, shard)
        return [] if problem is None else [Problem(self.weight_map.get(scale_of(name)), scale_of(name), problem)]

    def scale_problem(self, weight: TensorInfo, shard: str) -> str | None:
        """What is wrong with a weight's `.scale` (scale_problem), its shard read if need be."""
        name = scale_of(weight.name)
        scale_shard = self.weight_map.get(name)
        if scale_shard in self.unreadable:
            return f"'{name}' lies in {scale_shard}, which cannot be read ({self.unreadable[scale_shard]})"
        scale = None if scale_shard is None else self.shard_of(name).info(name)
        return scale_problem(weight, shard, scale, scale_shard)

    def check(self, layers: Iterable[int], with_globals: bool) -> None:
        problems = self.problems(layers, with_globals)
        if len(problems) == 1:
            raise StepperError(problems[0].text)
        if problems:
            listed = "\n".join(f"  - {p}" for p in problems)
            raise StepperError(f"{self.label}: {count(len(problems), 'problem')} with the weights of this "
                               f"run:\n{listed}")


def scale_problem(weight: TensorInfo, shard: str, scale: TensorInfo | None, scale_shard: str | None) -> str | None:
    """What is wrong with a weight's `.scale`, from the two headers (None: no scale): an F8_E4M3
    weight needs F8_E8M0 scales on its 128x128 grid, an I8 (FP4) one F8_E8M0 scales per 32 inputs;
    a float weight has none."""
    name = scale_of(weight.name)
    quantized = weight.dtype in (FP8_DTYPE, FP4_DTYPE)
    if quantized and len(weight.shape) != 2:
        return (f"{shard}: '{weight.name}' is an {fmt(weight.dtype)} weight of shape {list(weight.shape)}, "
                "expected 2-D [out, in]")
    if scale is None:
        return (f"'{name}' is missing: the {fmt(weight.dtype)} weight '{weight.name}' ({shard}) needs its "
                f"{SCALE_DTYPE} scales {list(scale_grid(weight))}") if quantized else None
    if not quantized:
        return (f"{scale_shard}: '{name}' is a scale for the {weight.dtype} weight '{weight.name}'; only F8_E4M3 "
                f"and FP4 (I8) weights have scales")
    if scale.dtype != SCALE_DTYPE:
        return (f"{scale_shard}: '{name}' has dtype {scale.dtype}, expected {SCALE_DTYPE} (2^(byte - 127)) for the "
                f"{fmt(weight.dtype)} weight '{weight.name}'")
    if scale.shape != scale_grid(weight):
        return (f"{scale_shard}: '{name}' has shape {list(scale.shape)}, expected {list(scale_grid(weight))} "
                f"for the {fmt(weight.dtype)} weight '{weight.name}' {list(logical_shape(weight))} "
                f"({grid_words(weight.dtype)})")
    return None


def uses_published_names(names: Iterable[str]) -> bool:
    """Whether tensors are named as DeepSeek-V4 publishes them: scales named X.scale, or layers
    without `model.` in front (HF checkpoints have neither)."""
    return any(name.endswith(v4.SCALE) or v4.layer_of(name) is not None for name in names)


def published_form(raw: dict[str, Any]) -> dict[str, Any]:
    """config.json's fields as the published file names them, for the tensors' shapes; of a config
    in transformers' form refused for a field, those the shapes need (a run's reader names the field)."""
    try:
        return saved.published_fields(raw, "config.json")[0]
    except StepperError:
        return {**raw, **saved.shape_fields(raw, "config.json")}


def scale_of(name: str) -> str:
    """X.weight -> X.scale."""
    return name.removesuffix(".weight") + v4.SCALE


def weight_of(scale: str) -> str:
    """X.scale -> X.weight."""
    return scale.removesuffix(v4.SCALE) + ".weight"


def fmt(dtype: str) -> str:
    return "FP4 (I8)" if dtype == FP4_DTYPE else dtype


def logical_shape(weight: TensorInfo) -> tuple[int, ...]:
    """The weight's [out, in]: an FP4 weight's bytes [out, in/2] hold [out, in]."""
    if weight.dtype == FP4_DTYPE and len(weight.shape) == 2:
        return weight.shape[0], 2 * weight.shape[1]
    return weight.shape


def scale_grid(weight: TensorInfo) -> tuple[int, ...]:
    """The scales a stored weight needs: FP8 [ceil(out/128), ceil(in/128)], FP4 bytes [out, in/2] -> [out, in/32]."""
    if len(weight.shape) != 2:
        return ()
    if weight.dtype == FP8_DTYPE:
        return fp8.scale_grid(weight.shape)
    return fp4.group_shape(logical_shape(weight))


def grid_words(dtype: str) -> str:
    return "one scale per 128x128 block" if dtype == FP8_DTYPE else "one scale per row and 32 inputs"


def describe(tensor: v4.Tensor) -> str:
    what = {v4.LINEAR: "an F8_E4M3 weight with F8_E8M0 .scale, or a float weight",
            v4.EXPERT: "an FP4 (I8) or F8_E4M3 weight with F8_E8M0 .scale",
            v4.FLOAT: "BF16, F16 or F32", v4.INDEX: "I64 or I32"}[tensor.kind]
    return f"{what}, shape {list(tensor.shape)}"
