"""What a lesson's texts and facts read: the run's plan, the tensors emitted so far, the result.

Templates (`stepper.lessons.templates`) and facts (`stepper.lessons.facts`) both read a
`Context`. It lives apart from both so that the one dependency between them points one way:
templates quote facts, facts know nothing of templates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stepper.config import Config
from stepper.errors import StepperError
from stepper.session import Plan, RunResult, RunSpec


@dataclass
class Context:
    """What a template can read: the run's plan, the tensors emitted so far, and the result."""

    plan: Plan
    tensors: Mapping[str, np.ndarray] = field(default_factory=dict)
    result: RunResult | None = None
    answer: Any = None  # the learner's parsed answer, while explaining it

    @property
    def cfg(self) -> Config:
        return self.plan.config

    @property
    def spec(self) -> RunSpec:
        return self.plan.spec

    def tensor(self, name: str) -> np.ndarray:
        if name not in self.tensors:
            raise StepperError(f"tensor '{name}' has not been emitted yet at this point of the run")
        return self.tensors[name]
