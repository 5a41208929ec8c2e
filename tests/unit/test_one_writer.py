"""Every file stepper writes or removes goes through stepper/files.py: no other module opens a
file for writing, creates, renames or removes one (read from the source with `ast`)."""

from __future__ import annotations

import ast
from pathlib import Path

import stepper

PACKAGE = Path(stepper.__file__).resolve().parent
WRITER = PACKAGE / "files.py"

# Calls that write or remove a named file, whatever object they are called on.
WRITING_METHODS = {"write_text", "write_bytes", "unlink", "rmdir", "mkdir", "touch", "rename", "symlink_to",
                   "hardlink_to", "chmod", "savez", "savez_compressed", "save", "copy", "copyfile", "copy2",
                   "copytree", "rmtree", "move", "remove", "removedirs", "makedirs", "link", "symlink",
                   "truncate", "mkstemp", "mkdtemp", "NamedTemporaryFile", "TemporaryDirectory", "memfd_create"}
WRITING_MODES = set("wax+")


def offences(source: str) -> list[str]:
    """What in this source writes or removes a file other than through stepper.files."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
        if name in WRITING_METHODS and not (name == "save" and owner not in ("np", "numpy")) \
                and not (name in ("copy", "remove") and owner not in ("shutil", "os")) \
                and not (name == "truncate" and (node.keywords or len(node.args) > 1)):  # a file's takes one size
            found.append(f"line {node.lineno}: {owner + '.' if owner else ''}{name}()")
        elif (name == "replace" and len(node.args) == 1
              and not node.keywords):  # Path.replace(target); str.replace takes 2
            found.append(f"line {node.lineno}: .replace(target)")
        elif name == "replace" and owner == "os":
            found.append(f"line {node.lineno}: os.replace()")
        elif name == "open" and owner == "os" and not _is_devnull(node):
            found.append(f"line {node.lineno}: os.open()")
        elif name == "open" and _mode(node) & WRITING_MODES:
            found.append(f"line {node.lineno}: open(..., {''.join(sorted(_mode(node)))!r})")
    return found


def _is_devnull(node: ast.Call) -> bool:
    return bool(node.args) and isinstance(node.args[0], ast.Attribute) and node.args[0].attr == "devnull"


def _mode(node: ast.Call) -> set[str]:
    """The characters of an open() call's mode (positional after the path, or mode=), when written out."""
    mode = next((k.value for k in node.keywords if k.arg == "mode"), None)
    if mode is None:
        io_open = (isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
                   and node.func.value.id == "io")
        at = 1 if isinstance(node.func, ast.Name) or io_open else 0
        mode = node.args[at] if len(node.args) > at else None
    return set(mode.value) if isinstance(mode, ast.Constant) and isinstance(mode.value, str) else set()


def test_no_module_but_the_writer_writes_or_removes_files():
    found = {str(path.relative_to(PACKAGE.parent)): hits for path in sorted(PACKAGE.rglob("*.py"))
             if path != WRITER and (hits := offences(path.read_text(encoding="utf-8")))}
    assert found == {}


def test_the_check_finds_each_way_of_writing_and_lets_reading_be():
    writes = ["open(p, 'w')", "open(p, mode='ab')", "p.open('x')", "p.write_text('a')", "p.write_bytes(b'')",
              "p.unlink()", "shutil.rmtree(p)", "os.replace(a, b)", "tmp.replace(p)", "shutil.move(a, b)",
              "os.rename(a, b)", "p.mkdir()", "os.open(p, os.O_WRONLY)", "np.save(p, a)", "os.remove(p)",
              "shutil.copyfile(a, b)", "tempfile.mkstemp()", "p.touch()", "f.truncate(9)"]
    for line in writes:
        assert len(offences(line)) == 1, line
    reads = ["open(p)", "open(p, 'rb')", "p.open(encoding='utf-8')", "p.read_text()", "s.replace('a', 'b')",
             "os.open(os.devnull, os.O_WRONLY)", "dataclasses.replace(x, a=1)", "model.save_state()",
             "line.truncate(80, overflow='ellipsis')"]
    for line in reads:
        assert offences(line) == [], line
