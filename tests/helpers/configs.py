"""Configs for tests: a preset with some fields changed."""

import copy

from stepper.config import Config
from stepper.presets import PRESETS, V4_PRESETS

TINY = sorted(name for name in [*PRESETS, *V4_PRESETS] if name.startswith("tiny"))  # every family's tiny preset


def config_with(base: str = "tiny", **fields) -> Config:
    """A preset's config.json dict with some fields replaced (None removes a field), parsed."""
    raw = copy.deepcopy(PRESETS[base])
    for key, value in fields.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    return Config.from_hf(raw, f"test config ({base})")


def family_preset(name: str):
    """A preset of any registered family, read by its family's reader (as the session reads it)."""
    from stepper import families
    return families.read_config(copy.deepcopy(PRESETS[name]), f"preset {name}")
