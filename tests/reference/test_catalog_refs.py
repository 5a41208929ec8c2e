"""The tensor catalogue (stepper/catalog/parts/*.json, merged) is data; these tests keep it
consistent and honest.

- Every name is unique, every dimension symbol is defined, and the entries follow docs/names.md
  (same names, each once, same number of dimensions).
- Which path, scoring or family emits an entry is not in the data; the model says it
  (families.derive), and the citations follow what it says.
- Every citation names its own file's lines: `{"lines": [first, last], "symbol": ..., "text": ...}`
  where `text` is the first cited line as the cited revision reads it and `symbol` is on that line;
  the sources that are not installed also record the lines after it (`code`), which `explain` shows.
  Those agree with each other always; against the files they are checked where the files are:
  transformers' citations against the installed package when it is the cited version, and the
  sources that are not installed (modeling_deepseek.py, DeepSeek's inference/model.py) against a
  local copy of the cited revision (recognised by its git blob id) in the folder named by
  $STEPPER_REFERENCE_SOURCES, laid out as the references' `path`s. modeling_deepseek.py is cited at
  moonshotai/Kimi-K2-Instruct's revision, whose blob id is not recorded: its lines were read from a
  copy of DeepSeek-V3's file (`read_from`'s blob), and a file at FOLDER/Kimi-K2-Instruct/PATH is
  taken as the cited revision.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import re
from pathlib import Path

import pytest
from helpers.configs import family_preset

from stepper import catalog as stepper_catalog
from stepper.catalog import family_cites
from stepper.families import derive
from stepper.model.options import LayerOptions
from stepper.presets import PRESETS

REPO = Path(__file__).resolve().parents[2]
NAMES_MD = REPO / "docs" / "names.md"

BLOCKS = {"model", "norm", "attention", "kda", "residual", "mlp", "router", "moe"}
DTYPES = {"float32", "int64"}
REFERENCE_KEYS = {"variable", "modeling_deepseek.py", "transformers", "inference"}
FAMILY_REFERENCE_KEYS = {"inference_v32"}  # optional: DeepSeek-V3.2-Exp's own inference code, for the indexer
CITATION_KEYS = {"lines", "symbol", "text"}  # and optionally "path" (another file of the same source), "code"
SOURCES = ("modeling_deepseek.py", "transformers", "inference", "inference_v32")
MLA_FAMILY_FILES = ("models/axk1/", "models/mistral4/", "models/minicpm3/", "models/glm_moe_dsa/", "models/axk2/",
                    "models/longcat_flash/", "models/kimi_linear/", "models/bailing_hybrid/",
                    "models/mistral_large4/")  # issues 33, 34; Ling 3, Mistral Large 4
# a family entry cites its family's transformers file
FAMILY_FILES = ("models/deepseek_v2/", "models/deepseek_v32/", *MLA_FAMILY_FILES)
NOT_DATA = {"layers", "path", "when", "after"}  # order and branches: the model's to say (families.derive)
ALIAS_KEYS = {"hf_module", "inference", "llama.cpp"}


def load_catalog() -> dict:
    """The catalogue of the families whose layers take MLA's residual stream (DeepSeek-V4's parts,
    with their own references and schema, are checked by tests/model/test_v4_attention_catalog.py
    and test_v4_parts.py)."""
    return stepper_catalog.around(family_preset("tiny")).raw


def emitted(presets: tuple[str, ...], attn: tuple[str, ...], scoring: tuple[str, ...]) -> set[str]:
    """The names some layer of these presets emits on these attention paths and index scorings."""
    cat = stepper_catalog.load()
    names = {stepper_catalog.key_of(e["name"])  # LongCat's sublayer names (`sub0.`) by their entry's
             for name in presets for cfg in [family_preset(name)] for layer in range(cfg.num_hidden_layers)
             for a in attn for s in scoring for e in cat.layer_sequence(cfg, layer, a, s)}
    recurrent = {e.key for name in presets for cfg in [family_preset(name)] for layer in range(cfg.num_hidden_layers)
                 for a in attn for e in derive.layer_emits(cfg, layer, LayerOptions(a, delta_rule="recurrent"))}
    return names | recurrent  # Kimi Linear's token-by-token delta rule shows every token's state


ALL_PRESETS = tuple(PRESETS)
V3 = ("tiny-v3", "kimi-k2", "deepseek-v3")  # the family modeling_deepseek.py is: the others are its descendants


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


def citation_ok(value) -> bool:
    """A citation's parts agree with each other: valid lines, its symbol on the recorded first line,
    the recorded lines after it (when there are) as many as the range has."""
    return (
        isinstance(value, dict)
        and CITATION_KEYS <= set(value) <= CITATION_KEYS | {"path", "code"}
        and line_range_ok(value["lines"])
        and isinstance(value["symbol"], str) and len(value["symbol"]) > 1
        and isinstance(value["text"], str) and value["symbol"] in value["text"]
        and ("code" not in value or (isinstance(value["code"], list) and all(isinstance(x, str) for x in value["code"])
                                     and len(value["code"]) == value["lines"][1] - value["lines"][0]))
    )


def test_header(catalog):
    assert catalog["format"] == "stepper-catalog"
    assert catalog["version"] == 1
    references = catalog["references"]
    assert set(SOURCES) <= set(references)
    transformers = references["transformers"]
    assert (transformers["package"] == "transformers" and transformers["version"]
            and transformers["path"].endswith(".py"))
    for source in ("modeling_deepseek.py", "inference", "inference_v32"):  # not installed: the revision is recorded
        about = references[source]
        assert about["label"] and about["repo"] and about["path"], source
        blob = about["blob"] or about["read_from"]["blob"]  # the file the lines were read from
        assert re.fullmatch(r"[0-9a-f]{40}", about["commit"]) and re.fullmatch(r"[0-9a-f]{40}", blob), source
    assert references["modeling_deepseek.py"]["repo"] == "moonshotai/Kimi-K2-Instruct"  # the model's own repository


def test_sources_not_installed_record_every_cited_line(catalog):
    for source in ("modeling_deepseek.py", "inference", "inference_v32"):
        for name, citation in cited(catalog, source):
            first, last = citation["lines"]
            assert len(citation.get("code", [])) == last - first, f"{name}: {source} lines {first}-{last}"


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
        assert not NOT_DATA & set(e), f"{name}: {sorted(NOT_DATA & set(e))} is the model's to say, not the catalogue's"
        assert e["dtype"] in DTYPES, name
        assert 0 < len(e["description"]) <= 100, f"{name}: description must be one line of at most 100 chars"
        assert "\n" not in e["description"], name
        assert e["formula"] and e["explain"], name
        assert REFERENCE_KEYS <= set(e["reference"]) <= REFERENCE_KEYS | FAMILY_REFERENCE_KEYS, \
            f"{name}: reference keys {sorted(e['reference'])}"
        assert set(e["aliases"]) == ALIAS_KEYS, f"{name}: alias keys {sorted(e['aliases'])}"
        ref = e["reference"]
        for key in SOURCES:
            assert ref.get(key) is None or citation_ok(ref[key]), f"{name}: bad {key} citation {ref[key]!r}"
        assert not re.search(r"\blines? \d", ref["variable"]), f"{name}: line numbers belong in a citation"
    int_tensors = [e["name"] for e in catalog["tensors"] if e["dtype"] == "int64"]
    assert sorted(int_tensors) == sorted(["mlp.gate.topk_idx", "self_attn.indexer.topk_idx",
                                          "self_attn.indexer.exact_topk_idx", "self_attn.indexer.kept_of_exact",
                                          "self_attn.indexer.reused_topk_idx"])


@pytest.fixture(scope="module")
def branches() -> dict[str, set[str]]:
    """Names by where the model emits them: on the naive path, the absorbed one, with FP8 index
    scoring, in V3's family (every layer, either path)."""
    return {"naive": emitted(ALL_PRESETS, ("naive",), ("exact", "fp8")),
            "absorb": emitted(ALL_PRESETS, ("absorb",), ("exact", "fp8")),
            "exact": emitted(ALL_PRESETS, ("naive", "absorb"), ("exact",)),
            "v3": emitted(V3, ("naive", "absorb"), ("exact",))}


