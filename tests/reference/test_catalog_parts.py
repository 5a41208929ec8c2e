"""The catalogue's part files (stepper/catalog/parts/*.json: the MLA families' own tensors) are
data like catalog.json: each name new, its dimensions defined, its `after` an entry it follows,
and each transformers citation the installed file's own line."""

import importlib.util
import json
from importlib import resources
from pathlib import Path

import pytest

from stepper import catalog

PARTS = sorted(p for p in resources.files("stepper.catalog").joinpath("parts").iterdir() if p.name.endswith(".json"))
ENTRIES = [(part.name, e) for part in PARTS for e in json.loads(part.read_text(encoding="utf-8"))["tensors"]]


def test_there_are_part_files_and_their_names_are_new():
    base = json.loads(resources.files("stepper.catalog").joinpath("catalog.json").read_text(encoding="utf-8"))
    names = [e["name"] for e in base["tensors"]] + [e["name"] for _, e in ENTRIES]
    assert ENTRIES and len(names) == len(set(names))
    assert {e["name"] for _, e in ENTRIES} <= set(catalog.load().names())


@pytest.mark.parametrize("part, entry", ENTRIES, ids=[e["name"] for _, e in ENTRIES])
def test_a_part_entry_is_complete_and_follows_a_known_entry(part, entry):
    cat = catalog.load()
    assert set(entry["dims"]) <= set(cat.raw["dims"])
    assert cat.entry(entry["after"]) is not None
    assert entry["description"] and entry["formula"] and entry["explain"]


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed")
@pytest.mark.parametrize("part, entry", ENTRIES, ids=[e["name"] for _, e in ENTRIES])
def test_a_part_cites_transformers_own_line(part, entry):
    cited = entry["reference"]["transformers"]
    root = Path(importlib.util.find_spec("transformers").origin).parent
    lines = (root / cited["path"]).read_text(encoding="utf-8").splitlines()
    first, last = cited["lines"]
    assert lines[first - 1] == cited["text"] and cited["symbol"] in cited["text"] and first <= last <= len(lines)
