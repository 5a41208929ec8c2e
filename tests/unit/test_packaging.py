"""`pip install .` ships every subpackage: pyproject lists packages by hand (the lessons ship as
stepper.lessons_data from another folder), so a new room under stepper/ must be listed there, or
the wheel would lack it while an editable install still works."""

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_under_stepper_is_in_the_wheel():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "stepper").rglob("__init__.py")}
    assert found - listed == set()
    assert listed - found == {"stepper.lessons_data"}  # the lessons/ folder, mapped by package-dir


def test_the_catalogue_part_files_ship():
    from fnmatch import fnmatch

    from stepper.families import FAMILIES

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    patterns = setuptools["package-data"]
    folder = ROOT / "stepper" / "catalog"
    files = sorted(p.relative_to(folder).as_posix() for p in folder.glob("*/*.json"))  # parts/, v4/, notes/, cites/
    assert files and all(any(fnmatch(p, pattern) for pattern in patterns["stepper.catalog"]) for p in files)
    parts = [p for p in files if not p.startswith(("notes/", "cites/"))]  # the families' words and lines
    listed = {part.name for family in FAMILIES for part in family.parts}
    assert listed == {Path(p).name for p in parts}  # every shipped part is some family's, and each one exists
