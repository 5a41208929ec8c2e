"""The safetensors reader: values against the reference writer, read-only memory-mapped views,
lazy mapping, the malformed-file corpus (tests/malformed.py), the odd-but-valid files it must
accept, and fuzzing against the reference reader (whatever it rejects, we reject)."""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from helpers.files import mappings, reference_write, resident_pages
from helpers.malformed import CASES, DATA, VALID, assemble
from helpers.work import counted
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import save_file

from stepper.errors import StepperError
from stepper.weights.safetensors_reader import (
    DTYPES,
    MAX_HEADER_BYTES,
    SafetensorsFile,
    TensorInfo,
    dtype_of,
    huge_page_bytes,
    spanned,
)

# Corpus cases the reference reader (safetensors 0.8) accepts and we refuse on purpose.
STRICTER_THAN_REFERENCE = {
    "duplicate-tensor-name",  # serde keeps the last one
    "duplicate-metadata-key",  # serde keeps the last one
    "name-empty",  # names must say what a tensor is
    "name-escape-sequence",  # would reach the terminal (ESC [ 2 J clears the screen)
    "name-nul",
    "name-newline",
    "name-delete",
    "name-c1-control",
    "entry-array",  # serde reads a struct from a sequence: ["BF16", [3], [16, 22]]
    "entry-extra-key",  # serde ignores unknown fields
    "dtype-unsupported-here",  # F8_E4M3FNUZ, a dtype stepper has no use for
    "too-many-dims",  # NumPy cannot make a 41-dimensional array
}


def write(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


def mapping_of(array: np.ndarray) -> mmap.mmap | None:
    """The mmap an array views, found along its `.base` chain (None if it owns or copies its data)."""
    base = array.base
    while base is not None:
        if isinstance(base, mmap.mmap):
            return base
        if isinstance(base, memoryview):
            return base.obj if isinstance(base.obj, mmap.mmap) else None
        base = getattr(base, "base", None)
    return None


def address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def assert_mapped_view(f: SafetensorsFile, name: str, array: np.ndarray) -> None:
    """`array` is a read-only view of exactly the tensor's bytes in the file's memory map."""
    assert not array.flags.writeable
    with pytest.raises(ValueError):
        array.reshape(-1)[:1] = 0
    m = mapping_of(array)
    assert m is not None, f"{name} is not a view of a memory map"
    whole = np.frombuffer(m, dtype=np.uint8)
    assert np.shares_memory(array, whole) or array.size == 0
    if array.size:
        assert address(array) - address(whole) == f.data_range(name)[0]
    del whole


def numpy_arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "f64": rng.standard_normal((3, 5)),
        "f32": rng.standard_normal((4, 3, 2)).astype(np.float32),
        "f16": rng.standard_normal(7).astype(np.float16),
        "i64": rng.integers(-(2**62), 2**62, (2, 3), dtype=np.int64),
        "i32": rng.integers(-(2**30), 2**30, 5, dtype=np.int32),
        "i16": rng.integers(-(2**14), 2**14, 5, dtype=np.int16),
        "i8": rng.integers(-128, 128, 9, dtype=np.int8),
        "u64": rng.integers(0, 2**63, 3, dtype=np.uint64),
        "u32": rng.integers(0, 2**32, 3, dtype=np.uint32),
        "u16": rng.integers(0, 2**16, 3, dtype=np.uint16),
        "u8": rng.integers(0, 256, (2, 2, 2), dtype=np.uint8),
        "bool": rng.integers(0, 2, 6).astype(np.bool_),
        "scalar": np.array(2.5, dtype=np.float32),
        "empty": np.zeros((2, 0, 3), dtype=np.float32),
    }


