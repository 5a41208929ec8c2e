"""The catalogue's part files (stepper/catalog/parts/*.json: the MLA families' own tensors) follow
catalog.json's schema, place each entry after a name that comes before it, emit it only under a
`when` naming a config field, and cite transformers' own file of the family, checked against the
installed package."""

from __future__ import annotations

import json
from importlib import resources

import pytest
from test_catalog_refs import (
    ALIAS_KEYS,
    BLOCKS,
    DTYPES,
    LAYERS,
    PATHS,
    REFERENCE_KEYS,
    citation_ok,
    citation_problems,
    installed_transformers,
    load_catalog,
)

from stepper import catalog
from stepper.config import Config

PARTS = sorted(p for p in resources.files("stepper.catalog").joinpath("parts").iterdir() if p.name.endswith(".json"))
CONFIG_FIELDS = {n for n in dir(Config) if not n.startswith("_")}  # fields and properties (index_reused: per layer)


@pytest.mark.parametrize("part", PARTS, ids=lambda p: p.name)
def test_a_part_follows_the_schema_and_cites_its_family(part):
    raw = json.loads(part.read_text(encoding="utf-8"))
    assert raw["part"] == part.name.removesuffix(".json") and raw["tensors"]
    main = load_catalog()
    known = {e["name"] for e in catalog.load().entries}
    package = installed_transformers(main["references"]["transformers"]["version"])
    for e in raw["tensors"]:
        name = e["name"]
        assert e["scope"] in {"layer", "global"} and e["block"] in BLOCKS and e["layers"] in LAYERS, name
        assert e["path"] in PATHS and e["dtype"] in DTYPES and set(e["dims"]) <= set(main["dims"]), name
        assert 0 < len(e["description"]) <= 100 and e["formula"] and e["explain"], name
        assert set(e["reference"]) == REFERENCE_KEYS and set(e["aliases"]) == ALIAS_KEYS, name
        assert e["after"] in known and e["when"] and set(e["when"]) <= CONFIG_FIELDS, name
        citation = e["reference"]["transformers"]
        assert citation_ok(citation) and citation["path"].startswith("models/"), name
        lines = (package / citation["path"]).read_text(encoding="utf-8").splitlines()
        assert not citation_problems(name, citation, lines)


def test_part_names_are_new():
    names = [e["name"] for e in catalog.load().entries]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
