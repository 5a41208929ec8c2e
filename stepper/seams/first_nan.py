"""The first tensor of a run that holds a NaN: where a port's or a checkpoint's trouble begins.

A NaN is never what a sound run makes (a masked score is -inf, its weight 0), so the first tensor
holding one names the step to look at. It watches the tensors a run shows or keeps (watching
others would make them), and does not read those made a tile at a time (a long prompt's attention).
"""

from __future__ import annotations

import numpy as np

from stepper.seams.trace import Event
from stepper.tensors.tensor import held


class FirstNaN:
    """Sink keeping the first event whose tensor holds a NaN, and how many it holds."""

    def __init__(self) -> None:
        self.name: str | None = None
        self.count = self.size = 0

    def __call__(self, event: Event) -> None:
        array = event.array
        if self.name is not None or not held(array) or not np.issubdtype(array.dtype, np.floating):
            return
        if np.isfinite(array.sum()):  # a NaN makes the sum NaN: one reduction, with no mask made, clears most
            return
        count = int(np.count_nonzero(np.isnan(array)))
        if count:
            self.name, self.count, self.size = event.name, count, int(array.size)

    def warning(self) -> str | None:
        """One line naming the first NaN, or None when the run made none."""
        if self.name is None:
            return None
        return (f"the first tensor shown with a NaN is {self.name} ({self.count:,} of {self.size:,} values): `stepper "
                f"step` with this run's options and --until {self.name} shows what it was made from")