def test_every_layer_entry_is_emitted_by_some_preset(catalog, branches):
    every = branches["naive"] | branches["absorb"]
    assert [e["name"] for e in catalog["tensors"] if e["scope"] == "layer" and e["name"] not in every] == []


def test_a_family_entry_cites_its_family(catalog, branches):
    for e in catalog["tensors"]:
        if e["scope"] == "layer" and e["name"] not in branches["v3"] and e["name"] in branches["exact"]:
            cited = e["reference"]["transformers"]
            assert cited is None or cited.get("path", "").startswith(FAMILY_FILES), e["name"]


def test_absorbed_entries_cite_deepseek_inference(catalog, branches):
    for e in catalog["tensors"]:
        ref, name = e["reference"], e["name"]
        if e["scope"] == "layer" and name in branches["absorb"] and name not in branches["naive"]:
            assert citation_ok(ref["inference"]), e["name"]
            assert ref["modeling_deepseek.py"] is None and ref["transformers"] is None, e["name"]
        # DeepSeek's FP8 scoring, or the exact scores beside it
        elif e["scope"] == "layer" and name not in branches["exact"]:
            assert citation_ok(ref["inference_v32"]) or citation_ok(ref["transformers"]), e["name"]
        elif e["scope"] == "layer" and name not in branches["v3"]:  # another family's tensor: V3's file has none
            assert citation_ok(ref["transformers"]), e["name"]
        elif (ref["transformers"] or {}).get("path", "").startswith(MLA_FAMILY_FILES):  # MiniCPM3's embed_scaled, ...
            assert citation_ok(ref["transformers"]) and ref["modeling_deepseek.py"] is None, e["name"]
        else:
            assert citation_ok(ref["modeling_deepseek.py"]), f"{e['name']}: no modeling_deepseek.py citation"


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
    names = [n for n, _ in documented]
    assert sorted(names) == sorted(e["name"] for e in catalog["tensors"]) and len(set(names)) == len(names)
    by_name = {e["name"]: e for e in catalog["tensors"]}
    for name, width in documented:
        if width is not None:
            assert len(by_name[name]["dims"]) == width, f"{name}: {by_name[name]['dims']} vs {width} dims in names.md"