def low_precision_arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 256, (5, 7), dtype=np.uint8)
    codes[codes & 0x7F == 0x7F] = 0  # no NaN codes, so == compares every value
    e5m2 = rng.standard_normal((3, 4)).astype(ml_dtypes.float8_e5m2)
    return {
        "bf16": rng.standard_normal((6, 4)).astype(ml_dtypes.bfloat16),
        "e4m3": codes.view(ml_dtypes.float8_e4m3fn),
        "e5m2": e5m2,
        "bf16_odd": rng.standard_normal(3).astype(ml_dtypes.bfloat16),
    }


# -- values against the reference writer -------------------------------------------------------


def test_numpy_dtypes_round_trip_from_the_reference_writer(tmp_path):
    arrays = numpy_arrays()
    path = tmp_path / "np.safetensors"
    save_file(arrays, str(path), metadata={"format": "np", "note": "ünïcode"})
    with SafetensorsFile(path) as f:
        assert f.metadata == {"format": "np", "note": "ünïcode"}
        assert sorted(f.names()) == sorted(arrays)
        for name, want in arrays.items():
            got = f.get(name)
            assert got.dtype == want.dtype and got.shape == want.shape, name
            np.testing.assert_array_equal(got, want)
            assert_mapped_view(f, name, got)


def test_bf16_and_fp8_round_trip_from_the_reference_serializer(tmp_path):
    arrays = low_precision_arrays()
    path = tmp_path / "low.safetensors"
    reference_write(path, arrays, metadata={"format": "pt"})
    with SafetensorsFile(path) as f:
        assert {n: f.info(n).dtype for n in f.names()} == {
            "bf16": "BF16", "e4m3": "F8_E4M3", "e5m2": "F8_E5M2", "bf16_odd": "BF16"
        }
        for name, want in arrays.items():
            got = f.get(name)
            assert got.dtype == want.dtype and got.shape == want.shape, name
            assert got.tobytes() == want.tobytes(), name
            np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
            assert_mapped_view(f, name, got)


def test_dtype_table():
    assert set(DTYPES) == {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "I64", "I32", "I16", "I8",
                           "U8", "U16", "U32", "U64", "BOOL"}
    assert dtype_of("BF16") == np.dtype(ml_dtypes.bfloat16) and dtype_of("F8_E4M3") == np.dtype(ml_dtypes.float8_e4m3fn)
    assert dtype_of("F32") == np.dtype("<f4") and dtype_of("F8_E8M0") == np.dtype(ml_dtypes.float8_e8m0fnu)
    assert all(dtype_of(name).itemsize == size for name, (_, size) in DTYPES.items())


def test_header_api(tmp_path):
    path = write(tmp_path / "v.safetensors", VALID)
    with SafetensorsFile(path) as f:
        assert f.path == path and f.header_size == len(VALID) - len(DATA)
        assert f.names() == ["a", "b"] and "a" in f and "c" not in f
        assert f.info("b") == TensorInfo("b", "BF16", (3,), 16, 22) and f.info("b").nbytes == 6
        assert f.data_range("a") == (f.header_size, f.header_size + 16)
        assert f.get("b").tobytes() == DATA[16:22]
        with pytest.raises(StepperError, match=r"v\.safetensors: no tensor named 'c'"):
            f.info("c")
        with pytest.raises(StepperError, match="no tensor named 'c'"):
            f.get("c")


def test_names_are_in_offset_order_whatever_the_header_order(tmp_path):
    header = '{"z":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},"y":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}'
    with SafetensorsFile(write(tmp_path / "o.safetensors", assemble(header, b"\1\2\3\4"))) as f:
        assert f.names() == ["y", "z"]
        assert f.get("z").tolist() == [3, 4]


# -- memory mapping ------------------------------------------------------------------------------


