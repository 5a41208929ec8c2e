"""ml_dtypes' number formats (bfloat16, the float8s) as NumPy dtypes, made where first used:
importing ml_dtypes can take most of a second (0.7.0, which pyproject.toml leaves out, took 0.55 s;
0.6.0 takes 4 ms), which `stepper --help` and every command that never meets such a number need
not pay."""

from __future__ import annotations

from functools import cache

import numpy as np


@cache
def ml(name: str) -> np.dtype:
    """np.dtype(ml_dtypes.NAME): ml("bfloat16"), ml("float8_e4m3fn"), ml("float8_e8m0fnu")."""
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name))