def citation_problems(name: str, citation: dict, lines: list[str]) -> list[str]:
    """What is wrong with a citation against the lines of the file it cites."""
    first, last = citation["lines"]
    if last > len(lines):
        return [f"{name}: lines {first}-{last} past the end of the file ({len(lines)} lines)"]
    problems = []
    if lines[first - 1].rstrip() != citation["text"]:
        problems.append(f"{name}: line {first} reads {lines[first - 1].strip()!r}, the catalogue "
                        f"{citation['text'].strip()!r}")
    if citation["symbol"] not in lines[first - 1]:
        problems.append(f"{name}: {citation['symbol']!r} not on line {first}")
    after = [line.rstrip() for line in lines[first:last]]
    if "code" in citation and citation["code"] != after:
        problems.append(f"{name}: lines {first + 1}-{last} are not what the catalogue records")
    return problems


def cited(catalog, source: str):
    for e in catalog["tensors"]:
        citation = e["reference"].get(source)
        if isinstance(citation, dict):
            yield e["name"], citation


def installed_transformers(expected_version: str) -> Path:
    """The installed transformers package's folder (found without importing it)."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        pytest.skip("transformers is not installed")
    version = importlib.metadata.version("transformers")
    if version != expected_version:
        pytest.skip(f"line numbers were taken from transformers {expected_version}; transformers {version} is "
                    "installed")
    return Path(spec.origin).parent


def test_transformers_citations_match_the_installed_files(catalog):
    about = catalog["references"]["transformers"]
    package = installed_transformers(about["version"])
    problems = []
    for name, citation in cited(catalog, "transformers"):
        lines = (package / citation.get("path", about["path"])).read_text(encoding="utf-8").splitlines()
        problems += citation_problems(name, citation, lines)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("model_type", sorted(family_cites.cite_files()))
def test_a_familys_citations_name_its_own_files_lines(catalog, model_type):
    """A family's own lines (stepper/catalog/cites), checked as the catalogue's: in its own folder
    of the installed transformers, for tensors the catalogue has, each citation's text its first line."""
    family = family_cites.cite_files()[model_type]
    assert family["path"].startswith(f"models/{model_type}/modeling_") and family["tensors"], model_type
    names = {e["name"] for e in catalog["tensors"]}
    keys = {re.sub(r"^(sub\d\.|kda:)", "", name) for name in family["tensors"]}  # LongCat sublayer's, KDA layer's line
    assert keys <= names, sorted(keys - names)
    assert all(citation_ok(citation) for citation in family["tensors"].values())
    package = installed_transformers(catalog["references"]["transformers"]["version"])
    lines = (package / family["path"]).read_text(encoding="utf-8").splitlines()
    problems = [p for name, citation in family["tensors"].items() for p in citation_problems(name, citation, lines)]
    assert not problems, "\n".join(problems)


