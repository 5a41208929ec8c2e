"""Every relative link of README.md and docs/*.md leads somewhere: to a file or folder of the
repository and, with `#anchor`, to a heading of that page (GitHub's anchors: the heading in lower
case, punctuation out, spaces as hyphens, a repeat numbered)."""

import re
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers.docs import DOCUMENTS, ROOT

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def anchors(page: Path) -> set[str]:
    seen: Counter = Counter()
    found = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", FENCE.sub("", page.read_text(encoding="utf-8")), re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        found.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return found


def links(page: Path) -> list[str]:
    return [target for target in LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8")))
            if not re.match(r"[a-z]+:", target)]  # https:, mailto: and the like are not the repository's


def test_the_anchors_are_githubs():
    assert {"a-five-minute-tour", "python", "commands"} <= anchors(ROOT / "README.md")
    assert {"checkpoints-and-fp8", "deepseek-v2-and-deepseek-v32"} <= anchors(ROOT / "docs" / "usage.md")


@pytest.mark.parametrize("page", DOCUMENTS, ids=[str(p.relative_to(ROOT)) for p in DOCUMENTS])
def test_every_relative_link_leads_to_a_file_and_heading(page):
    for target in links(page):
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        assert destination.exists(), f"{page.relative_to(ROOT)}: {target}: no such file"
        if anchor:
            assert anchor in anchors(destination), f"{page.relative_to(ROOT)}: {target}: no such heading"


def test_the_readme_links_to_every_page_of_docs():
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in links(ROOT / "README.md")}
    assert set(DOCUMENTS[1:]) <= linked
