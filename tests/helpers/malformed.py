"""The malformed-input corpus: safetensors files, checkpoint directories and fixture folders,
each a sound one broken one way at a time.

Safetensors files (the reader's tests): the valid file holds `a` (F32 [2, 2], data bytes [0, 16)) and `b`
(BF16 [3], [16, 22)) and a `__metadata__` map. Each `Case` is the bytes of a broken copy and the tensor its error
must name (None when no single tensor is at fault). `CASES` are these files; `DIR_CASES` whole checkpoint
directories (below), `FIXTURE_CASES` fixture folders.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HEADER: dict[str, Any] = {
    "__metadata__": {"format": "np"},
    "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
    "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]},
}
DATA = bytes(range(22))


@dataclass(frozen=True)
class Case:
    name: str
    content: bytes
    tensor: str | None = None


def header_text(header: dict[str, Any] | None = None) -> str:
    return json.dumps(HEADER if header is None else header, separators=(",", ":"))


def assemble(header: str | bytes, data: bytes = DATA, length: int | None = None) -> bytes:
    """8-byte length (the header's own unless given), header, data."""
    raw = header.encode() if isinstance(header, str) else header
    return (len(raw) if length is None else length).to_bytes(8, "little") + raw + data


VALID = assemble(header_text())


def edited(edit: Callable[[dict[str, Any]], None], data: bytes = DATA) -> bytes:
    """The valid header with `edit` applied to a copy of its dict."""
    header = copy.deepcopy(HEADER)
    edit(header)
    return assemble(header_text(header), data)


def field(tensor: str, key: str, value: Any) -> bytes:
    def edit(h: dict[str, Any]) -> None:
        h[tensor][key] = value

    return edited(edit)


def dropped(tensor: str, key: str) -> bytes:
    return edited(lambda h: h[tensor].pop(key))


def replaced(old: str, new: str | bytes, data: bytes = DATA) -> bytes:
    """The valid header's text with one piece replaced (for what `json.dumps` cannot write)."""
    text = header_text().encode()
    old_b = old.encode()
    assert text.count(old_b) == 1, old
    return assemble(text.replace(old_b, new.encode() if isinstance(new, str) else new), data)


def added(name: str, entry: Any, data: bytes = DATA) -> bytes:
    return edited(lambda h: h.__setitem__(name, entry), data)


B_ENTRY = '"b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]}'
ZERO = {"dtype": "F32", "shape": [0], "data_offsets": [22, 22]}


def _cases() -> list[Case]:
    return [
        # -- the 8-byte length and the file size
        Case("empty-file", b""),
        Case("seven-bytes", VALID[:7]),
        Case("header-length-zero", assemble(b"", b"")),
        Case("header-length-past-end", assemble(header_text(), DATA, length=len(header_text()) + len(DATA) + 1)),
        Case("truncated-in-header", VALID[:40]),
        Case("header-length-2^63", assemble(header_text(), DATA, length=2**63)),
        Case("header-length-2^64-1", assemble(header_text(), DATA, length=2**64 - 1)),
        Case("header-length-over-100MB", assemble(header_text(), DATA, length=100_000_001)),
        Case("data-missing-at-end", VALID[:-1], "b"),
        Case("data-section-missing", VALID[: -len(DATA)], "a"),
        Case("bytes-appended", VALID + b"\0"),
        # -- encoding and JSON syntax
        Case("non-utf8-byte", replaced('"format"', b'"\xffformat"')),
        Case("utf8-encoded-surrogate", replaced('"np"', b'"\xed\xa0\x80"')),
        Case("overlong-utf8", replaced('"np"', b'"\xc0\xaf"')),
        Case("utf8-bom", assemble(b"\xef\xbb\xbf" + header_text().encode())),
        Case("not-json", assemble("hello world")),
        Case("trailing-nul", assemble(header_text().encode() + b"\0")),
        Case("trailing-garbage", assemble(header_text() + " x")),
        Case("trailing-comma", replaced(B_ENTRY, B_ENTRY + ",")),
        Case("single-quotes", assemble(header_text().replace('"', "'"))),
        Case("json-array", assemble("[]", b"")),
        Case("json-number", assemble("42", b"")),
        Case("json-string", assemble('"a"', b"")),
        Case("json-null", assemble("null", b"")),
        Case("nan-literal", replaced('"shape":[3]', '"shape":[NaN]')),
        Case("infinity-literal", replaced("[16,22]", "[16,Infinity]")),
        Case("minus-infinity-literal", replaced("[0,16]", "[-Infinity,16]")),
        Case("lone-surrogate-in-name", replaced('"b":', '"\\ud800":')),
        Case("lone-surrogate-in-metadata", replaced('"np"', '"\\udc00"')),
        Case("control-character-in-name", replaced('"b":', '"b\x01":')),
        # -- names a terminal or a message could not show as they are
        Case("name-empty", replaced('"b":', '"":')),
        Case("name-escape-sequence", replaced('"b":', '"\\u001b[2Jb":')),
        Case("name-nul", replaced('"b":', '"b\\u0000":')),
        Case("name-newline", replaced('"b":', '"b\\nc":')),
        Case("name-delete", replaced('"b":', '"b\\u007f":')),
        Case("name-c1-control", replaced('"b":', '"b\\u009b":')),
        Case("nested-200-deep", replaced(B_ENTRY, B_ENTRY + ',"x":' + "[" * 200 + "]" * 200), "x"),
        Case("5000-digit-integer", replaced('"shape":[3]', '"shape":[' + "9" * 5000 + "]")),
        # -- duplicate keys
        Case("duplicate-tensor-name", replaced(B_ENTRY, B_ENTRY + "," + B_ENTRY), "b"),
        Case("duplicate-key-in-entry", replaced('"dtype":"BF16"', '"dtype":"BF16","dtype":"BF16"'), "b"),
        Case("duplicate-metadata", replaced(B_ENTRY, B_ENTRY + ',"__metadata__":{}')),
        Case("duplicate-metadata-key", replaced('"format":"np"', '"format":"np","format":"pt"')),
        # -- __metadata__
        Case("metadata-array", edited(lambda h: h.__setitem__("__metadata__", ["np"]))),
        Case("metadata-int-value", edited(lambda h: h.__setitem__("__metadata__", {"format": 1}))),
        Case("metadata-object-value", edited(lambda h: h.__setitem__("__metadata__", {"format": {}}))),
        # -- a tensor entry's form
        Case("entry-array", edited(lambda h: h.__setitem__("b", ["BF16", [3], [16, 22]])), "b"),
        Case("entry-null", added("z", None), "z"),
        Case("entry-string", added("z", "F32"), "z"),
        Case("entry-extra-key", field("b", "offsets", [16, 22]), "b"),
        Case("entry-missing-dtype", dropped("b", "dtype"), "b"),
        Case("entry-missing-shape", dropped("b", "shape"), "b"),
        Case("entry-missing-data-offsets", dropped("b", "data_offsets"), "b"),
        # -- dtype
        Case("unknown-dtype", field("b", "dtype", "BF17"), "b"),
        Case("lowercase-dtype", field("b", "dtype", "bf16"), "b"),
        Case("dtype-not-a-string", field("b", "dtype", 2), "b"),
        Case("dtype-unsupported-here", field("b", "dtype", "F8_E4M3FNUZ"), "b"),
        # -- shape
        Case("negative-dims", field("b", "shape", [-1, -3]), "b"),
        Case("float-dim", field("b", "shape", [3.0]), "b"),
        Case("exponent-dim", replaced('"shape":[3]', '"shape":[3e0]'), "b"),
        Case("boolean-dim", field("b", "shape", [3, True]), "b"),
        Case("string-dim", field("b", "shape", ["3"]), "b"),
        Case("null-dim", field("b", "shape", [3, None]), "b"),
        Case("shape-not-a-list", field("b", "shape", 3), "b"),
        Case("shape-object", field("b", "shape", {"0": 3}), "b"),
        Case("shape-wrong-size", field("b", "shape", [4]), "b"),
        Case("shape-product-over-2^64", field("a", "shape", [2**32, 2**32, 2**32]), "a"),
        Case("zero-size-with-overflowing-dims", added("z", {**ZERO, "shape": [2**40, 2**40, 0]}), "z"),
        Case("too-many-dims", field("b", "shape", [3] + [1] * 40), "b"),
        # -- data_offsets
        Case("offsets-one-item", field("b", "data_offsets", [16]), "b"),
        Case("offsets-three-items", field("b", "data_offsets", [16, 22, 22]), "b"),
        Case("offsets-negative", field("a", "data_offsets", [-16, 0]), "a"),
        Case("offsets-float", field("b", "data_offsets", [16.0, 22]), "b"),
        Case("offsets-minus-zero", replaced("[0,16]", "[-0,16]"), "a"),
        Case("offsets-end-before-start", added("z", {**ZERO, "data_offsets": [22, 21]}), "z"),
        Case("offsets-not-a-list", field("b", "data_offsets", "16:22"), "b"),
        Case("offsets-object", field("b", "data_offsets", {"start": 16, "end": 22}), "b"),
        Case("offsets-past-2^64", added("z", {**ZERO, "data_offsets": [2**66, 2**66]}), "z"),
        # -- layout of the data section
        Case("gap-between-tensors", edited(_shrink_a), "b"),
        Case("first-tensor-not-at-zero", edited(_drop_a), "b"),
        Case("overlapping-tensors", field("b", "data_offsets", [14, 20]), "b"),
        Case("aliasing-tensors", added("c", HEADER["b"]), "c"),
        Case("zero-size-inside-a-tensor", added("z", {**ZERO, "data_offsets": [8, 8]}), "z"),
        Case("zero-size-past-the-end", added("z", {**ZERO, "data_offsets": [30, 30]}), "z"),
    ]


def _shrink_a(h: dict[str, Any]) -> None:
    """`a` becomes F32 [3] at [0, 12), so bytes [12, 16) belong to no tensor."""
    h["a"] = {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}


def _drop_a(h: dict[str, Any]) -> None:
    """Only `b`, at [16, 22): the data section starts with 16 bytes no tensor uses."""
    del h["a"]


CASES = _cases()


# ---------------------------------------------------------------------------------------------
# Whole checkpoint directories and fixture folders, broken one way at a time.
#
# The sound checkpoint is `mini` (MINI_CONFIG: 2 layers, layer 1 MoE with 4 experts, FP8 in
# 16x32 blocks so that scale grids are not square), written by `stepper synth`: 4 shards, the
# embedding, layer 0, layer 1, then norm and lm_head. Each `DirCase` breaks a copy in place and
# says what `stepper inspect` must exit with (1: problems listed, 2: cannot be read at all), what
# `stepper run` must exit with, and a piece of the message both must print.

MINI_CONFIG: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "hidden_act": "silu",
    "scoring_func": "sigmoid", "topk_method": "noaux_tc", "norm_topk_prob": True, "moe_layer_freq": 1,
    "rms_norm_eps": 1e-06, "tie_word_embeddings": False, "attention_bias": False, "vocab_size": 64,
    "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 48, "kv_lora_rank": 32,
    "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 16, "n_routed_experts": 4, "n_shared_experts": 1,
    "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.827, "first_k_dense_replace": 1,
    "rope_theta": 50000.0, "max_position_embeddings": 4096, "rope_scaling": None,
    "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                            "weight_block_size": [16, 32]},
}
INDEX_FILE = "model.safetensors.index.json"
LAYER1_SHARD = "model-00003-of-00004.safetensors"
KV_A = "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"  # F8_E4M3 [48, 64], scales [3, 2]
EXPERT = "model.layers.1.mlp.experts.2.up_proj.weight"  # F8_E4M3 [32, 64], scales [2, 2]
SHARED = "model.layers.1.mlp.shared_experts.down_proj.weight"  # F8_E4M3 [64, 32], scales [4, 1], read by every run
NORM = "model.layers.1.input_layernorm.weight"  # BF16 [64]
SCALE_INV = "_scale_inv"
DTYPE_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I64": 8, "I32": 4,
               "I8": 1, "U8": 1, "BOOL": 1}


