"""The families' own words for the catalogue's tensors. The catalogue's texts describe DeepSeek's
layer; where a model computes a tensor otherwise, as a flag of its config says (rope_interleave
false, no router bias, tied embeddings: config.MlaVariants), a note file says how: one JSON file per
flag or pair of flags (stepper/catalog/notes/*.json, shipped in the package), so a family with a new
flag adds a file and edits none.

A file's `when` holds the config values it is true for (null: the field unset or absent; "(set)":
any value); its `tensors`, by catalogue name (or by the name a sublayer gives it: LongCat's
`sub0.output`), a `note` that `stepper explain` adds under the formula (a template filled with the
config, as the catalogue's explanations are: catalog.texts), a `description` shown in place of
DeepSeek's by `tree`, the debugger and `explain`, and a `formula` and an `explain` (a template) that
`explain` shows in place of DeepSeek's where those are wrong for the model (a tensor whose formula or
explanation a file replaces gets no note from it: the note would say the new formula again). Where several files
replace one text of a tensor, the one whose `when` holds the most values is shown
(tests/unit/test_family_notes.py checks every preset has one such). The texts speak of "this
model", never of the family first written for, so a later family with the same flag reads right.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

SET = "(set)"
FOLDER = "notes"


@dataclass(frozen=True)
class Notes:
    """One note file: the config values it holds for, and its texts by tensor name."""

    file: str
    when: dict[str, Any]
    tensors: dict[str, dict[str, str]]

    def holds(self, cfg: Any) -> bool:
        return all(agrees(getattr(cfg, field, None), wanted) for field, wanted in self.when.items())


def agrees(value: Any, wanted: Any) -> bool:
    """A config value against a `when` value: "(set)" any but None; else equal, of one type (0 is not false)."""
    if wanted == SET:
        return value is not None
    return value is None if wanted is None else type(value) is type(wanted) and value == wanted


@cache
def note_files() -> tuple[Notes, ...]:
    folder = resources.files("stepper.catalog").joinpath(FOLDER)
    found = sorted((f for f in folder.iterdir() if f.name.endswith(".json")), key=lambda f: f.name)
    return tuple(Notes(f.name, raw["when"], raw["tensors"]) for f in found
                 for raw in [json.loads(f.read_text(encoding="utf-8"))])


def texts_for(cfg: Any, name: str, key: str) -> list[tuple[Notes, dict[str, str]]]:
    """The texts the note files true for cfg give a tensor, by its name as the layer emits it
    (`sub0.output`) or else its catalogue name `key`."""
    return [(notes, texts) for notes in note_files() if notes.holds(cfg)
            for texts in [notes.tensors.get(name) or notes.tensors.get(key)] if texts]


REPLACING = ("description", "formula", "explain")


def replaced(cfg: Any, name: str, key: str, which: str, deepseek: str) -> str:
    """The tensor's `which` text (one of REPLACING) for cfg's model: the one of the true note file
    of most values, or the catalogue's (`deepseek`) when none gives one. No config (None): the
    catalogue's."""
    given = [(len(notes.when), texts[which]) for notes, texts in texts_for(cfg, name, key)
             if which in texts] if cfg is not None else []
    return max(given)[1] if given else deepseek


def description(cfg: Any, name: str, key: str, deepseek: str) -> str:
    """The tensor's description for cfg's model (`replaced`)."""
    return replaced(cfg, name, key, "description", deepseek)


def notes(cfg: Any, name: str, key: str) -> list[str]:
    """The notes the true note files add to the tensor for cfg's model, in file order (templates)."""
    return [texts["note"] for _, texts in texts_for(cfg, name, key) if "note" in texts] if cfg is not None else []
