"""A model's weights with some tensors replaced: a run on them is the reference a patch of those
tensors (or an experiment helper) must match."""

from __future__ import annotations

import numpy as np


class Changed:
    """`base` (synthetic weights) with the tensors of `changes` replaced (float32 arrays)."""

    def __init__(self, base, changes: dict[str, np.ndarray]):
        self.base, self.changes, self.config = base, changes, base.config

    def __getattr__(self, name):
        return getattr(self.base, name)

    def get(self, name):
        return self.changes[name] if name in self.changes else self.base.get(name)

    def matrix(self, name):
        return self.changes[name] if name in self.changes else self.base.matrix(name)
