"""ml_dtypes' number formats (bfloat16, the float8s) as NumPy dtypes, made where first used:
importing ml_dtypes takes most of a second, which `stepper --help` and every command that never
meets such a number need not pay."""

from __future__ import annotations

from functools import cache

import numpy as np


@cache
def ml(name: str) -> np.dtype:
    """np.dtype(ml_dtypes.NAME): ml("bfloat16"), ml("float8_e4m3fn"), ml("float8_e8m0fnu")."""
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name))
