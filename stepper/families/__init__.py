"""The families stepper runs, in one explicit registry.

`FAMILIES` is the tuple of the families shipped; `registered(family)` adds one for the length of
a `with` block (a test's made-up family, a notebook's experiment), nothing else changes it, and
importing this package registers nothing by side effect. Reading a config.json dispatches on its
model_type (`read_config`, `load_config`); a run asks `family_for(cfg)` for the decoder layer,
the catalogue for the part files and `derive` for what a layer emits. The room sits above the
model, the weights and the config reader, which know nothing of it, and below the catalogue and
a run (docs/design-notes.md)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stepper import config
from stepper.errors import StepperError
from stepper.families import (
    axk1,
    axk2,
    bailing_hybrid,
    deepseek,
    deepseek_v4_family,
    glm4_moe_lite,
    glm_moe_dsa,
    hy_v4,
    kimi_linear,
    longcat_flash,
    minicpm3,
    mistral4,
    mistral_large4,
    sarvam_mla,
    youtu,
)
from stepper.families.family import Family
from stepper.untrusted import said

FAMILIES: tuple[Family, ...] = (deepseek.FAMILY, sarvam_mla.FAMILY, youtu.FAMILY, glm4_moe_lite.FAMILY, axk1.FAMILY,
                                mistral4.FAMILY, minicpm3.FAMILY, glm_moe_dsa.FAMILY, axk2.FAMILY, longcat_flash.FAMILY,
                                kimi_linear.FAMILY, deepseek_v4_family.FAMILY, hy_v4.FAMILY,
                                bailing_hybrid.FAMILY, mistral_large4.FAMILY)
_added: tuple[Family, ...] = ()  # families registered for a while (`registered`)


def registry() -> tuple[Family, ...]:
    """Every family a config may name: the shipped ones, then those registered for now."""
    return FAMILIES + _added


def model_types() -> tuple[str, ...]:
    return tuple(t for family in registry() for t in family.model_types)


def family_of(model_type: str) -> Family | None:
    return next((f for f in registry() if model_type in f.model_types), None)


def family_for(cfg: Any) -> Family:
    """The family of a config a family's reader made (its model_type is one of the family's)."""
    family = family_of(cfg.model_type)
    if family is None:
        raise StepperError(f"model {cfg.name}: model_type {cfg.model_type!r} is no registered family's "
                           f"(known: {', '.join(model_types())})")
    return family


def read_config(raw: dict[str, Any], source: str) -> Any:
    """The config of a config.json dict, read by the family its model_type names."""
    model_type = raw.get("model_type")
    family = family_of(model_type) if isinstance(model_type, str) else None
    if family is None:
        known = ", ".join(model_types())
        raise StepperError(f"{source}: field 'model_type' is missing; it must be one of {known}" if model_type is None
                           else f"{source}: field 'model_type' must be one of {known}, got {said(model_type)}")
    return family.read_config(raw, source)


def load_config(path: str | Path) -> Any:
    """A config.json file's config, read by the family its model_type names."""
    return config.load_config(path, read_config)


@contextmanager
def registered(*families: Family) -> Iterator[None]:
    """The registry with `families` added, for the length of the block."""
    global _added
    taken = {t for f in registry() for t in f.model_types}
    clash = [t for f in families for t in f.model_types if t in taken]
    if clash:
        raise ValueError(f"model_type {', '.join(clash)} is already a registered family's")
    before = _added
    _added = before + tuple(families)
    try:
        yield
    finally:
        _added = before