def mapped_paths() -> str:
    with open("/proc/self/maps") as maps:
        return maps.read()


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
def test_opening_maps_nothing_and_the_first_get_maps_the_file_once(tmp_path):
    path = tmp_path / "lazy.safetensors"
    save_file(numpy_arrays(), str(path))
    f = SafetensorsFile(path)
    assert str(path) not in mapped_paths()
    a, b = f.get("f32"), f.get("i64")
    assert str(path) in mapped_paths()
    assert mapping_of(a) is mapping_of(b)
    f.close()
    np.testing.assert_array_equal(a, numpy_arrays()["f32"])  # views outlive close()
    del a, b


def test_values_reads_a_small_tensor_into_a_read_only_copy_and_maps_nothing(tmp_path):
    path = tmp_path / "small.safetensors"
    save_file(numpy_arrays(), str(path))
    f = SafetensorsFile(path)
    for name, want in numpy_arrays().items():
        got = f.values(name)
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype and not got.flags.writeable and mapping_of(got) is None
    assert str(path) not in mapped_paths()
    os.replace(write(tmp_path / "other.safetensors", VALID), path)
    with pytest.raises(StepperError, match="small.safetensors: the file changed"):
        f.values("f32")


def test_a_sparse_gigabyte_opens_and_reads_one_tensor_without_touching_the_rest(tmp_path):
    header = json.dumps({
        "small": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "huge": {"dtype": "U8", "shape": [2**30], "data_offsets": [16, 16 + 2**30]},
    })
    path = tmp_path / "sparse.safetensors"
    with open(path, "wb") as out:
        out.write(assemble(header, np.arange(4, dtype=np.float32).tobytes()))
        out.truncate(8 + len(header) + 16 + 2**30)
    with counted(traced=True) as work, SafetensorsFile(path) as f:
        assert f.get("small").tolist() == [0, 1, 2, 3]
        huge = f.get("huge")
        assert huge.shape == (2**30,) and int(huge[12345]) == 0
        del huge
    assert work.peak < 64 * 1024 and work.read == 8 + len(header)  # the header alone through read()
    if sys.platform == "linux":  # and of the gigabyte, the one block the value read faults in
        assert resident_pages(path).sum() <= 1 + huge_page_bytes() // mmap.PAGESIZE