@dataclass(frozen=True)
class DirCase:
    name: str
    edit: Callable[[Path], None]
    inspect: int  # 0: sound; 1: the problems are listed; 2: the checkpoint cannot be read at all
    message: str  # in inspect's output (stdout for 1, stderr for 2) and in run's stderr
    run: int = 2


# -- reading and writing the pieces of a checkpoint (independently of stepper's own code)


def read_shard(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    """name -> (dtype, shape, bytes), in file order, __metadata__ left out."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    data = raw[8 + n:]
    ordered = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in ordered}


def write_shard(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    header, offset = {}, 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    path.write_bytes(assemble(json.dumps(header), b"".join(d for _, _, d in tensors.values())))


def index_of(folder: Path) -> dict[str, Any]:
    return json.loads((folder / INDEX_FILE).read_text())


def shard_holding(folder: Path, name: str) -> Path:
    return folder / index_of(folder)["weight_map"][name]


def with_tensor(name: str, dtype: str | None = None, shape: list[int] | None = None, data: bytes | None = None,
                shard: str | None = None) -> Callable[[Path], None]:
    """Replace (or add, in `shard`) one tensor; the data is zeros of the new size unless given."""

    def edit(folder: Path) -> None:
        index = index_of(folder)
        path = folder / (shard or index["weight_map"][name])
        tensors = read_shard(path)
        old = tensors.get(name, ("F32", [1], b""))
        new_dtype, new_shape = dtype or old[0], old[1] if shape is None else shape
        size = DTYPE_SIZES[new_dtype]
        for d in new_shape:
            size *= d
        tensors[name] = (new_dtype, new_shape, bytes(size) if data is None else data)
        write_shard(path, tensors)
        index["weight_map"][name] = path.name
        (folder / INDEX_FILE).write_text(json.dumps(index))

    return edit


def without_tensor(name: str) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        index = index_of(folder)
        path = folder / index["weight_map"].pop(name)
        tensors = read_shard(path)
        del tensors[name]
        write_shard(path, tensors)
        (folder / INDEX_FILE).write_text(json.dumps(index))

    return edit


def scale_values(name: str, values: list[float], dtype: str = "F32") -> Callable[[Path], None]:
    """The weight's float32 scales with the first ones replaced, stored as `dtype`."""
    code = {"F32": "<f4", "F16": "<f2"}[dtype]
    scale = name + SCALE_INV

    def edit(folder: Path) -> None:
        _, shape, data = read_shard(shard_holding(folder, scale))[scale]
        array = np.frombuffer(data, "<f4").copy().astype(code)
        array[: len(values)] = values
        with_tensor(scale, dtype, shape, array.tobytes())(folder)

    return edit


def config_fields(**fields: Any) -> Callable[[Path], None]:
    """config.json with fields replaced; a value of ... removes the field."""

    def edit(folder: Path) -> None:
        raw = json.loads((folder / "config.json").read_text())
        for key, value in fields.items():
            if value is ...:
                raw.pop(key, None)
            else:
                raw[key] = value
        (folder / "config.json").write_text(json.dumps(raw))

    return edit


def file_bytes(relative: str, content: bytes | Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        path = folder / relative
        path.write_bytes(content(path.read_bytes()) if callable(content) else content)

    return edit


def text_replaced(relative: str, old: str, new: str) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        text = (folder / relative).read_text()
        assert old in text, (relative, old)
        (folder / relative).write_text(text.replace(old, new, 1))

    return edit


def weight_map_edit(change: Callable[[dict[str, str]], None]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        index = index_of(folder)
        change(index["weight_map"])
        (folder / INDEX_FILE).write_text(json.dumps(index))

    return edit


def index_value(value: Any) -> Callable[[Path], None]:
    return file_bytes(INDEX_FILE, json.dumps(value).encode())


def removed(relative: str) -> Callable[[Path], None]:
    return lambda folder: (folder / relative).unlink()


def made_folder(relative: str) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        (folder / relative).unlink()
        (folder / relative).mkdir()

    return edit


def looped(relative: str) -> Callable[[Path], None]:
    """The file (or, with ".", the folder itself) replaced by a symbolic link to itself."""
    def edit(folder: Path) -> None:
        place = folder / relative  # (folder / "." is the folder)
        if relative == ".":
            shutil.rmtree(folder)
        else:
            place.unlink()
        place.symlink_to(place)

    return edit


def point(name: str, shard: str) -> Callable[[Path], None]:
    return weight_map_edit(lambda m: m.__setitem__(name, shard))


def index_replaced(old: str, new: str) -> Callable[[Path], None]:
    """The index rewritten as json.dumps writes it, with one piece of its text replaced."""

    def edit(folder: Path) -> None:
        (folder / INDEX_FILE).write_text(json.dumps(index_of(folder)))
        text_replaced(INDEX_FILE, old, new)(folder)

    return edit


def moved_shard(shard: str, to: str) -> Callable[[Path], None]:
    """The index points the shard's tensors at `to`, which does not exist."""

    def edit(folder: Path) -> None:
        weight_map_edit(lambda m: m.update({k: to for k, v in m.items() if v == shard}))(folder)
        (folder / shard).unlink()

    return edit


def both(*edits: Callable[[Path], None]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        for one in edits:
            one(folder)

    return edit


CANNOT_READ = f"{LAYER1_SHARD} cannot be read"
GHOST_PAST = "model.layers.5.input_layernorm.weight"  # a layer past the config's 2
PROBLEMS = "problem(s) with the weights of this run"


def _dir_cases() -> list[DirCase]:
    cfg, idx = "config.json", INDEX_FILE
    bad_config = [
        DirCase("config-not-json", file_bytes(cfg, b"{not json"), 2, "config.json: not valid JSON"),
        DirCase("config-empty", file_bytes(cfg, b""), 2, "config.json: not valid JSON"),
        DirCase("config-not-utf8", file_bytes(cfg, b'{"\xff": 1}'), 2, "config.json: not UTF-8"),
        DirCase("config-duplicate-key", text_replaced(cfg, '"hidden_size": 64', '"hidden_size": 64, "hidden_size": 96'),
                2, "key 'hidden_size' appears twice"),
        DirCase("config-nan", text_replaced(cfg, '"rope_theta": 50000.0', '"rope_theta": NaN'), 2, "NaN is not JSON"),
        DirCase("config-rope-theta-one", config_fields(rope_theta=1.0), 2, "field 'rope_theta' must be > 1"),
        DirCase("config-array", file_bytes(cfg, b"[]"), 2, "config.json: expected a JSON object"),
        DirCase("config-missing", removed(cfg), 2, "not a checkpoint directory"),
        DirCase("config-a-folder", made_folder(cfg), 2, "config.json: is a directory"),
        DirCase("config-a-symlink-loop", looped(cfg), 2, f"{cfg}: cannot be read (a symlink loop"),
        DirCase("folder-a-symlink-loop", looped("."), 2, "ck: cannot be read (a symlink loop"),
        DirCase("config-missing-field", config_fields(hidden_size=...), 2, "'hidden_size'"),
        DirCase("config-string-size", config_fields(hidden_size="64"), 2, "'hidden_size' must be an integer"),
        DirCase("config-bool-size", config_fields(num_hidden_layers=True), 2, "'num_hidden_layers' must be an integer"),
        DirCase("config-zero-layers", config_fields(num_hidden_layers=0), 2, "'num_hidden_layers' must be >= 1"),
        DirCase("config-negative-heads", config_fields(num_attention_heads=-2), 2,
                "'num_attention_heads' must be >= 1"),
        DirCase("config-float-vocab", config_fields(vocab_size=64.5), 2, "'vocab_size' must be an integer"),
        DirCase("config-huge-float", text_replaced(cfg, '"rms_norm_eps": 1e-06', '"rms_norm_eps": 1e999'), 2,
                "rms_norm_eps"),
        DirCase("config-unknown-model-type", config_fields(model_type="llama"), 2, "model_type"),
        DirCase("config-tied-embeddings", config_fields(tie_word_embeddings=True), 2, "tie_word_embeddings"),
        DirCase("config-top-k-over-experts", config_fields(num_experts_per_tok=9), 2, "num_experts_per_tok"),
        DirCase("config-block-size-zero", config_fields(quantization_config={**MINI_CONFIG["quantization_config"],
                                                                             "weight_block_size": [0, 32]}),
                2, "weight_block_size"),
        DirCase("config-block-size-one-number", config_fields(quantization_config={
            **MINI_CONFIG["quantization_config"], "weight_block_size": [16]}), 2, "weight_block_size"),
        DirCase("config-deeply-nested", file_bytes(cfg, b"[" * 100_000 + b"]" * 100_000), 2, "config.json"),
    ]
    bad_index = [
        DirCase("index-not-json", file_bytes(idx, b"{"), 2, f"{idx}: not valid JSON"),
        DirCase("index-duplicate-tensor", index_replaced('"weight_map": {', '"weight_map": {"model.norm.weight": '
                                                         '"model-00001-of-00004.safetensors", '),
                2, "key 'model.norm.weight' appears twice"),
        DirCase("index-duplicate-weight-map", index_replaced('"weight_map": {', '"weight_map": {}, "weight_map": {'),
                2, "key 'weight_map' appears twice"),
        DirCase("index-nan-size", index_replaced('"total_size": ', '"total_size": NaN, "x": '), 2, "NaN is not JSON"),
        DirCase("index-array", index_value([]), 2, "expected an object with a 'weight_map'"),
        DirCase("index-and-a-single-file", lambda folder: shutil.copy(next(folder.glob("model-0*.safetensors")),
                                                                      folder / "model.safetensors"), 2,
                "holds both model.safetensors and model.safetensors.index.json, whose shards are other files: "
                "transformers reads model.safetensors alone"),
        DirCase("index-no-weight-map", index_value({"metadata": {}}), 2, "expected an object with a 'weight_map'"),
        DirCase("index-weight-map-list", index_value({"weight_map": []}), 2, "expected an object with a 'weight_map'"),
        DirCase("index-shard-a-number", point(NORM, 3), 2, "expected an object with a 'weight_map'"),
        DirCase("index-shard-absolute", point(NORM, "/etc/passwd.safetensors"), 2, "expected a file name ending in"),
        DirCase("index-shard-parent", point(NORM, "../model-00003-of-00004.safetensors"), 2, "expected a file name"),
        DirCase("index-shard-drive-letter", point(NORM, "C:model.safetensors"), 2, "expected a file name ending in"),
        DirCase("index-shard-backslash", point(NORM, "sub\\model.safetensors"), 2, "expected a file name ending in"),
        DirCase("index-shard-subfolder", point(NORM, "sub/model.safetensors"), 2, "expected a file name ending in"),
        DirCase("index-shard-other-extension", point(NORM, "model.bin"), 2, "expected a file name ending in"),
        DirCase("index-shard-only-extension", point(NORM, ".safetensors"), 2, "expected a file name ending in"),
        DirCase("index-shard-empty", point(NORM, ""), 2, "expected a file name ending in"),
        DirCase("index-shard-escape-sequence", moved_shard(LAYER1_SHARD, "\x1b[2J.safetensors"), 2,
                "points at shard '\\x1b[2J.safetensors', expected a file name"),
        DirCase("index-tensor-not-in-shard", point("model.layers.0.ghost.weight", LAYER1_SHARD), 1,
                "'model.layers.0.ghost.weight' is listed in model.safetensors.index.json but not in this shard"),
        DirCase("index-tensor-not-in-shard-past-the-layers", point(GHOST_PAST, LAYER1_SHARD), 1,
                f"'{GHOST_PAST}' is listed in model.safetensors.index.json but not in this shard", run=0),
        DirCase("index-tensor-left-out", weight_map_edit(lambda m: m.pop(NORM)), 1,
                f"'{NORM}' is in this shard but not in {idx}"),
        DirCase("index-tensor-in-the-wrong-shard", point(NORM, "model-00002-of-00004.safetensors"), 1,
                "is listed in model.safetensors.index.json but not in this shard"),
        DirCase("index-a-symlink-loop", looped(idx), 2, f"{idx}: cannot be read (a symlink loop"),
        DirCase("index-missing-no-single-file", removed(idx), 2, f"neither {idx} nor model.safetensors found"),
    ]
    bad_tensors = [
        DirCase("fp8-weight-as-int8", with_tensor(KV_A, "I8"), 1, f"'{KV_A}' has dtype I8, expected F8_E4M3"),
        DirCase("fp8-weight-as-e5m2", with_tensor(KV_A, "F8_E5M2"), 1, f"'{KV_A}' has dtype F8_E5M2"),
        DirCase("fp8-weight-transposed", with_tensor(KV_A, shape=[64, 48]), 1,
                f"'{KV_A}' has shape [64, 48], expected [48, 64]"),
        DirCase("fp8-weight-flattened", with_tensor(KV_A, shape=[48 * 64]), 1,
                f"'{KV_A}' has shape [3072], expected [48, 64]"),
        DirCase("fp8-weight-3d", with_tensor(KV_A, shape=[1, 48, 64]), 1, f"'{KV_A}' has shape [1, 48, 64]"),
        DirCase("fp8-expert-missing", without_tensor(EXPERT), 1, f"'{EXPERT}' is missing (expected shape [32, 64])"),
        DirCase("fp8-weight-as-bool", with_tensor(EXPERT, "BOOL"), 1, f"'{EXPERT}' has dtype BOOL"),
        DirCase("norm-as-int32", with_tensor(NORM, "I32"), 1, f"'{NORM}' has dtype I32"),
        DirCase("norm-wrong-length", with_tensor(NORM, shape=[63]), 1, f"'{NORM}' has shape [63], expected [64]"),
        DirCase("norm-missing", without_tensor(NORM), 1, f"'{NORM}' is missing (expected shape [64])"),
        DirCase("embedding-wrong-shape", with_tensor("model.embed_tokens.weight", shape=[65, 64]), 1,
                "'model.embed_tokens.weight' has shape [65, 64], expected [64, 64]"),
        DirCase("lm-head-missing", without_tensor("lm_head.weight"), 1, "'lm_head.weight' is missing"),
        DirCase("router-bias-missing", without_tensor("model.layers.1.mlp.gate.e_score_correction_bias"), 1,
                "'model.layers.1.mlp.gate.e_score_correction_bias' is missing"),
        DirCase("tensor-past-the-config", with_tensor("model.layers.5.input_layernorm.weight", "BF16", [64],
                                                      shard=LAYER1_SHARD),
                1, "'model.layers.5.input_layernorm.weight' is in layer 5, but the config has 2 layers", run=0),
        DirCase("layer-past-the-config",
                both(*(with_tensor(f"model.layers.2.{n}.weight", "BF16", [64], shard=LAYER1_SHARD)
                                                 for n in ("input_layernorm", "post_attention_layernorm"))),
                1,
                "'model.layers.2.input_layernorm.weight' and 1 more tensor(s) are in layer 2, but the config has 2 "
                "layers",
                run=0),
        DirCase("tensor-misspelt-in-a-layer",
                with_tensor("model.layers.1.post_attention_layernrom.weight", "BF16", [64],
                                                          shard=LAYER1_SHARD),
                1, "'model.layers.1.post_attention_layernrom.weight' is in layer 1 but no tensor of that layer as "
                   "config.json describes it", run=0),
        DirCase("experts-in-the-dense-layer",
                both(*(with_tensor(f"model.layers.0.mlp.experts.0.{n}.weight", "BF16", [32, 64], shard=LAYER1_SHARD)
                       for n in ("gate_proj", "up_proj"))),
                1, "'model.layers.0.mlp.experts.0.gate_proj.weight' and 1 more tensor(s) are in layer 0 but no tensor",
                run=0),
        DirCase("rotary-table-kept", with_tensor("model.layers.1.self_attn.rotary_emb.inv_freq", "F32", [8],
                                                 shard=LAYER1_SHARD), 0, "", run=0),
    ]
    scale = KV_A + SCALE_INV
    bad_scales = [
        DirCase("scale-missing", without_tensor(scale), 1, f"'{scale}' is missing: the F8_E4M3 weight"),
        DirCase("scale-grid-transposed", with_tensor(scale, shape=[2, 3]), 1,
                f"'{scale}' has shape [2, 3], expected [3, 2] for a [48, 64] weight in 16x32 blocks"),
        DirCase("scale-grid-too-small", with_tensor(scale, shape=[1, 1]), 1,
                f"'{scale}' has shape [1, 1], expected [3, 2]"),
        DirCase("scale-grid-flat", with_tensor(scale, shape=[6]), 1, f"'{scale}' has shape [6], expected [3, 2]"),
        DirCase("scale-as-int32", with_tensor(scale, "I32"), 1,
                f"'{scale}' has dtype I32, expected F32, BF16, F16 or F8_E8M0"),
        DirCase("scale-as-fp8", with_tensor(scale, "F8_E4M3"), 1, f"'{scale}' has dtype F8_E4M3"),
        DirCase("scale-nan", scale_values(KV_A, [float("nan")]), 1,
                f"'{scale}' holds 1 scale(s) that are not finite and positive"),
        DirCase("scale-inf", scale_values(KV_A, [1.0, float("inf")]), 1, "first inf at [0, 1]"),
        DirCase("scale-zero", scale_values(KV_A, [0.0]), 1, "first 0.0 at [0, 0]"),
        DirCase("scale-negative", scale_values(KV_A, [1, 1, -0.5]), 1, "first -0.5 at [1, 0]"),
        DirCase("scale-f16-all-zero", scale_values(KV_A, [0.0] * 6, "F16"), 1, f"'{scale}' holds 6 scale(s)"),
        DirCase("scale-e8m0-nan-code", with_tensor(scale, "F8_E8M0", data=bytes([127, 127, 255, 127, 127, 127])), 1,
                "first nan at [1, 0]"),
        DirCase("shared-expert-scale-nan", scale_values(SHARED, [float("nan")] * 4), 1,
                "holds 4 scale(s) that are not finite"),
        DirCase("scale-with-no-weight", with_tensor("model.layers.1.mlp.gate_proj.weight" + SCALE_INV, "F32", [1, 1],
                                                    shard=LAYER1_SHARD),
                1, "'model.layers.1.mlp.gate_proj.weight_scale_inv' is a block scale with no weight"),
        DirCase("scale-for-a-bf16-weight", with_tensor(NORM + SCALE_INV, "F32", [1, 1], shard=LAYER1_SHARD), 1,
                f"'{NORM}{SCALE_INV}' is a block scale for a BF16 weight"),
        DirCase("scale-in-a-missing-shard", both(without_tensor(scale),
                                                 point(scale, "model-00009-of-00009.safetensors")), 1,
                f"'{scale}' lies in model-00009-of-00009.safetensors, which cannot be read (no such file)"),
    ]
    bad_shards = [
        DirCase("shard-missing", removed(LAYER1_SHARD), 1, f"{CANNOT_READ} (no such file)"),
        DirCase("shard-empty", file_bytes(LAYER1_SHARD, b""), 1, f"{CANNOT_READ} (0 bytes, too short"),
        DirCase("shard-truncated", file_bytes(LAYER1_SHARD, lambda b: b[: len(b) // 2]), 1, CANNOT_READ),
        DirCase("shard-a-folder", made_folder(LAYER1_SHARD), 1, f"{CANNOT_READ} (a folder, not a file)"),
        DirCase("shard-one-byte-more", file_bytes(LAYER1_SHARD, lambda b: b + b"\0"), 1, f"{CANNOT_READ} (extra data"),
        DirCase("shard-zeroed-header", file_bytes(LAYER1_SHARD, lambda b: bytes(64) + b[64:]), 1, CANNOT_READ),
        DirCase("shard-all-but-one-missing", lambda f: [p.unlink() for p in f.glob("model-0000[234]*.safetensors")], 1,
                "model-00004-of-00004.safetensors cannot be read (no such file)"),
    ]
    header_shards = [DirCase(f"shard-header-{case.name}", file_bytes(LAYER1_SHARD, case.content), 1, CANNOT_READ)
                     for case in CASES]
    return bad_config + bad_index + bad_tensors + bad_scales + bad_shards + header_shards


DIR_CASES = _dir_cases()


# -- fixture folders for `stepper fixtures verify` (the sound one: `fixtures export` of mini)


@dataclass(frozen=True)
class FixtureCase:
    name: str
    edit: Callable[[Path], None]
    message: str  # in verify's one line on stderr (exit 2)


def manifest_edit(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        manifest = json.loads((folder / "manifest.json").read_text())
        change(manifest)
        (folder / "manifest.json").write_text(json.dumps(manifest))

    return edit


def entry_edit(key: str, value: Any) -> Callable[[Path], None]:
    def change(m: dict[str, Any]) -> None:
        if value is ...:
            del m["tensors"][0][key]
        else:
            m["tensors"][0][key] = value

    return manifest_edit(change)


def _fixture_cases() -> list[FixtureCase]:
    m = "manifest.json"
    return [
        FixtureCase("manifest-not-json", file_bytes(m, b"{"), "manifest.json: not valid JSON"),
        FixtureCase("manifest-duplicate-key", text_replaced(m, '"version": 1', '"version": 1, "version": 1'),
                    "key 'version' appears twice"),
        FixtureCase("manifest-nan", text_replaced(m, '"version": 1', '"version": NaN'), "NaN is not JSON"),
        FixtureCase("manifest-missing", removed(m), "no manifest.json"),
        FixtureCase("manifest-a-folder", made_folder(m), "no manifest.json"),
        FixtureCase("manifest-array", file_bytes(m, b"[]"), "not a stepper fixture manifest"),
        FixtureCase("manifest-other-format", manifest_edit(lambda d: d.update(format="other")),
                    "not a stepper fixture manifest"),
        FixtureCase("manifest-version-2", manifest_edit(lambda d: d.update(version=2)), "fixture format version 2"),
        FixtureCase("manifest-no-tensors", manifest_edit(lambda d: d.pop("tensors")), "no 'tensors'"),
        FixtureCase("manifest-tensors-object", manifest_edit(lambda d: d.update(tensors={})),
                    "'tensors' must be a list"),
        FixtureCase("manifest-config-null", manifest_edit(lambda d: d.update(config=None)),
                    "'config' must be an object"),
        FixtureCase("manifest-entry-number", manifest_edit(lambda d: d["tensors"].insert(0, 7)),
                    "tensors[0] must be an object"),
        FixtureCase("manifest-entry-no-name", entry_edit("name", ...), "tensors[0] no 'name'"),
        FixtureCase("manifest-entry-name-number", entry_edit("name", 3), "tensors[0] 'name' must be a string"),
        FixtureCase("manifest-entry-shape-string", entry_edit("shape", "1,2"), "tensors[0] 'shape' must be a list"),
        FixtureCase("manifest-entry-layer-bool", entry_edit("layer", True),
                    "tensors[0] 'layer' must be an integer or null"),
        FixtureCase("manifest-entry-no-tolerance", entry_edit("tolerance", ...), "tensors[0] no 'tolerance'"),
        FixtureCase("manifest-entry-wrong-shape", entry_edit("shape", [9]), "the manifest says [9]"),
        FixtureCase("manifest-entry-wrong-hash", entry_edit("sha256", "0" * 64), "does not match its sha256"),
        FixtureCase("manifest-entry-unknown-tensor", entry_edit("name", "nosuch"),
                    "tensor 'nosuch' of the manifest is missing"),
        FixtureCase("manifest-weight-file-path",
                    manifest_edit(lambda d: d["weights"]["files"].update({"../x": {"sha256": ""}})),
                    "must be a plain file name"),
        FixtureCase("tensors-missing", removed("tensors.safetensors"), "tensors.safetensors: no such file"),
        FixtureCase("tensors-truncated", file_bytes("tensors.safetensors", lambda b: b[:100]), "tensors.safetensors"),
        FixtureCase("tensors-not-safetensors", file_bytes("tensors.safetensors", b"hello world, not a file"),
                    "tensors.safetensors: header length"),
    ]


FIXTURE_CASES = _fixture_cases()


def changed_at(tree, changes) -> Any:
    """A copy of a parsed file with each (path, value) of `changes` set (value KeyError: the key
    removed); a path that an earlier change removed is skipped."""
    tree = copy.deepcopy(tree)
    for path, new in changes:
        try:
            inner = tree
            for key in path[:-1]:
                inner = inner[key]
            if new is KeyError:
                del inner[path[-1]]
            else:
                inner[path[-1]] = new
        except (KeyError, IndexError, TypeError):
            continue
    return tree


def paths_of(tree, prefix=()) -> list[tuple]:
    """Every path to a value inside a parsed file (lists: their first two items): the places a
    fuzzer changes one at a time."""
    found = [prefix] if prefix else []
    if isinstance(tree, dict):
        for key, inner in tree.items():
            found += paths_of(inner, (*prefix, key))
    elif isinstance(tree, list):
        for i, inner in enumerate(tree[:2]):
            found += paths_of(inner, (*prefix, i))
    return found


def config_edit(key: str, value: Any) -> Callable[[Path], None]:
    """A change to a checkpoint folder: config.json's `key` set to `value`, or removed when `value`
    is `...` (the fuzzers' config changes)."""
    def change(folder: Path) -> None:
        raw = json.loads((folder / "config.json").read_text())
        raw.pop(key, None) if value is ... else raw.__setitem__(key, value)
        (folder / "config.json").write_text(json.dumps(raw))

    return change
