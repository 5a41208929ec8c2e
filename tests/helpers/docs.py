"""The documentation a user reads: README.md first, then the pages of docs/ in name order. The
tests that run what it quotes (commands, Python snippets) and check what it says read it here, so
a section moved from the README to a page of docs/ stays tested."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def text() -> str:
    """Every document's text, in order, one after the other."""
    return "\n".join(path.read_text(encoding="utf-8") for path in DOCUMENTS)
