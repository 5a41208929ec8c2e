"""Sizes in bytes as a reader reads them, in the largest binary unit they reach."""


def gib(n: float) -> str:
    """A size in the largest binary unit it reaches: "20.5 GiB", "21 MiB", "300 KiB", "12 B"."""
    for unit, scale, digits in (("GiB", 2**30, 1), ("MiB", 2**20, 0), ("KiB", 2**10, 0)):
        if n >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{n:.0f} B"
