"""The CPU's caches, read from the machine: the sizes the kernels' tiles and blocks (and the exact
statistics' passes) are cut to.

A tile decoded in several NumPy passes runs each pass in the cache only if it fits there: on a
CPU whose L2 holds 2 MiB, an FP8 tile of one scale block [128, 7168] in float32 (3.5 MiB) sends
every pass out to L3 and back. The L2 size comes from sysfs (Linux), else from sysconf, else
FALLBACK_L2 is assumed.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

CPU_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")
FALLBACK_L2 = 1 << 20  # a cautious L2 where the machine does not say (many CPUs have 1-2 MiB)
IN_CACHE_SHARE = 2  # a block takes at most 1/IN_CACHE_SHARE of the L2: its inputs, codes and results take room too


@cache
def l2_bytes() -> int:
    """This core's L2 (data or unified) in bytes, as the machine reports it."""
    return l2_from_sysfs(CPU_CACHES) or l2_from_sysconf() or FALLBACK_L2


def l2_from_sysfs(caches: Path) -> int | None:
    """The level-2 data or unified cache's size from a sysfs cache folder (index*/level, type, size)."""
    try:
        for index in sorted(caches.glob("index*")):
            level, kind = (index / "level").read_text().strip(), (index / "type").read_text().strip()
            if level == "2" and kind in ("Data", "Unified"):
                return parse_size((index / "size").read_text().strip())
    except OSError:
        return None
    return None


def parse_size(text: str) -> int | None:
    """'2048K' -> 2097152; '2M', '512' (bytes) likewise; None if unreadable."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    number, unit = (text[:-1], units[text[-1].upper()]) if text[-1:].upper() in units else (text, 1)
    return int(number) * unit if number.isdigit() and int(number) > 0 else None


def l2_from_sysconf() -> int | None:
    try:
        size = os.sysconf("SC_LEVEL2_CACHE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return size if size > 0 else None


def rows_in_cache(row_bytes: int, multiple: int = 8) -> int:
    """Rows of row_bytes each that fit in 1/IN_CACHE_SHARE of the L2, a multiple of `multiple`
    (at least that multiple)."""
    fit = l2_bytes() // IN_CACHE_SHARE // max(1, row_bytes)
    return max(multiple, fit // multiple * multiple)