def git_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@pytest.mark.parametrize("source", ["modeling_deepseek.py", "inference", "inference_v32"])
def test_citations_match_a_local_copy_of_the_cited_revision(catalog, source):
    """The copy is FOLDER/PATH, or FOLDER/REPO-NAME/PATH where two sources share a path: the cited
    revision (at FOLDER/REPO-NAME/PATH when the catalogue records no blob id for it, else by its blob
    id), else the file the lines were read from (`read_from`'s blob)."""
    about = catalog["references"][source]
    folder = os.environ.get("STEPPER_REFERENCE_SOURCES")
    named = Path(folder or ".") / about["repo"].split("/")[1] / about["path"]
    places = [Path(folder or ".") / about["path"], named]
    blobs = {about["blob"], about.get("read_from", {}).get("blob")} - {None}
    path = named if about["blob"] is None and named.is_file() else None  # the cited revision, as the layout says
    path = path or next((p for p in places if p.is_file() and git_blob(p.read_bytes()) in blobs), None)
    if not folder or path is None:
        pytest.skip(f"no copy of {about['repo']}@{about['commit'][:12]}'s {about['path']} "
                    "(set STEPPER_REFERENCE_SOURCES to a folder holding it)")
    data = path.read_bytes()
    lines = data.decode("utf-8").splitlines()
    problems = [p for name, citation in cited(catalog, source) for p in citation_problems(name, citation, lines)]
    assert not problems, "\n".join(problems)


def test_a_citation_off_by_a_line_is_caught():
    lines = ["def f(x):", "    y = x + 1", "    return y"]
    right = {"lines": [2, 3], "symbol": "y", "text": "    y = x + 1"}
    assert citation_problems("t", right, lines) == []
    assert citation_problems("t", {**right, "lines": [1, 2]}, lines)  # the text is line 2's
    assert citation_problems("t", {**right, "lines": [2, 4]}, lines)  # past the end
    assert citation_problems("t", {**right, "code": ["    return y"]}, lines) == []
    assert citation_problems("t", {**right, "code": ["    return x"]}, lines)  # a recorded later line differs
    assert not citation_ok({**right, "code": []})  # the range has two lines: one more than text
    assert not citation_ok({**right, "symbol": "z"})  # the symbol is not on the recorded line
