"""The tensor catalogue (stepper/catalog.json) is data; these tests keep it consistent and honest.

- Every name is unique, every dimension symbol is defined, and the entries follow docs/names.md
  (same names, same order, same number of dimensions).
- The transformers line ranges are checked against the installed modeling_deepseek_v3.py: every
  cited line exists and at least one of them contains the entry's `transformers_hint`. This only
  runs when the installed transformers is the version the catalogue was written against.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NAMES_MD = REPO / "docs" / "names.md"

BLOCKS = {"model", "norm", "attention", "residual", "mlp", "router", "moe"}
LAYERS = {"all", "dense", "moe"}
PATHS = {"both", "naive", "absorb"}
DTYPES = {"float32", "int64"}
REFERENCE_KEYS = {"variable", "modeling_deepseek.py", "transformers", "transformers_hint", "inference"}
FAMILY_REFERENCE_KEYS = {"transformers_model", "inference_v32"}  # optional: a family's own reference files
FAMILY_MODELS = {"deepseek_v2", "deepseek_v32"}
WHEN_FIELDS = {"scoring_func": {"sigmoid", "softmax"}, "topk_method": {"noaux_tc", "greedy", "group_limited_greedy"},
               "has_indexer": {True}}
ALIAS_KEYS = {"hf_module", "inference", "llama.cpp"}


def load_catalog() -> dict:
    text = resources.files("stepper.catalog").joinpath("catalog.json").read_text(encoding="utf-8")
    return json.loads(text)


@pytest.fixture(scope="module")
def catalog() -> dict:
    return load_catalog()


def line_range_ok(value) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(n, int) and not isinstance(n, bool) for n in value)
        and 1 <= value[0] <= value[1]
    )


def test_header(catalog):
    assert catalog["format"] == "stepper-catalog"
    assert catalog["version"] == 1
    assert {"modeling_deepseek.py", "transformers", "inference"} <= set(catalog["references"])
    assert catalog["references"]["transformers"]["version"]


def test_names_are_unique(catalog):
    names = [e["name"] for e in catalog["tensors"]]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    assert not duplicates, f"duplicate catalogue names: {duplicates}"


def test_every_dim_symbol_is_defined(catalog):
    defined = set(catalog["dims"])
    for e in catalog["tensors"]:
        unknown = [s for s in e["dims"] if s not in defined]
        assert not unknown, f"{e['name']}: undefined dim symbols {unknown}"


def test_dim_sizes_are_runtime_or_config_expressions(catalog):
    term = r"(?:\d+|[a-z_][a-z0-9_]*)"
    expression = re.compile(rf"^{term}(?:\s*[+*]\s*{term})*$")
    for symbol, dim in catalog["dims"].items():
        assert dim["label"], symbol
        assert dim["size"] == "runtime" or expression.match(dim["size"]), f"{symbol}: bad size {dim['size']!r}"


def test_entries_follow_the_schema(catalog):
    for e in catalog["tensors"]:
        name = e["name"]
        assert e["scope"] in {"layer", "global"}, name
        assert not name.startswith("layers."), f"{name}: catalogue names carry no layers.{{i}} prefix"
        assert e["block"] in BLOCKS, name
        assert e["layers"] in LAYERS, name
        assert e["path"] in PATHS, name
        assert e["dtype"] in DTYPES, name
        assert 0 < len(e["description"]) <= 100, f"{name}: description must be one line of at most 100 chars"
        assert "\n" not in e["description"], name
        assert e["formula"] and e["explain"], name
        assert REFERENCE_KEYS <= set(e["reference"]) <= REFERENCE_KEYS | FAMILY_REFERENCE_KEYS, \
            f"{name}: reference keys {sorted(e['reference'])}"
        assert set(e["aliases"]) == ALIAS_KEYS, f"{name}: alias keys {sorted(e['aliases'])}"
        ref = e["reference"]
        for key in ("modeling_deepseek.py", "transformers", "inference", "inference_v32"):
            assert ref.get(key) is None or line_range_ok(ref[key]), f"{name}: bad {key} range {ref[key]!r}"
        assert (ref["transformers"] is None) == (ref["transformers_hint"] is None), f"{name}: range without hint"
        assert ref.get("transformers_model", "deepseek_v3") in FAMILY_MODELS | {"deepseek_v3"}, name
        for field, values in e.get("when", {}).items():
            assert field in WHEN_FIELDS and values and set(values) <= WHEN_FIELDS[field], f"{name}: when {field} {values}"
    int_tensors = [e["name"] for e in catalog["tensors"] if e["dtype"] == "int64"]
    assert int_tensors == ["mlp.gate.topk_idx", "self_attn.indexer.topk_idx"]


def test_a_family_entry_follows_an_earlier_entry_and_cites_its_family(catalog):
    seen = set()
    for e in catalog["tensors"]:
        if "after" in e:
            assert e["after"] in seen, f"{e['name']}: after {e['after']!r}, which does not come before it"
            assert e.get("when") and e["reference"].get("transformers_model") in FAMILY_MODELS, e["name"]
        seen.add(e["name"])


def test_absorbed_entries_cite_deepseek_inference(catalog):
    for e in catalog["tensors"]:
        ref = e["reference"]
        if e["path"] == "absorb":
            assert line_range_ok(ref["inference"]), e["name"]
            assert ref["modeling_deepseek.py"] is None and ref["transformers"] is None, e["name"]
        elif "transformers_model" in ref:  # another family's tensor: V3's modeling_deepseek.py has none
            assert line_range_ok(ref["transformers"]), e["name"]
        else:
            assert line_range_ok(ref["modeling_deepseek.py"]), f"{e['name']}: no modeling_deepseek.py range"


def names_md_rows() -> list[tuple[str, int | None]]:
    """(name, number of shape entries) for every tensor row of docs/names.md, in order."""
    rows = []
    for line in NAMES_MD.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2:
            continue
        names = [n for n in re.findall(r"`([^`]+)`", cells[0]) if re.fullmatch(r"[a-z][a-z0-9_.]*[a-z0-9_]", n)]
        width = len(cells[1].split(",")) if cells[1] else None
        rows.extend((n, width) for n in names)
    return rows


@pytest.mark.skipif(not NAMES_MD.exists(), reason="docs/names.md is not in this checkout")
def test_names_order_and_rank_follow_docs_names_md(catalog):
    documented = names_md_rows()
    assert [n for n, _ in documented] == [e["name"] for e in catalog["tensors"]]
    by_name = {e["name"]: e for e in catalog["tensors"]}
    for name, width in documented:
        if width is not None:
            assert len(by_name[name]["dims"]) == width, f"{name}: {by_name[name]['dims']} vs {width} dims in names.md"


def installed_modeling_deepseek_v3(expected_version: str, model: str = "deepseek_v3") -> list[str]:
    transformers = pytest.importorskip("transformers")
    if transformers.__version__ != expected_version:
        pytest.skip(
            f"line numbers were taken from transformers {expected_version}; "
            f"transformers {transformers.__version__} is installed"
        )
    path = Path(transformers.__file__).parent / "models" / model / f"modeling_{model}.py"
    return path.read_text(encoding="utf-8").splitlines()


def test_transformers_line_ranges_contain_their_hint(catalog):
    version = catalog["references"]["transformers"]["version"]
    files = {m: installed_modeling_deepseek_v3(version, m) for m in FAMILY_MODELS | {"deepseek_v3"}}
    problems = []
    for e in catalog["tensors"]:
        ref = e["reference"]
        if ref["transformers"] is None:
            continue
        lines = files[ref.get("transformers_model", "deepseek_v3")]
        start, end = ref["transformers"]
        if end > len(lines):
            problems.append(f"{e['name']}: lines {start}-{end} past the end of the file ({len(lines)} lines)")
            continue
        cited = lines[start - 1 : end]
        if not any(ref["transformers_hint"] in line for line in cited):
            problems.append(f"{e['name']}: {ref['transformers_hint']!r} not in lines {start}-{end}: {cited}")
    assert not problems, "\n".join(problems)