def evict(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


@pytest.mark.skipif(not hasattr(os, "posix_fadvise") or sys.platform != "linux", reason="needs Linux mincore")
def test_only_the_blocks_of_the_tensor_used_are_read(tmp_path):
    """A fault reads the aligned huge-page block around it, never the rest of the file."""
    page, block = mmap.PAGESIZE, huge_page_bytes()
    path = tmp_path / "pages.safetensors"
    save_file({name: np.full(4 * block, i + 1, np.uint8) for i, name in enumerate("abc")}, str(path))
    evict(path)
    if resident_pages(path).any():
        pytest.skip("this file system keeps pages cached after POSIX_FADV_DONTNEED")
    with SafetensorsFile(path) as f:
        header_pages = -(-f.header_size // page)
        assert not resident_pages(path)[header_pages:].any(), "opening read tensor data"
        assert int(f.get("b").sum()) == 2 * 4 * block
        start, end = f.data_range("b")
        read = np.flatnonzero(resident_pages(path)[header_pages:]) + header_pages
        first, last = start - start % block, end + -end % block  # the blocks holding b
        assert read.size and first // page <= read.min() and read.max() < last // page, (start, end, read)


def test_spanned_counts_the_whole_blocks_a_range_touches():
    assert spanned(0, 1, 4096) == 4096 and spanned(4095, 4097, 4096) == 8192 and spanned(8192, 8192, 4096) == 0
    mb2 = 1 << 21
    expert = 7 * mb2  # 7168 x 2048 bytes
    assert spanned(mb2, mb2 + expert, mb2) == expert and spanned(mb2 - 1, mb2 - 1 + expert, mb2) == expert + mb2


@pytest.mark.skipif(not Path("/sys/kernel/mm/transparent_hugepage").is_dir() or huge_page_bytes() != 1 << 21,
                    reason="Linux with 2 MB transparent huge pages")
def test_checkpoint_maps_are_advised_random_reads_in_huge_page_blocks(tmp_path):
    path = write(tmp_path / "v.safetensors", VALID)
    with SafetensorsFile(path) as f:
        address = f.get("a").__array_interface__["data"][0]
        flags = next(m["VmFlags"] for m in mappings() if m["low"] <= address < m["high"])
        assert "rr" in flags and "hg" in flags, flags  # MADV_RANDOM, MADV_HUGEPAGE


def test_get_after_close_and_a_replaced_file_are_errors(tmp_path):
    path = write(tmp_path / "v.safetensors", VALID)
    f = SafetensorsFile(path)
    f.close()
    with pytest.raises(StepperError, match="v.safetensors: file was closed"):
        f.get("a")
    g = SafetensorsFile(path)
    other = write(tmp_path / "other.safetensors", VALID)
    os.replace(other, path)
    with pytest.raises(StepperError, match="v.safetensors: the file changed"):
        g.get("a")


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(StepperError, match="nope.safetensors: no such file"):
        SafetensorsFile(tmp_path / "nope.safetensors")
    with pytest.raises(StepperError, match="not a regular file"):
        SafetensorsFile(tmp_path)


# -- files that must be accepted ------------------------------------------------------------------


def test_unaligned_tensors_are_views_and_compute_right(tmp_path):
    want = {
        "f32": np.arange(6, dtype=np.float32).reshape(2, 3) / 7,
        "i64": np.arange(3, dtype=np.int64) - 5,
        "bf16": (np.arange(5, dtype=np.float32) / 3).astype(ml_dtypes.bfloat16),
        "e4m3": np.array([0.5, -1.5, 448.0], dtype=np.float32).astype(ml_dtypes.float8_e4m3fn),
    }
    names = {"float32": "F32", "int64": "I64", "bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3"}
    header, data = {}, b""
    for name, array in want.items():  # every size is even, so every tensor starts at an odd address
        header[name] = {"dtype": names[array.dtype.name], "shape": list(array.shape),
                        "data_offsets": [len(data), len(data) + array.nbytes]}
        data += array.tobytes()
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((-len(text)) % 8 + 1)  # header length 1 more than a multiple of 8
    with SafetensorsFile(write(tmp_path / "odd.safetensors", assemble(text, data))) as f:
        for name, array in want.items():
            got = f.get(name)
            assert not got.flags.aligned or got.dtype.itemsize == 1
            assert_mapped_view(f, name, got)
            np.testing.assert_array_equal(got.astype(np.float32), array.astype(np.float32))
        assert float((f.get("f32") @ np.ones(3, np.float32)).sum()) == pytest.approx(float(want["f32"].sum()))


ACCEPTED = {
    "empty-header": ("{}", b""),
    "empty-header-padded": ("{}      ", b""),
    "whitespace-around": ("\n\t {} \r\n", b""),
    "metadata-only": ('{"__metadata__":{"format":"pt","":""}}', b""),
    "empty-metadata": ('{"__metadata__":{}}', b""),
    "scalar": ('{"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]}}', b"\0" * 8),
    "zero-size": ('{"z":{"dtype":"F32","shape":[2,0,3],"data_offsets":[0,0]}}', b""),
    "zero-size-pair-same-offset": (
        '{"y":{"dtype":"I8","shape":[0],"data_offsets":[0,0]},"z":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}',
        b"",
    ),
    "zero-size-between-and-after": (
        (
            '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"z":{"dtype":"F32","shape":[0],"data_offsets":[1,1]},'
            '"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},"e":{"dtype":"BF16","shape":[0,5],"data_offsets":[2,2]}}'
        ),
        b"\1\2",
    ),
    "zero-size-with-big-dim": ('{"z":{"dtype":"U8","shape":[4611686018427387904,0],"data_offsets":[0,0]}}', b""),
    "metadata-null": ('{"__metadata__":null,"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\1"),
    "e8m0-scales": ('{"s":{"dtype":"F8_E8M0","shape":[2],"data_offsets":[0,2]}}', b"\x7f\x80"),
    "unicode-name": ('{"\\u00e9t\\u00e9 \\ud83d\\ude00":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\1"),
    "32-dims": ('{"d":{"dtype":"U8","shape":[' + ",".join(["1"] * 32) + '],"data_offsets":[0,1]}}', b"\1"),
}


@pytest.mark.parametrize("case", ACCEPTED, ids=list(ACCEPTED))
def test_valid_edge_cases_are_accepted(tmp_path, case):
    header, data = ACCEPTED[case]
    path = write(tmp_path / f"{case}.safetensors", assemble(header, data))
    with SafetensorsFile(path) as f:
        for name in f.names():
            info, array = f.info(name), f.get(name)
            assert array.shape == info.shape and array.nbytes == info.nbytes
            assert array.tobytes() == data[info.start:info.end]
    with safe_open(str(path), framework="numpy") as ref:  # the reference reader agrees
        assert sorted(ref.keys()) == sorted(f.names())


# -- the malformed corpus ------------------------------------------------------------------------


def test_corpus_is_large_and_every_case_distinct():
    assert len(CASES) >= 40
    assert len({c.name for c in CASES}) == len(CASES)
    assert len({c.content for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_malformed_file_is_refused_quickly_cheaply_and_by_name(tmp_path, case):
    path = write(tmp_path / f"{case.name}.safetensors", case.content)
    with counted(lines=True, traced=True) as work, pytest.raises(StepperError) as caught:
        SafetensorsFile(path)
    message = str(caught.value)
    assert message.startswith(str(path) + ": ") and "\n" not in message
    if case.tensor is not None:
        assert f"tensor '{case.tensor}'" in message
    assert work.read <= header_bytes(case.content), work  # never the data, nor a header over the limit
    assert work.lines < REFUSAL_LINES, work  # no loop over a size or count the file declares
    assert work.peak < max(len(case.content), 64 * 1024) + 32 * 1024, work


REFUSAL_LINES = 2000  # Python lines a refusal runs: a few hundred; a loop over a declared 2^40 would run billions


def header_bytes(content: bytes) -> int:
    """What a reader must read of a file to refuse it: the 8-byte length and the header it
    declares, as much as the file holds; none of a header past the limit."""
    if len(content) < 8:
        return 0
    declared = int.from_bytes(content[:8], "little")
    return 8 if declared > MAX_HEADER_BYTES else 8 + min(declared, len(content) - 8)


@pytest.mark.parametrize("case", [c for c in CASES if c.name not in STRICTER_THAN_REFERENCE], ids=lambda c: c.name)
def test_the_reference_reader_refuses_the_corpus_too(tmp_path, case):
    path = write(tmp_path / f"{case.name}.safetensors", case.content)
    with pytest.raises(Exception), safe_open(str(path), framework="numpy"):  # noqa: B017 (any error)
        pass


def test_header_over_the_size_limit_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "big.safetensors"
    with open(path, "wb") as out:
        out.write((100_000_001).to_bytes(8, "little") + b"{}")
        out.truncate(8 + 100_000_001)  # sparse: the claimed header really is in the file
    with counted(traced=True) as work, pytest.raises(StepperError,
                                                     match="big.safetensors: header length 100000001 is over"):
        SafetensorsFile(path)
    assert work.peak < 64 * 1024 and work.read == 8  # the length alone


def test_nesting_past_the_parser_recursion_limit_is_a_stepper_error(tmp_path):
    header = '{"x":' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(StepperError, match="deep.safetensors: header JSON is nested too deeply"):
        SafetensorsFile(write(tmp_path / "deep.safetensors", assemble(header, b"")))


# -- fuzzing ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_path(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "f.safetensors"


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> list[bytes]:
    folder = tmp_path_factory.mktemp("seeds")
    save_file({k: v for k, v in numpy_arrays().items() if k in ("f32", "i8", "empty", "scalar")},
              str(folder / "np.safetensors"), metadata={"k": "v"})
    reference_write(folder / "low.safetensors", {k: v for k, v in low_precision_arrays().items() if k != "e5m2"})
    return [VALID, assemble("{}", b""), (folder / "np.safetensors").read_bytes(),
            (folder / "low.safetensors").read_bytes()]


def reference_view(path: Path) -> tuple[list[str], dict[str, str], dict[str, bytes]] | None:
    """What the reference reader makes of a file: names, metadata, the bytes of the tensors
    its NumPy API can return; None if it refuses the file."""
    try:
        with safe_open(str(path), framework="numpy") as f:
            names, metadata, values = list(f.keys()), f.metadata() or {}, {}
            for name in names:
                with contextlib.suppress(Exception):  # BF16/FP8 are not in its NumPy API
                    values[name] = f.get_tensor(name).tobytes()
            return names, metadata, values
    except Exception:  # noqa: BLE001 (its refusal, whatever the type)
        return None


def check_against_reference(path: Path, content: bytes) -> None:
    """Ours succeeds or raises StepperError (never anything else); refuses whatever the reference
    refuses; and when both accept, they agree on names, metadata and bytes."""
    path.write_bytes(content)
    try:
        ours = SafetensorsFile(path)
    except StepperError:
        ours = None
    reference = reference_view(path)
    if reference is None:
        assert ours is None, "the reference reader refuses this file but we accept it"
        return
    if ours is None:
        return
    with ours:
        names, metadata, values = reference
        assert sorted(names) == sorted(ours.names()) and metadata == ours.metadata
        for name in ours.names():
            array = ours.get(name)
            assert array.shape == ours.info(name).shape
            if name in values:
                assert array.tobytes() == values[name]
            del array


FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(data=st.data())
def test_mutated_files(fuzz_path, seeds, data):
    content = bytearray(data.draw(st.sampled_from(seeds)))
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "flip", "truncate", "insert", "delete", "length"]))
        at = data.draw(st.integers(0, max(len(content) - 1, 0)))
        if kind == "flip" and content:
            content[at] ^= data.draw(st.integers(1, 255))
        elif kind == "truncate":
            del content[at:]
        elif kind == "insert":
            content[at:at] = data.draw(st.binary(min_size=1, max_size=3))
        elif kind == "delete":
            del content[at:at + data.draw(st.integers(1, 3))]
        elif kind == "length" and len(content) >= 8:
            n = int.from_bytes(content[:8], "little") + data.draw(st.integers(-3, 3))
            content[:8] = (n % 2**64).to_bytes(8, "little")
    check_against_reference(fuzz_path, bytes(content))


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 2**65) | st.floats() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)
NAMES = st.sampled_from(["a", "b", "", "__metadata__", "\ud800", "é"]) | st.text(max_size=3)
DTYPE_NAMES = st.sampled_from(list(DTYPES) * 3 + ["F8_E8M0", "C64", "bf16", "f32", "X"])


def edit_entry(draw, entries: list[list]) -> None:
    """One edit of a drawn entry, in place: its value, a key renamed, dropped or added, a duplicate,
    its offsets moved, or the whole entry replaced."""
    target = draw(st.sampled_from(entries))
    edit = draw(st.sampled_from(["value", "key", "drop", "extra", "dup", "offset", "entry"]))
    entry = target[1]
    if edit == "entry":
        target[1] = draw(JSON_VALUES)
    elif edit == "dup":
        entries.append(list(target))
    elif isinstance(entry, dict) and entry:
        key = draw(st.sampled_from(sorted(entry)))
        if edit == "value":
            entry[key] = draw(JSON_VALUES)
        elif edit == "drop":
            del entry[key]
        elif edit == "extra":
            entry[draw(st.text(max_size=3))] = draw(JSON_VALUES)
        elif edit == "offset" and isinstance(entry.get("data_offsets"), list):
            entry["data_offsets"] = [o + draw(st.integers(-2, 2)) if isinstance(o, int) else o  # after a value edit,
                                     for o in entry["data_offsets"]]  # the list may hold anything
        elif edit == "key":
            entry[key + "x"] = entry.pop(key)


@st.composite
def header_files(draw) -> bytes:
    """A header built from parts: mostly consistent tensors laid out in a random order, then at
    most a few edits that may or may not break it; the data bytes sized to match, or not."""
    specs = draw(st.lists(st.tuples(NAMES, DTYPE_NAMES, st.lists(st.integers(0, 4), max_size=3)), max_size=4))
    order = draw(st.permutations(range(len(specs))))
    entries: list[list] = [[]] * len(specs)
    offset = 0
    for i in order:
        name, dtype, shape = specs[i]
        nbytes = int(np.prod(shape, dtype=np.int64)) * (DTYPES[dtype][1] if dtype in DTYPES else 2)
        entries[i] = [name, {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}]
        offset += nbytes
    if draw(st.booleans()):
        metadata = draw(st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2) | JSON_VALUES)
        entries.insert(draw(st.integers(0, len(entries))), ["__metadata__", metadata])
    for _ in range(draw(st.integers(0, 2))):
        if not entries:
            break
        edit_entry(draw, entries)
    ascii_only = draw(st.booleans())
    text = "{" + ",".join(json.dumps(k, ensure_ascii=ascii_only) + ":" + json.dumps(v, ensure_ascii=ascii_only)
                          for k, v in entries) + "}"
    text = draw(st.sampled_from(["", " ", "\n"])) + text + draw(st.sampled_from(["", "  ", " \t\r\n", "\0"]))
    header = text.encode("utf-8", "surrogatepass")
    size = max(offset + draw(st.sampled_from([0, 0, 0, -1, 1, 2])), 0)
    length = len(header) + draw(st.sampled_from([0, 0, 0, 0, -1, 1]))
    return assemble(header, np.random.default_rng(draw(st.integers(0, 2**16))).bytes(size), length=length)


