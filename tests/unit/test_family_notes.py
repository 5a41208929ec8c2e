"""The families' own words (stepper/catalog/notes): every note file names tensors the catalogue
has and config fields a config has, speaks of "this model" rather than of a family, and no model
is given two descriptions of one tensor that neither outranks."""

from __future__ import annotations

import dataclasses
import re

import pytest

from stepper import catalog
from stepper.catalog import family_notes, texts
from stepper.config import Config, MlaVariants
from stepper.presets import PRESETS, V4_PRESETS
from stepper.session import preset_config

FAMILIES = re.compile(r"DeepSeek|Kimi|GLM|MiniCPM|A\.X|Mistral|LongCat|Youtu|Sarvam")
FIELDS = ({f.name for f in dataclasses.fields(Config)} | set(dir(MlaVariants))
          | {f.name for name in PRESETS for f in dataclasses.fields(preset_config(name))})  # Kimi Linear's kda_layers


@pytest.mark.parametrize("notes", family_notes.note_files(), ids=lambda n: n.file)
def test_a_note_file_names_catalogue_tensors_and_config_fields_in_no_familys_name(notes):
    names = set(catalog.load().names())
    assert set(notes.when) <= FIELDS, notes.when
    for name, words in notes.tensors.items():
        assert catalog.key_of(name) in names, name
        assert set(words) <= {*family_notes.REPLACING, "note"} and words, words
        assert len(words.get("description", "")) <= 100
        assert not FAMILIES.search(" ".join(words.values())), words  # true of a later family with the flag too
        assert not texts.fields(words.get("description", ""))  # descriptions are shown without a config
        assert not texts.fields(words.get("formula", ""))  # formulas too, as the catalogue's


@pytest.mark.parametrize("notes", family_notes.note_files(), ids=lambda n: n.file)
def test_a_tensor_given_its_own_formula_or_explanation_gets_no_note_repeating_it(notes):
    """Notes under a replaced formula said the formula again in prose (`logits = norm_scaled @ ...`
    three times for MiniCPM3): what a note file has to say of a tensor it says in its own texts."""
    for name, words in notes.tensors.items():
        assert not ("note" in words and {"formula", "explain"} & set(words)), (notes.file, name)


@pytest.mark.parametrize("model", [*PRESETS, *V4_PRESETS])
@pytest.mark.parametrize("which", family_notes.REPLACING)
def test_each_model_has_one_description_formula_and_explanation_of_each_tensor(model, which):
    cfg = preset_config(model)
    for name in {name for notes in family_notes.note_files() for name in notes.tensors}:
        given = [(len(notes.when), words[which]) for notes, words in
                 family_notes.texts_for(cfg, name, catalog.key_of(name)) if which in words]
        best = [text for count, text in given if count == max(given)[0]] if given else []
        assert len(set(best)) <= 1, (model, name, best)
        for notes, words in family_notes.texts_for(cfg, name, catalog.key_of(name)):
            for template in (words.get("note", ""), words.get("explain", "")):
                assert texts.UNSET not in texts.render(template, cfg), (model, name, template)  # the config's fields


def test_a_when_reads_unset_set_and_typed_values():
    assert family_notes.agrees(None, None) and not family_notes.agrees(0, None)
    assert family_notes.agrees(3, "(set)") and not family_notes.agrees(None, "(set)")
    assert family_notes.agrees(False, False) and not family_notes.agrees(0, False)  # a flag, not a count
    assert catalog.load().description("layers.1.self_attn.q_pe", preset_config("tiny-minicpm3")).endswith(
        "dim i turns with dim i + rope/2")
    assert catalog.load().description("layers.1.self_attn.q_pe", None) == catalog.load().entry(
        "self_attn.q_pe")["description"]