@FUZZ
@given(content=header_files())
def test_random_headers(fuzz_path, content):
    check_against_reference(fuzz_path, content)


@FUZZ
@given(content=st.binary(max_size=64))
def test_random_bytes_after_a_plausible_length(fuzz_path, content):
    check_against_reference(fuzz_path, len(content).to_bytes(8, "little") + content)


def test_mapped_budget_lets_go_of_the_least_recently_used_past_its_limit():
    from stepper.weights.safetensors_reader import MappedBudget

    gone = []
    budget = MappedBudget(10)
    for key in "abc":
        budget.use(key, 4, lambda key=key: gone.append(key))
    assert gone == ["a"]  # 12 > 10: the oldest goes
    budget.use("b", 4, lambda: gone.append("b"))  # used again: now the newest
    budget.use("d", 4, lambda: gone.append("d"))
    assert gone == ["a", "c"] and list(budget.kept) == ["b", "d"]
    budget.use("huge", 50, lambda: gone.append("huge"))  # over the limit alone: kept, the rest go
    assert gone == ["a", "c", "b", "d"] and list(budget.kept) == ["huge"]
    assert budget.total == 50
    budget.use("huge", 6, lambda: gone.append("huge"))  # the same range again, smaller: counted once, as it is now
    budget.use("e", 4, lambda: gone.append("e"))
    assert budget.total == 10 and list(budget.kept) == ["huge", "e"] and gone == ["a", "c", "b", "d"]
    budget.use("f", 1, lambda: gone.append("f"))
    assert budget.total == 5 and list(budget.kept) == ["e", "f"] and gone[-1] == "huge"
